"""Training data: readers of labelled structures, the packed graph cache, and batching.

Units everywhere: energy is the TOTAL energy in eV, forces eV/Å, stress GPa with the ASE sign
(positive = tensile), magmoms μB; missing labels are NaN (None on a :class:`Sample`).
"""

from .batching import BudgetBatchSampler
from .build import BuildReport, CachedDataset, build_or_load, default_cache_dir
from .cache import MultiPacked, PackedDataset
from .dataset import GraphDataset
from .labels import Targets
from .readers import Sample, read_ase, read_ase_db, read_mptrj, read_samples

__all__ = [
    "Sample",
    "read_samples",
    "read_ase",
    "read_ase_db",
    "read_mptrj",
    "PackedDataset",
    "MultiPacked",
    "build_or_load",
    "CachedDataset",
    "BuildReport",
    "default_cache_dir",
    "Targets",
    "GraphDataset",
    "BudgetBatchSampler",
]
