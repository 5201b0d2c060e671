"""Compute kernels of MatRIS, importable as ``matris.kernels``.

Each operation has a PyTorch reference (used on every device and by the tests as ground
truth); GPU kernels written in Triton live beside their reference and are selected on CUDA.
"""

from .attention import Segments, attention_pair, attention_pair_lse, attention_pair_reference, merge_softmax
from .backend import REFERENCES, Kernels, choose, dispatch
from .gather import gather_sum_activate_reference
from .phi import gated_phi, gated_phi_reference
from .refine import refine_edges, refine_edges_reference
from .segment import scatter_sum, segment_softmax

__all__ = [
    "scatter_sum", "segment_softmax", "Segments", "attention_pair", "attention_pair_lse",
    "attention_pair_reference", "merge_softmax", "gated_phi", "gated_phi_reference", "refine_edges",
    "refine_edges_reference", "gather_sum_activate_reference", "choose", "dispatch", "Kernels", "REFERENCES",
]
