"""CPU memory reuse: freed tensors stay in the process heap for the next call instead of going back
to the operating system.

Every model call allocates and frees the same large tensors in the same order (an MD step, a
relaxation step, a batch of predictions). glibc's malloc serves blocks above a threshold (dynamic,
at most 32 MiB) with fresh ``mmap`` pages and gives them back on ``free``, and it trims freed
memory at the top of its heap: the next call then pays a page fault and the kernel's zeroing of
every fresh 4 KiB page on first touch, in system time, on every call (``tests/test_heap.py``
counts the faults of a call-like pattern with and without the setting).

:func:`keep_freed_memory` sets ``M_MMAP_MAX = 0`` (large blocks come from the heap too; glibc
still falls back to ``mmap`` where the heap cannot grow) and ``M_TRIM_THRESHOLD = 2 GiB - 1`` (up
to that much free memory at the heap's top is kept). So the process keeps its peak memory, as
PyTorch's CUDA caching allocator does on a GPU.

It is opt-in, since it changes malloc for the whole host process (ASE, Jupyter, LAMMPS): call
:func:`keep_freed_memory` in a script; for a process whose code you do not write (``lmp``), glibc's
own tunables do the same from its start:
``GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647`` (:data:`GLIBC_TUNABLES`).
The gain is measured by ``benchmarks/cpu_speed.py`` (``heap`` in its JSON: the same
Si64 call with and without, side by side; see docs/performance.md). :func:`release_memory` hands the
free memory back to the system (``malloc_trim``), e.g. after a large one-off calculation in a
long-lived process. Other C libraries (macOS, musl) are left alone.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_KEEP_BYTES = 2**31 - 1  # mallopt takes an int
_state: dict[str, object] = {"applied": False}
# the same setting as glibc's environment tunables, for processes started by others (LAMMPS)
GLIBC_TUNABLES = f"glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold={_KEEP_BYTES}"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=1)
def _glibc():
    # once: platform.libc_ver() reads the interpreter's binary, and free_bytes() runs on every CPU call
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = _MallInfo2
    return libc


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse (see the module docstring), for the whole process.
    Returns whether the setting is in effect (False off glibc)."""
    if _state["applied"]:
        return bool(_state["active"])
    _state["active"] = False
    return set_keep(True)


def set_keep(keep: bool) -> bool:
    """Switch the setting on (as :func:`keep_freed_memory`) or back to glibc's behaviour in a
    long-running process (free memory released now; blocks from 32 MiB up mmapped, free memory
    above 64 MiB at the heap's top trimmed: where glibc's dynamic thresholds settle once a 32 MiB
    block has been freed, and the most memory glibc keeps by itself); benchmarks compare the two
    in one process. Returns whether the setting is on; False off glibc."""
    libc = _glibc()
    if libc is None:
        return False
    _state["applied"] = True
    if keep:  # mallopt returns 1 on success
        _state["active"] = bool(libc.mallopt(_M_MMAP_MAX, 0)) & bool(libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))
    else:
        libc.mallopt(_M_MMAP_MAX, 65536)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20)
        libc.malloc_trim(0)
        _state["active"] = False
    return bool(_state["active"])


def release_memory() -> bool:
    """Return the heap's free memory to the operating system (glibc ``malloc_trim(0)``); True if
    some was released. The setting of :func:`keep_freed_memory` stays in effect."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def free_bytes() -> int:
    """Bytes the heap holds free for reuse (glibc ≥ 2.33 ``mallinfo2().fordblks``; 0 elsewhere).
    The model counts them as available when it chooses a memory level: kept memory is not lost."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return 0
    return int(libc.mallinfo2().fordblks)
