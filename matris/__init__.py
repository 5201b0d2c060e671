"""MatRIS: a universal machine-learned interatomic potential with separable attention."""

from .errors import CheckpointError, MatRISInputError
from .graph import AtomicSystem, GraphBatch
from .model import MatRIS, MatRISConfig, ModelOutput

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
