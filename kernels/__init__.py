"""Compute kernels of MatRIS, importable as ``matris.kernels``.

Each operation has a PyTorch reference (used on every device and by the tests as ground
truth); GPU kernels written in Triton live beside their reference and are selected on CUDA.
"""

from .segment import scatter_sum, segment_softmax

__all__ = ["scatter_sum", "segment_softmax"]
