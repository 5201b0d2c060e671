"""Training labels of a batch, aligned with a :class:`~matris.graph.GraphBatch`."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Targets:
    """Labels of ``S`` structures with ``N`` atoms in total; NaN marks a missing label.

    Attributes:
        energy: ``[S]`` TOTAL energy per structure, eV (not per atom).
        forces: ``[N, 3]`` eV/Å; a structure without forces has NaN rows.
        stress: ``[S, 3, 3]`` GPa, ASE sign convention (positive = tensile).
        magmoms: ``[N]`` μB.

    Atoms are in the order of the batch's atoms (``GraphBatch.atom_batch``). In float32 a
    total energy keeps ~7 significant digits (≈1e-4 eV at 1000 eV); subtract reference
    energies in float64 first if that matters.
    """

    energy: torch.Tensor
    forces: torch.Tensor
    stress: torch.Tensor
    magmoms: torch.Tensor

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
           non_blocking: bool = False) -> "Targets":
        """Move to ``device`` and/or cast to the floating ``dtype``."""
        return Targets(**{f.name: getattr(self, f.name).to(device=device, dtype=dtype, non_blocking=non_blocking)
                          for f in fields(self)})

    def pin_memory(self) -> "Targets":
        """Page-locked copies, for ``DataLoader(pin_memory=True)``."""
        return Targets(**{f.name: getattr(self, f.name).pin_memory() for f in fields(self)})
