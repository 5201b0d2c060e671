"""How the package runs: the environment variables it reads, and :class:`RunOptions`, the same
kind of choice per model, in one leaf module (it imports only the standard library). Each variable
is documented here and in the docs' troubleshooting and kernels pages.

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
``TRITON_INTERPRET``      ``1``: Triton's interpreter runs the GPU kernels on CPU tensors (tests);
                          ``MATRIS_INTERPRET_TILES=gpu`` keeps the device's tile sizes there
========================  ====================================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import MatRISInputError

ON = ("1", "true", "yes", "on")
# the kernels a model may run (:func:`matris.kernels.choose`) and what a training step may recompute
# (:mod:`matris.memory`): here, so that :class:`RunOptions` checks them where they are set
BACKENDS = ("auto", "triton", "fused", "torch")
RECOMPUTE_MODES = ("none", "blocks", "rows")


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


SIZE_UNITS = {"gib": 2**30, "gb": 2**30, "g": 2**30, "mib": 2**20, "mb": 2**20, "m": 2**20, "kib": 2**10, "kb": 2**10}


def parse_size(value, what: str = "memory_limit", any_bytes: bool = False) -> int | None:
    """A memory size → bytes, or None for ``None``/``'auto'``: a string with its unit (``'20 GB'``,
    ``'20GiB'``, ``'500 MB'``; GB here are 2³⁰ bytes, as devices report them), or an int of bytes
    (as :class:`RunOptions` holds them). A bare number is refused, not guessed: ``20`` could be GB or
    bytes; so is an int under 1 MiB, unless ``any_bytes`` (:class:`RunOptions`, whose ints are bytes by
    definition). ``what`` names the setting in the error."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    example = "such as '8 GB' or '500 MB'"
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= 2**20 or (any_bytes and value > 0):
            return value  # bytes (RunOptions.memory_limit)
        if value <= 0:
            raise MatRISInputError(f"{what} must be 'auto' or a positive size {example}, got {value!r}")
        raise MatRISInputError(f"{what} = {value} has no unit (an int is a number of bytes, and {value} bytes is no "
                               f"budget): give a size with its unit, {example}, e.g. {value!r} GB as '{value} GB'")
    text = str(value).strip().lower().replace(" ", "")
    scale = None
    for unit, size in SIZE_UNITS.items():
        if text.endswith(unit):
            text, scale = text[: -len(unit)], size
            break
    try:
        amount = float(text)
    except ValueError:
        amount = float("nan")
    if not amount > 0 or amount == float("inf"):
        raise MatRISInputError(f"{what} must be 'auto' or a positive size {example}, got {value!r}")
    if scale is None:
        raise MatRISInputError(f"{what} = {value!r} has no unit: give a size with its unit, {example} "
                               f"(e.g. '{value} GB')")
    return int(amount * scale)


def format_size(n: int) -> str:
    """Bytes as GB (2³⁰) or MB, for messages."""
    if n < 2**10:
        return f"{n:,} bytes"
    if n < 2**20:
        return f"{n / 2**10:.3g} KB"
    return f"{n / 2**30:.3g} GB" if n >= 2**30 else f"{n / 2**20:.3g} MB"


@dataclass
class RunOptions:
    """How a model runs, not what it computes: every choice gives the same numbers to float
    rounding, except ``tf32``. Set on the model (``model.options``) or per call
    (``model(graph, options=...)``).

    Every option is checked where it is set (a :class:`matris.errors.MatRISInputError` naming the
    valid forms), sizes are held in bytes.

    kernels: ``"auto"`` (Triton on CUDA; on a CPU the C++ kernels, and for training the PyTorch
    references), ``"triton"``, ``"fused"`` or ``"torch"`` (the references); None: ``$MATRIS_KERNELS``,
    else ``"auto"`` (:func:`matris.kernels.choose`).
    memory_limit: bytes the activations of an inference call may use (None: a share of the device's
    available memory, :func:`matris.memory.default_budget`); memory_level: force the inference
    memory level, 0 (keep everything), 1, 2 or 3 (recompute more, keep less; None: the fastest within
    the limit; :mod:`matris.memory`).
    training_recompute: what a training step on forces recomputes (``"none"``, ``"blocks"``,
    ``"rows"``; None: the least that fits ``training_memory_limit`` bytes, None as ``memory_limit``).
    tf32: TF32 matmuls for float32 on CUDA (faster, less exact).
    chunk_rows: rows of one chunk where the per-angle work runs by chunks (memory levels 2 and 3,
    training recompute ``"rows"``; None: :data:`matris.memory.CHUNK_ROWS`): fewer rows, less
    memory and more passes.
    """

    kernels: str | None = None
    memory_limit: int | None = None
    memory_level: int | None = None
    training_recompute: str | None = None
    training_memory_limit: int | None = None
    tf32: bool = False
    chunk_rows: int | None = None

    def __post_init__(self):
        # every option is checked where it is set, not at the first call that reads it
        if self.kernels is not None and self.kernels not in BACKENDS:
            raise MatRISInputError(f"RunOptions.kernels must be one of {', '.join(BACKENDS)} or None, got "
                                   f"{self.kernels!r}")
        if self.training_recompute is not None and self.training_recompute not in RECOMPUTE_MODES:
            raise MatRISInputError(f"RunOptions.training_recompute must be one of {', '.join(RECOMPUTE_MODES)} or "
                                   f"None, got {self.training_recompute!r}")
        # sizes: bytes, or a string with its unit ('8 GB'), held as bytes
        for name in ("memory_limit", "training_memory_limit"):
            object.__setattr__(self, name, parse_size(getattr(self, name), f"RunOptions.{name}", any_bytes=True))
        if self.memory_level not in (None, 0, 1, 2, 3):
            raise ValueError(f"RunOptions.memory_level must be 0, 1, 2, 3 or None, got {self.memory_level!r}")
        if self.chunk_rows is not None and not (isinstance(self.chunk_rows, int) and self.chunk_rows > 0):
            raise ValueError(f"RunOptions.chunk_rows must be a positive int or None, got {self.chunk_rows!r}")

    def __setattr__(self, name, value):
        # model.options.memory_limit = "8 GB" is checked as the constructor checks it
        before = self.__dict__.get(name, _UNSET)
        super().__setattr__(name, value)
        if name in _CHECKED and hasattr(self, "chunk_rows"):  # after __init__ has set every field
            try:
                self.__post_init__()
            except Exception:
                object.__setattr__(self, name, before) if before is not _UNSET else None
                raise


_UNSET = object()
_CHECKED = frozenset({"kernels", "training_recompute", "memory_limit", "training_memory_limit", "memory_level",
                      "chunk_rows"})


# the attributes RunOptions replaced (0.7.0): setting one on a model says where it went
MOVED_TO_OPTIONS = {"kernel_backend": "kernels", "activation_memory_limit": "memory_limit",
                    "checkpointing": "memory_level", "training_recompute": "training_recompute",
                    "training_memory_limit": "training_memory_limit", "tf32": "tf32"}
