"""The official MatRIS 1.0 application API, over this package's model and calculator.

Scripts written for the official package (``from matris.applications.base import MatRISCalculator``,
``StructOptimizer``, ``MolecularDynamics``, ``matris.applications.torchsim.MatRISTorchSimModel``) run
here unchanged: same module paths, names, signatures, defaults and return shapes, one model
underneath (:class:`matris.MatRIS`). The mapping, what is the same and what differs:
``docs/coming-from-official.md``.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import MatRISCalculator
    from .md import MolecularDynamics
    from .relax import StructOptimizer

__all__ = ["MatRISCalculator", "MolecularDynamics", "StructOptimizer"]

_LAZY = {"MatRISCalculator": ".base", "MolecularDynamics": ".md", "StructOptimizer": ".relax"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
