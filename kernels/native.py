"""The fused CPU loops (``native.cpp``): built once with the system's C++ compiler, called with ctypes.

The fused CPU kernels (:mod:`.phi`, :mod:`.aggregate`, :mod:`.refine`) run, where this library
is available, their elementwise, gather and scatter steps as one fused loop each (one pass over
the rows instead of one pass per PyTorch op), and their float32 row-chunk GEMMs with its own
kernel (:class:`Matmul`, AVX2 or AVX-512; torch.mm on other CPUs, in float64 and with
:func:`set_native_gemm` off).
Without it (no compiler, or ``MATRIS_NATIVE=0``) the kernels run their PyTorch references; the
tests compare the two.

The library is compiled on first use with ``$CXX`` (default ``c++``; C++17 and OpenMP:
GCC ≥ 7 or Clang ≥ 5) ``-O3 -march=native -fopenmp`` and cached under
``$MATRIS_CACHE/native/<hash>/`` (default ``~/.cache/matris``; ``$MATRIS_NATIVE_CACHE``
overrides the folder), the hash covering the source,
the compiler, the flags and the CPU (``-march=native`` code must not run on another kind of CPU
that shares the cache folder, e.g. a cluster's home directory), so it is built once per kind of
machine (a few seconds), and a library built from other sources is never loaded (no version
number is kept by hand). The build writes to a temporary name and renames it, so concurrent
processes never load a half-written file. ``MATRIS_NATIVE=0`` turns it off;
``MATRIS_NATIVE=1`` makes a failed build an error instead of a one-time warning.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "native.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno",
         "-fno-trapping-math"]


class NativeBuildError(RuntimeError):
    """The fused CPU library cannot be built here (the message says why and what to do)."""


def cache_root() -> Path:
    """``$MATRIS_NATIVE_CACHE``, else ``$MATRIS_CACHE/native``, else ``$XDG_CACHE_HOME/matris/native``,
    else ``~/.cache/matris/native``."""
    if os.environ.get("MATRIS_NATIVE_CACHE"):
        return Path(os.environ["MATRIS_NATIVE_CACHE"]).expanduser()
    if os.environ.get("MATRIS_CACHE"):
        return Path(os.environ["MATRIS_CACHE"]).expanduser() / "native"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "matris" / "native"


def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        raise NativeBuildError(f"no C++ compiler ({cxx!r} is not on PATH): install g++ (e.g. apt install g++) or set "
                               "CXX; without it the CPU kernels use PyTorch ops (slower, same numbers)")
    return path


def _cpu_identity() -> str:
    """What ``-march=native`` depends on: the CPU model and its instruction-set flags."""
    import platform

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
        return "\n".join(dict.fromkeys(keep))  # one copy of each line (every core repeats them)
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def build(force: bool = False) -> Path:
    """Compile ``native.cpp`` (once per source, compiler and flags) and return the library's path."""
    cxx = _compiler()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"the C++ compiler {cxx} does not run: {exc}") from exc
    key = hashlib.sha256(SOURCE.read_bytes() + version.encode() + " ".join(FLAGS).encode()
                         + _cpu_identity().encode()).hexdigest()[:16]
    folder = cache_root() / key
    lib = folder / "libmatris_native.so"
    if lib.is_file() and not force:
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libmatris_native.", suffix=".so", dir=folder)
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise NativeBuildError(f"compiling {SOURCE.name} with {cxx} failed:\n{proc.stderr.strip()[-2000:]}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_SIGNATURES = {
    "gather_silu": [_P, _P, _I64, _I64, _P, _INT, _INT, _P, _P, _INT, _INT],
    "gated_fwd": [_P, _P, _I64, _I64, _P, _P, _P, _P, _P, _P, _INT, None, _P, _P, _P, _P, _INT],
    "gated_bwd": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _INT, _I64, _I64, _P, _P, _INT],
    "scatter_add": [_P, _I64, _I64, _INT, _P, _P, _INT],
    "scale_scatter_add": [_P, _P, _I64, _I64, _INT, _P, _P, _INT],
    "attn_init": [_I64, _I64, _P, _P, _P, _P, _P, _P],
    "attn_fwd": [_P, _P, _P, _P, _P, _I64, _I64, _P, _P, _P, _P, _P, _P, _INT],
    "attn_finish": [_I64, _I64, _P, _P, _P],
    "attn_bwd": [_P, _P, _P, _P, _P, _I64, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _INT],
    "refine_fwd": [_P, _P, _P, _P, _I64, _I64, _P, _P, _INT],
    "refine_bwd": [_P, _P, _P, _P, _P, _P, _I64, _I64, _INT, _P, _P, _P, _INT],
    "vexp": [None],
}

# float32-only entry points (the GEMM and the whole-pass calls built on it); None: a float
_F32_SIGNATURES = {
    "gemm_pack": [_P, _I64, _I64, _I64, _I64, _P],
    "gemm": [_P, _I64, _I64, _I64, _P, _I64, _P, _I64, _P, _I64, _INT],
    "phi_fwd": [_P, _I64, _I64, _P, _I64, _I64, _P, _INT, _P, _P, _P, _P, _I64, _P, _P, _P, _P, _P, _P, _INT, None, _P,
                _P, _P, _P, _P, _P, _P, _INT],
    "phi_bwd": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _INT, _P, _I64, _I64, _I64, _P, _P, _P, _I64, _P, _INT, _P, _P,
                _I64, _INT],
    "attn_fwd_gemm": [_P, _I64, _I64, _P, _P, _P, _P, _I64, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _P, _INT],
    "attn_bwd_gemm": [_P, _P, _P, _P, _I64, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _I64, _P, _P, _P, _INT],
    "refine_fwd_whole": [_P, _P, _P, _P, _I64, _I64, _P, _P, _P, _P, _P, _P, _I64, _INT, _I64, _P, _P, _P, _INT],
    "refine_bwd_whole": [_P, _P, _P, _P, _P, _P, _I64, _I64, _P, _P, _P, _I64, _INT, _P, _P, _P, _P, _I64, _INT],
}


class _Library:
    def __init__(self, path: Path):
        self.path = path
        self.cdll = ctypes.CDLL(str(path))
        self.fns = {}
        for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
            for name, args in _SIGNATURES.items():
                fn = getattr(self.cdll, f"{name}_{suffix}")
                fn.argtypes = [real if a is None else a for a in args]
                fn.restype = real if name == "vexp" else None
                self.fns[name, suffix] = fn
        for name, args in _F32_SIGNATURES.items():  # float32 only: attributes named as in the library
            fn = getattr(self.cdll, f"{name}_f32")
            fn.argtypes = [ctypes.c_float if a is None else a for a in args]
            fn.restype = None
            setattr(self, name, fn)
        self.has_gemm = bool(self.cdll.gemm_available())

    def __call__(self, name: str, dtype: torch.dtype):
        return self.fns[name, "f32" if dtype == torch.float32 else "f64"]


_enabled = True


def set_enabled(flag: bool) -> bool:
    """Turn the fused loops on or off for this process (benchmarks and tests compare the two
    forms); returns the previous setting. ``MATRIS_NATIVE=0`` turns them off from the start."""
    global _enabled
    previous, _enabled = _enabled, bool(flag)
    return previous


_whole = True


def set_whole_calls(flag: bool) -> bool:
    """Turn the whole-pass calls (``phi_fwd``/``phi_bwd``, ``attn_fwd_gemm``/``attn_bwd_gemm``,
    ``refine_fwd_whole``/``refine_bwd_whole``: every step on blocks of rows in cache, one call) on or off, leaving the chunk loops of the same
    fused loops and GEMMs (same numbers; tests and benchmarks compare the two); returns the
    previous setting."""
    global _whole
    previous, _whole = _whole, bool(flag)
    return previous


def whole_calls() -> bool:
    """Whether the whole-pass calls apply: :func:`gemm_enabled` and not turned off."""
    return _whole and gemm_enabled()


def library() -> _Library | None:
    """The loaded library, or None where it is turned off or cannot be built (warned once)."""
    return _load() if _enabled else None


@functools.lru_cache(maxsize=1)
def _load() -> _Library | None:
    choice = os.environ.get("MATRIS_NATIVE", "auto")
    if choice == "0":
        return None
    try:
        return _Library(build())
    except (NativeBuildError, OSError) as exc:
        if choice == "1":
            raise
        warnings.warn(f"matris: the fused CPU kernels are not available ({exc}); the CPU path runs PyTorch ops "
                      "instead (same numbers, slower). MATRIS_NATIVE=0 silences this.", RuntimeWarning, stacklevel=2)
        return None


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the fused loops apply: the library loads, every tensor is a contiguous CPU tensor,
    the floating ones float32 or float64 (one dtype), the others int64 indices."""
    given = [t for t in tensors if t is not None]
    floats = [t for t in given if t.is_floating_point()]
    if not floats or any(t.device.type != "cpu" or not t.is_contiguous() for t in given):
        return False
    if floats[0].dtype not in (torch.float32, torch.float64) or any(t.dtype != floats[0].dtype for t in floats):
        return False
    if any(t.dtype != torch.int64 for t in given if not t.is_floating_point()):
        return False
    return available()


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the library is loaded (a constant for torch.compile, which must not trace the build)."""
    return library() is not None


def ptr(t: torch.Tensor | None) -> int | None:
    """A tensor's data pointer for ctypes (None for None); the tensor must be contiguous."""
    if t is None:
        return None
    if not t.is_contiguous():
        raise ValueError("native kernels need contiguous tensors")
    return t.data_ptr()


def ptr_array(tensors: list[torch.Tensor]):
    """A C array of data pointers (kept alive by the caller)."""
    return (ctypes.c_void_p * max(1, len(tensors)))(*[ptr(t) for t in tensors])


def threads() -> int:
    return max(1, torch.get_num_threads())


_native_gemm = True


def set_native_gemm(flag: bool) -> bool:
    """Turn the library's GEMM (and the whole passes built on it) on or off for this process, so
    that benchmarks can time every GEMM in MKL side by side; returns the previous setting."""
    global _native_gemm
    previous, _native_gemm = _native_gemm, bool(flag)
    return previous


def gemm_enabled() -> bool:
    """Whether :class:`Matmul` uses the library's float32 GEMM: built where the CPU has AVX2 + FMA
    (its AVX2 or AVX-512 kernel) and not turned off by :func:`set_native_gemm`."""
    lib = library()
    return _native_gemm and lib is not None and lib.has_gemm


class Matmul:
    """``x @ b`` for one right factor ``b [K, N]`` (any strides) used on many row chunks.

    float32 CPU with :func:`gemm_enabled` and N a multiple of 16: ``b`` is packed once into the
    library's panel layout (``K·N`` floats) and every call runs its GEMM. Otherwise ``torch.mm``.
    Each output element is then one fused multiply-add chain in k order (no split of K), so the
    result does not depend on the thread count.
    """

    def __init__(self, b: torch.Tensor):
        self.b = b
        self.k, self.n = b.shape
        lib = library()
        self.lib = lib if (b.dtype == torch.float32 and b.device.type == "cpu" and self.n % 16 == 0 and self.k > 0
                           and gemm_enabled()) else None
        if self.lib is not None:
            self.packed = torch.empty(self.k * self.n, dtype=torch.float32)
            self.lib.gemm_pack(b.data_ptr(), self.k, self.n, b.stride(0), b.stride(1), self.packed.data_ptr())

    def __call__(self, x: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """``out [M, N] = (x [M, K] @ b) ⊙ scale`` (``scale [M, N]`` optional; the native GEMM
        applies it to each tile in registers). The native GEMM needs unit column strides."""
        if (self.lib is None or x.dtype != torch.float32 or x.device.type != "cpu" or x.stride(1) != 1
                or out.stride(1) != 1 or x.shape[1] != self.k or tuple(out.shape) != (x.shape[0], self.n)
                or out.dtype != torch.float32 or (scale is not None and (
                    scale.dtype != torch.float32 or scale.stride(1) != 1 or scale.shape != out.shape))):
            torch.mm(x, self.b, out=out)
            return out.mul_(scale) if scale is not None else out
        if x.shape[0]:
            self.lib.gemm(x.data_ptr(), x.shape[0], self.k, x.stride(0), self.packed.data_ptr(), self.n,
                          out.data_ptr(), out.stride(0), scale.data_ptr() if scale is not None else None,
                          scale.stride(0) if scale is not None else 0, threads())
        return out
