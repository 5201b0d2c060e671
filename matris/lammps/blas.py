"""PyTorch's own BLAS inside LAMMPS.

``liblammps.so`` exports a reference ``dgemm_`` (LAMMPS's bundled linear algebra), and so does
``libtorch_cpu.so`` (its optimised BLAS). Loaded after LAMMPS into a process where LAMMPS's
symbols are global (the ``lmp`` executable, or the ``lammps`` Python module, which loads its
library with ``RTLD_GLOBAL``), ``libtorch_cpu.so`` resolves its own calls to ``dgemm_`` to the
first definition in the global scope: LAMMPS's, a plain triple loop, and float64 models (whose
GEMMs go through ``dgemm_``) ran 1.7× slower than in plain Python. :func:`bind_own_blas` loads
``libtorch_cpu.so`` with ``RTLD_DEEPBIND`` before ``import torch``, so that its own symbols come
first for it; ``import torch`` then finds the library loaded and uses it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

_handle = None  # the deep-bound libtorch_cpu.so, kept loaded


def global_dgemm() -> bool:
    """Whether the process's global scope already defines ``dgemm_`` (LAMMPS's, in LAMMPS)."""
    try:
        return hasattr(ctypes.CDLL(None), "dgemm_")
    except OSError:
        return False


def bind_own_blas() -> str:
    """Load ``libtorch_cpu.so`` deep-bound where another ``dgemm_`` is global and torch is not
    imported yet; returns what was done (for the log and the tests): ``"deep-bound"``,
    ``"not needed"``, ``"too late"`` (torch was imported first: its BLAS calls may go to the
    global ``dgemm_``) or ``"unavailable"``."""
    global _handle
    if _handle is not None:
        return "deep-bound"
    if not global_dgemm():
        return "not needed"
    if "torch" in sys.modules:
        return "too late"
    spec = importlib.util.find_spec("torch")
    flag = getattr(os, "RTLD_DEEPBIND", 0)
    if spec is None or not spec.submodule_search_locations or not flag:
        return "unavailable"
    library = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libtorch_cpu.so"
    if not library.is_file():
        return "unavailable"
    _handle = ctypes.CDLL(str(library), mode=os.RTLD_NOW | flag)
    return "deep-bound"


# done on import: matris.lammps.runtime imports this module before torch
STATUS = bind_own_blas()
