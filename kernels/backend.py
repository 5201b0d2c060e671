"""Which implementation a kernel uses, and the ``matris`` operator library.

The fused formulas are operators (``torch.ops.matris.*``) with a CUDA kernel in Triton and a CPU kernel in C++
(:mod:`.native`); a call runs the kernel of its tensors' device. ``"triton"``: the model on CUDA (the operators and the
Triton bases, with the graph's CSR segments); ``"fused"``: the same operators on a CPU (C++ kernels); ``"torch"``: the
composed PyTorch reference; ``"auto"`` (default): ``"triton"`` on CUDA, else ``"fused"`` (:func:`choose`, once per
model call; the choice travels as a :class:`Kernels` to every operator, as its ``fused`` argument). Override per model
with ``model.options.kernels`` (:class:`matris.RunOptions`, or per call), or per process with ``MATRIS_KERNELS``.
Under ``TRITON_INTERPRET=1`` the Triton kernels also serve CPU tensors (slow; the CPU checks of the GPU code).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..settings import BACKENDS, interpret_with_device_tiles, interpreting, kernels_override
from . import native


@torch.compiler.assume_constant_result
def triton_available() -> bool:
    """Whether triton imports (a constant for torch.compile: Dynamo takes the answer, not tracing the import)."""
    return _triton_imports()


@functools.lru_cache(maxsize=1)
def _triton_imports() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def tile(gpu: int, interpreted: int) -> int:
    """A kernel's tile size: ``gpu`` on a device, ``interpreted`` under TRITON_INTERPRET=1, where each program runs
    serially in Python at a fixed cost, so fewer, larger tiles make tests and CPU dry runs several times faster.
    ``MATRIS_INTERPRET_TILES=gpu`` keeps the device's tiles (``benchmarks/kernels.py``: many programs, partial sums)."""
    if interpreting() and not interpret_with_device_tiles():
        return interpreted
    return gpu


def choose(device: torch.device, backend: str | None = None, create_graph: bool = False) -> str:
    """The kernels a model call on ``device`` runs, chosen only here: ``"triton"`` (CUDA, or any device under
    ``TRITON_INTERPRET=1`` when asked for), ``"fused"`` (a CPU: C++ kernels) or ``"torch"`` (PyTorch references).
    ``backend``: one of :data:`BACKENDS` (None: ``$MATRIS_KERNELS``, else ``"auto"``); off Triton, a call that keeps the
    graph of its forces (training) runs the references, whose double backward they give directly. Each operator still
    falls back to its reference where it has no kernel for its tensors (no compiler, another activation, float16)."""
    choice = backend or kernels_override() or "auto"
    if choice not in BACKENDS:
        raise ValueError(f"unknown kernel backend {choice!r}; use one of {BACKENDS} (RunOptions.kernels or "
                         "MATRIS_KERNELS)")
    runnable = triton_available() and (device.type == "cuda" or interpreting())
    if choice == "triton" and not runnable:
        raise RuntimeError("the Triton kernels need triton and a CUDA device (or TRITON_INTERPRET=1 for CPU "
                           "tensors); use RunOptions(kernels='torch') or MATRIS_KERNELS=torch")
    if choice == "triton" or (choice == "auto" and runnable and device.type == "cuda"):
        return "triton"
    return "torch" if choice == "torch" or create_graph else "fused"


def recompute_backward(fn, inputs, grad):
    """Backward of ``fn`` through its PyTorch reference, keeping the graph (exact second order): every fused kernel's
    create_graph path. ``inputs``: the saved tensors; an input that does not require a gradient gets None."""
    needs = [x.requires_grad for x in inputs]
    with torch.enable_grad():
        xs = [x if x.requires_grad else x.detach().requires_grad_(True) for x in inputs]
        out = fn(*xs)
        grads = torch.autograd.grad(out, xs, grad, create_graph=True, allow_unused=True)
    return tuple(g if need else None for g, need in zip(grads, needs))


@functools.lru_cache(maxsize=64)
def device_constants(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values)`` on ``device``, made once: hot-path launches read it instead of copying every call."""
    return torch.tensor(values, dtype=dtype, device=device)


KERNEL_DTYPES = (torch.float32, torch.float64)

# The operators (``matris::gated_phi``, ``attention_pair``, ``refine_edges``, their ``*_backward``) are defined from
# Python so that they exist whatever is built: their Triton CUDA kernels (registered by each family's module) do not
# depend on the C++ library, whose CPU kernels register with ``TORCH_LIBRARY_IMPL`` when it loads (:mod:`.native`).
LIB = torch.library.Library("matris", "FRAGMENT")


def register_triton(name: str, kernel) -> None:
    """Register ``kernel`` (a Python function launching Triton kernels) as ``matris::name``'s CUDA kernel; under
    ``TRITON_INTERPRET=1`` also as its CPU kernel (no C++ library then), so CPU checks run the GPU code path."""
    if not triton_available():
        return
    LIB.impl(name, kernel, "CUDA")
    if interpreting():
        LIB.impl(name, kernel, "CPU")


@dataclass(frozen=True)
class Kernels:
    """The kernels of one model call, chosen once (:func:`choose`) and handed to every operator: ``name`` ``"triton"``,
    ``"fused"`` or ``"torch"``; :attr:`fused`: the operators run their kernels where they have one for the tensors
    (``"torch"``: their references). ``atom_segments``, ``line_segments``: the CSR order (by target, by source) the
    CUDA kernels walk, made once per graph (Triton only)."""

    name: str = "torch"
    atom_segments: tuple | None = None
    line_segments: tuple | None = None

    @property
    def fused(self) -> bool:
        return self.name != "torch"

    @property
    def triton(self) -> bool:
        return self.name == "triton"


def dispatch(device: torch.device, backend: str | None = None, create_graph: bool = False
             ) -> "tuple[Kernels, Kernels]":
    """The kernels of one model call's passes (as :func:`choose` with ``create_graph``), and those of its passes that
    keep no graph of their backward (the fast ones, for training's recomputations that want no weight gradient)."""
    fast = Kernels(choose(device, backend))
    return (REFERENCES if create_graph and not fast.triton else fast), fast


REFERENCES = Kernels("torch")


def operators_run(*tensors: torch.Tensor) -> bool:
    """Whether the operators have kernels for these tensors: CUDA with triton, CPU with the C++ library (or under
    ``TRITON_INTERPRET=1``, triton); all floating tensors float32 or all float64, the others int64 indices."""
    given = [t for t in tensors if t is not None]
    floats = [t for t in given if t.is_floating_point()]
    if not floats:
        return False
    device = floats[0].device
    if any(t.device != device for t in given):
        return False
    if floats[0].dtype not in KERNEL_DTYPES or any(t.dtype != floats[0].dtype for t in floats):
        return False
    if any(t.dtype != torch.int64 for t in given if not t.is_floating_point()):
        return False
    if device.type == "cuda" or (device.type == "cpu" and interpreting()):
        return triton_available()
    return device.type == "cpu" and native.available()
