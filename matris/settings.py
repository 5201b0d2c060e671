"""The environment variables the package reads, in one leaf module (it imports only ``os`` and
``pathlib``). Each is documented here and in the docs' troubleshooting and kernels pages.

========================  ====================================================================
``MATRIS_CACHE``          the cache folder: models, packed graphs, the CPU library (default
                          ``$XDG_CACHE_HOME/matris``, else ``~/.cache/matris``)
``MATRIS_OFFLINE``        ``1``: no downloads (a model must be in the cache already)
``MATRIS_KERNELS``        ``auto`` (default), ``triton``, ``fused`` or ``torch``: the kernels of
                          every model in the process, for debugging (per model:
                          ``model.options.kernels``)
``MATRIS_NATIVE``         ``0``: no fused CPU library (the PyTorch references run); ``1``: a
                          failed build is an error instead of a warning; ``auto`` (default)
``MATRIS_NATIVE_CACHE``   where the CPU library is built (default ``$MATRIS_CACHE/native``)
``MATRIS_CPU_HEAP``       ``1``: glibc keeps freed memory for reuse (fewer page faults in MD)
``TRITON_INTERPRET``      ``1``: Triton's interpreter runs the GPU kernels on CPU tensors (tests)
========================  ====================================================================
"""

from __future__ import annotations

import os
from pathlib import Path

ON = ("1", "true", "yes", "on")


def cache_home(*parts: str) -> Path:
    """``$MATRIS_CACHE``, else ``$XDG_CACHE_HOME/matris``, else ``~/.cache/matris``, joined with
    ``parts`` (not created)."""
    if os.environ.get("MATRIS_CACHE"):
        base = Path(os.environ["MATRIS_CACHE"]).expanduser()
    elif os.environ.get("XDG_CACHE_HOME"):
        base = Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "matris"
    else:
        base = Path.home() / ".cache" / "matris"
    return base.joinpath(*parts)


def offline() -> bool:
    """``MATRIS_OFFLINE`` is on: downloads are disabled."""
    return os.environ.get("MATRIS_OFFLINE", "").strip().lower() in ON


def interpreting() -> bool:
    """``TRITON_INTERPRET=1``: the Triton kernels run in the interpreter, on CPU tensors too."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpret_with_device_tiles() -> bool:
    """``MATRIS_INTERPRET_TILES=gpu``: the interpreter keeps the device's tile sizes (kernel checks
    that must see many programs and partial sums)."""
    return os.environ.get("MATRIS_INTERPRET_TILES", "large") == "gpu"


def kernels_override() -> str | None:
    """``MATRIS_KERNELS``, or None where unset."""
    return os.environ.get("MATRIS_KERNELS") or None


def native_choice() -> str:
    """``MATRIS_NATIVE``: ``"0"``, ``"1"`` or ``"auto"``."""
    return os.environ.get("MATRIS_NATIVE", "auto")


def native_cache() -> str | None:
    """``MATRIS_NATIVE_CACHE``, or None where unset."""
    return os.environ.get("MATRIS_NATIVE_CACHE") or None


def cpu_heap() -> bool:
    """``MATRIS_CPU_HEAP`` is on."""
    return os.environ.get("MATRIS_CPU_HEAP", "0").strip().lower() in ON
