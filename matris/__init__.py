"""MatRIS: a universal machine-learned interatomic potential with separable attention.

``import matris`` is cheap (no torch): the classes below load on first use, so
``matris.__version__`` and ``matris --help`` answer at once.
"""

import os as _os
import sys as _sys
from typing import TYPE_CHECKING

from ._version import __version__


def _map_source_kernels() -> None:
    """kernels/ sits at the repository top and installs as matris.kernels; from a source
    checkout that is not installed (e.g. a benchmark run on a bare GPU machine), map it here.
    The mapping is a finder consulted on ``import matris.kernels``, so torch loads only then."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    if "matris.kernels" in _sys.modules or _os.path.isdir(_os.path.join(here, "kernels")):
        return
    source = _os.path.join(_os.path.dirname(here), "kernels")
    if not _os.path.isfile(_os.path.join(source, "__init__.py")):
        return
    import importlib.util

    class _SourceKernels:
        """A meta path finder for matris.kernels only; appended last, so an installed
        mapping (an editable install's finder) still wins."""

        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "matris.kernels":
                return None
            return importlib.util.spec_from_file_location(
                name, _os.path.join(source, "__init__.py"), submodule_search_locations=[source]
            )

    if not any(type(f).__name__ == "_SourceKernels" for f in _sys.meta_path):
        _sys.meta_path.append(_SourceKernels())


def _check_official() -> None:
    # the official MatRIS distribution shares the matris/ folder: say so before an obscure failure
    from ._conflict import check

    check()


_check_official()
_map_source_kernels()

# name -> submodule of the public names, imported on first access (PEP 562)
_LAZY = {
    "MatRIS": ".model",
    "MatRISConfig": ".model",
    "RunOptions": ".settings",
    "ModelOutput": ".model",
    "GraphBatch": ".graph",
    "AtomicSystem": ".graph",
    "MatRISInputError": ".errors",
    "MatRISInputWarning": ".errors",
    "MemoryLimitError": ".errors",
    "CheckpointError": ".errors",
    "MatRISCalculator": ".calculator",
}

if TYPE_CHECKING:  # for type checkers and the API docs; at run time see __getattr__
    from .calculator import MatRISCalculator
    from .errors import CheckpointError, MatRISInputError, MatRISInputWarning, MemoryLimitError
    from .graph import AtomicSystem, GraphBatch
    from .model import MatRIS, MatRISConfig, ModelOutput
    from .settings import RunOptions

__all__ = [
    "MatRIS",
    "MatRISConfig",
    "RunOptions",
    "ModelOutput",
    "GraphBatch",
    "AtomicSystem",
    "MatRISInputError",
    "MatRISInputWarning",
    "MemoryLimitError",
    "CheckpointError",
    "MatRISCalculator",
    "__version__",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # later accesses skip this function
        return value
    raise AttributeError(f"module 'matris' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
