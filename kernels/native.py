"""The fused CPU operators' C++ kernels (``csrc/cpu/``), built once and registered with torch.

``matris::gated_phi``, ``matris::attention_pair``, ``matris::refine_edges`` and their ``*_backward`` are defined in
Python (:mod:`.phi`, :mod:`.aggregate`, :mod:`.refine`, with autograd and Triton CUDA kernels); loading this library
registers their CPU kernels (``csrc/cpu/{phi,attention,refine}.cpp``, ``TORCH_LIBRARY_IMPL``): each formula in one pass
over L2-sized row blocks, float32 and float64. Without it (no compiler, ``MATRIS_NATIVE=0``) the PyTorch references run.

It is compiled on first use with ``$CXX`` (default ``c++``; C++20 and OpenMP: GCC ≥ 10 or Clang ≥ 12) with ``FLAGS``
against the running torch's headers and cached under :func:`cache_root`, keyed by a hash of the sources, compiler,
flags, torch version and CPU (``-march=native`` code must not run on another CPU sharing the cache, e.g. a cluster's
home): built once per kind of machine and torch, a stale library is never loaded. It is written under a temporary name
and renamed, so concurrent processes never load a half-written file. ``MATRIS_NATIVE=1`` makes a failed build an error
instead of a one-time warning. Under ``TRITON_INTERPRET=1`` it is not loaded (the Triton kernels serve CPU tensors).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path

import torch

from .. import log
from ..settings import cache_home, interpreting, native_cache, native_choice

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (CSRC / "cpu" / "basis.cpp", CSRC / "cpu" / "phi.cpp", CSRC / "cpu" / "attention.cpp",
           CSRC / "cpu" / "refine.cpp")
HEADERS = (CSRC / "cpu" / "common.h",)
# -mprefer-vector-width=512: full AVX-512 width (GCC's default is 256 bits) made the Φ operators 7-10% faster on a Xeon
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-std=c++20", "-fPIC", "-fno-math-errno",
         "-fno-trapping-math", "-fvisibility=hidden"]


class NativeBuildError(RuntimeError):
    """The fused CPU library cannot be built here (the message says why and what to do)."""


def cache_root() -> Path:
    """``$MATRIS_NATIVE_CACHE``, else ``$MATRIS_CACHE/native``, else ``${XDG_CACHE_HOME:-~/.cache}/matris/native``."""
    return Path(native_cache()).expanduser() if native_cache() else cache_home("native")


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


def _torch_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags for an extension of the running torch (its headers, C++ ABI and loaded libraries)."""
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    compile_flags = [*includes, f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    libs = cpp_extension.library_paths()
    link_flags = [*(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs), "-lc10", "-ltorch_cpu", "-ltorch"]
    return compile_flags, link_flags


def build(force: bool = False) -> Path:
    """Compile the operators' sources (once per sources, compiler, flags, torch and CPU); return the library's path."""
    cxx, compile_flags, link_flags, lib = _target()
    if lib.is_file() and not force:
        return lib
    folder = lib.parent
    folder.mkdir(parents=True, exist_ok=True)
    with _build_lock(folder):
        if lib.is_file() and not force:  # another process built it while this one waited
            return lib
        # a first call that compiles for a minute in silence looks hung: say what happens, once
        _say(f"compiling the fused CPU kernels for this CPU and torch {torch.__version__} (once; about a minute); "
             f"cached in {folder}")
        start = time.perf_counter()
        _compile_and_link(cxx, compile_flags, link_flags, lib)
        _say(f"compiled the fused CPU kernels in {time.perf_counter() - start:.0f} s")
    return lib


def _target() -> tuple[str, list[str], list[str], Path]:
    """The compiler, its flags and the library's path in the cache, keyed by all that goes into the build."""
    cxx = _compiler()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"the C++ compiler {cxx} does not run: {exc}") from exc
    compile_flags, link_flags = _torch_flags()
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.name.encode() + path.read_bytes())
    for part in (version, " ".join(FLAGS + compile_flags + link_flags), torch.__version__,
                 str(torch.version.git_version), _cpu_identity(), sys.platform):
        digest.update(part.encode())
    lib = cache_root() / digest.hexdigest()[:16] / "libmatris_ops.so"
    return cxx, compile_flags, link_flags, lib


def _say(text: str) -> None:
    """A progress line on stderr (not a warning: nothing is wrong, and filters must not hide it)."""
    log.info(text)


@contextlib.contextmanager
def _build_lock(folder: Path):
    """Processes that start together (a SLURM array, DDP ranks) compile once; the others wait and load its library."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): concurrent builds are still safe, only repeated
        yield
        return
    with open(folder / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            _say(f"waiting for another process that is compiling the fused CPU kernels in {folder}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compile_and_link(cxx: str, compile_flags: list[str], link_flags: list[str], lib: Path) -> None:
    folder = lib.parent
    with tempfile.TemporaryDirectory(prefix=".build.", dir=folder) as tmp:
        objects = [Path(tmp) / f"{src.stem}.o" for src in SOURCES]
        # the sources compile in parallel (each takes seconds: torch's headers)
        procs = [subprocess.Popen([cxx, *FLAGS, *compile_flags, "-c", str(src), "-o", str(obj)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for src, obj in zip(SOURCES, objects)]
        for src, proc in zip(SOURCES, procs):
            _, err = proc.communicate(timeout=900)
            if proc.returncode != 0:
                raise NativeBuildError(f"compiling {src.name} with {cxx} failed:\n{err.strip()[-2000:]}")
        out = Path(tmp) / lib.name
        proc = subprocess.run([cxx, "-shared", "-fopenmp", *map(str, objects), "-o", str(out), *link_flags],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise NativeBuildError(f"linking the fused CPU library failed:\n{proc.stderr.strip()[-2000:]}")
        os.replace(out, lib)


def library() -> Path | None:
    """The loaded library's path, or None where turned off (``MATRIS_NATIVE=0``) or not buildable (warned once)."""
    return _load()


@functools.lru_cache(maxsize=1)
def _load() -> Path | None:
    choice = native_choice()
    if choice == "0" or interpreting():
        return None
    try:
        path = build()
        torch.ops.load_library(str(path))
    except (NativeBuildError, OSError) as exc:
        if choice == "1":
            raise
        warnings.warn(f"matris: the fused CPU kernels are not available ({exc}); the CPU path runs PyTorch ops "
                      "instead (same numbers, slower). MATRIS_NATIVE=0 silences this.", RuntimeWarning, stacklevel=2)
        return None
    return path


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the library is loaded (a constant for torch.compile, which must not trace the build)."""
    return library() is not None


def instruction_set() -> str:
    """The vector code the library's float32 GEMM runs here (benchmarks record it): ``avx512``, ``avx2`` or
    ``portable``, as ``-march=native`` found less flags like ``-mno-avx512f``; float64 always runs the portable one."""
    flags = _cpu_identity()
    if " avx512f" in flags and "-mno-avx512f" not in FLAGS:
        return "avx512"
    if " avx2" in flags and " fma" in flags and "-mno-avx2" not in FLAGS:
        return "avx2"
    return "portable"
