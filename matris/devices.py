"""Where and in what precision a model runs: one rule for every entry point.

``device``: "auto" (CUDA when present, else the CPU), "cpu", "cuda", "cuda:N" or a
``torch.device``. ``dtype``: "float32", "float64" or the torch dtypes.

The rule, the same in Python (:meth:`MatRIS.load`, :class:`MatRISCalculator`,
:mod:`matris.simulate`), on the command line (``--device``, ``--dtype``) and in LAMMPS
(``pair_style matris MODEL [device D] [dtype T]``): a model named by name, path or URL runs
on device "auto" in float32 unless told otherwise; a :class:`MatRIS` object passed in keeps
its own device and dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import MatRISInputError

_DTYPES = {"float32": torch.float32, "float64": torch.float64,
           torch.float32: torch.float32, torch.float64: torch.float64}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/None picks CUDA when available, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise MatRISInputError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'auto'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise MatRISInputError(
            f"device {device!r} was requested but this PyTorch build sees no CUDA GPU; use device='cpu' or 'auto'"
        )
    return dev


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):
        raise MatRISInputError(f"dtype must be 'float32' or 'float64' (or the torch dtypes), got {dtype!r}") from None


DEFAULT_DEVICE = "auto"
DEFAULT_DTYPE = "float32"


def device_and_dtype(model: Any, device, dtype):
    """The rule above: unset device/dtype are a :class:`MatRIS`'s own (any module's, read from its
    parameters), else "auto" and float32."""
    param = next(model.parameters(), None) if isinstance(model, torch.nn.Module) else None
    if param is not None:
        return device if device is not None else param.device, dtype if dtype is not None else param.dtype
    return device if device is not None else DEFAULT_DEVICE, dtype if dtype is not None else DEFAULT_DTYPE


__all__ = ["resolve_device", "resolve_dtype", "device_and_dtype", "DEFAULT_DEVICE", "DEFAULT_DTYPE"]
