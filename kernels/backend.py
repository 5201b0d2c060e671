"""Which implementation a kernel uses: Triton on CUDA, the fused C++ loops on the CPU.

``"triton"``: the fused GPU kernels. ``"fused"``: the same fused formulas for the CPU, run over
cache-sized chunks of rows in the C++ loops of :mod:`.native` (:mod:`.phi`,
:func:`.aggregate.attention_pair`, :mod:`.refine`). ``"torch"``: the composed PyTorch reference.
``"auto"`` (default) picks Triton on CUDA and the fused CPU kernels elsewhere. Override per call with ``backend=...``, or for the
whole process with the environment variable ``MATRIS_KERNELS``. Triton kernels also run on
CPU tensors under ``TRITON_INTERPRET=1`` (slow; used by the CPU checks).
"""

from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("auto", "triton", "fused", "torch")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def tile(gpu: int, interpreted: int) -> int:
    """A kernel's tile size: ``gpu`` on a device, ``interpreted`` under TRITON_INTERPRET=1, where
    every program runs serially in Python at a fixed cost each, so fewer, larger tiles (the same
    per-row formulas, tails masked alike) make the tests and CPU dry runs several times faster.
    ``MATRIS_INTERPRET_TILES=gpu`` keeps the device's tiles in the interpreter (the kernel checks
    of ``benchmarks/kernels.py``, which must see many programs and partial sums)."""
    if interpreting() and os.environ.get("MATRIS_INTERPRET_TILES", "large") != "gpu":
        return interpreted
    return gpu


def use_triton(device: torch.device, backend: str | None = None) -> bool:
    """Whether a kernel on ``device`` runs in Triton (see the module docstring)."""
    choice = backend or os.environ.get("MATRIS_KERNELS", "auto")
    if choice not in BACKENDS:
        raise ValueError(f"unknown kernel backend {choice!r}; use one of {BACKENDS} (argument or MATRIS_KERNELS)")
    if choice in ("torch", "fused"):
        return False
    runnable = triton_available() and (device.type == "cuda" or interpreting())
    if choice == "triton":
        if not runnable:
            raise RuntimeError(
                "the Triton kernels need triton and a CUDA device (or TRITON_INTERPRET=1 for CPU tensors); "
                "use backend='torch' or MATRIS_KERNELS=torch"
            )
        return True
    return runnable and device.type == "cuda"


def use_fused_cpu(device: torch.device, backend: str | None = None) -> bool:
    """Whether the fused CPU kernels run on ``device`` (see the module docstring)."""
    choice = backend or os.environ.get("MATRIS_KERNELS", "auto")
    return choice == "fused" or (choice == "auto" and not use_triton(device, backend))


def recompute_backward(fn, inputs, grad):
    """Backward of ``fn`` through its PyTorch reference, keeping the graph (exact second order).

    The create_graph path of every fused kernel: ``inputs`` are the saved tensors, and the
    gradient of an input that does not require one is None.
    """
    needs = [x.requires_grad for x in inputs]
    with torch.enable_grad():
        xs = [x if x.requires_grad else x.detach().requires_grad_(True) for x in inputs]
        out = fn(*xs)
        grads = torch.autograd.grad(out, xs, grad, create_graph=True, allow_unused=True)
    return tuple(g if need else None for g, need in zip(grads, needs))


@functools.lru_cache(maxsize=64)
def device_constants(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values)`` on ``device``, made once: kernel launches on the hot path read
    their constants from it instead of copying them to the device on every call."""
    return torch.tensor(values, dtype=dtype, device=device)


KERNEL_DTYPES = (torch.float32, torch.float64)


def check_dtype(*tensors: torch.Tensor) -> None:
    """Refuse, before any launch, dtypes the fused kernels do not implement (half precision)."""
    for t in tensors:
        if t is not None and t.dtype not in KERNEL_DTYPES:
            raise TypeError(f"the fused MatRIS kernels take float32 or float64 tensors, got {t.dtype}; cast to "
                            "float32 (half precision cannot resolve the force and stress derivatives)")
