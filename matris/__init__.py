"""MatRIS: a universal machine-learned interatomic potential with separable attention."""

import os as _os
import sys as _sys


def _map_source_kernels() -> None:
    """kernels/ sits at the repository top and installs as matris.kernels; from a source
    checkout that is not installed (e.g. a benchmark run on a bare GPU machine), map it here."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    if "matris.kernels" in _sys.modules or _os.path.isdir(_os.path.join(here, "kernels")):
        return
    source = _os.path.join(_os.path.dirname(here), "kernels")
    if not _os.path.isfile(_os.path.join(source, "__init__.py")):
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "matris.kernels", _os.path.join(source, "__init__.py"), submodule_search_locations=[source]
    )
    module = importlib.util.module_from_spec(spec)
    _sys.modules["matris.kernels"] = module
    spec.loader.exec_module(module)
    globals()["kernels"] = module


_map_source_kernels()

from .errors import CheckpointError, MatRISInputError  # noqa: E402
from .graph import AtomicSystem, GraphBatch  # noqa: E402
from .model import MatRIS, MatRISConfig, ModelOutput  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "MatRIS",
    "MatRISConfig",
    "ModelOutput",
    "GraphBatch",
    "AtomicSystem",
    "MatRISInputError",
    "CheckpointError",
    "MatRISCalculator",
    "__version__",
]


def __getattr__(name):
    # The calculator needs ase; keep the core importable without it.
    if name == "MatRISCalculator":
        from .calculator import MatRISCalculator

        return MatRISCalculator
    raise AttributeError(f"module 'matris' has no attribute {name!r}")
