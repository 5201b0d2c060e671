"""Structures and models as the simulations take them: a copy of the structure as ASE Atoms
with a MatRIS calculator attached. Every simulation starts here, so the caller's object is
never modified and bad input fails before any dynamics start."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..calculator import MatRISCalculator
from ..devices import device_and_dtype
from ..errors import MatRISInputError
from ..model import MatRIS
from ..structures import to_atoms, to_system

ModelLike = MatRIS | MatRISCalculator | str | os.PathLike | None


def calculator(model: ModelLike = None, device: str | torch.device | None = None,
               dtype: str | torch.dtype | None = None, compute_stress: bool = True) -> MatRISCalculator:
    """A :class:`MatRISCalculator` for ``model``: a calculator (used as is), a :class:`MatRIS`,
    a checkpoint path, or None / "demo" for the bundled model."""
    if isinstance(model, MatRISCalculator):
        return model
    device, dtype = device_and_dtype(model, device, dtype)
    return MatRISCalculator(model, device=device, dtype=dtype, compute_stress=compute_stress)


def prepare(structure: Any, model: ModelLike = None, device: str | torch.device | None = None,
            dtype: str | torch.dtype | None = None, compute_stress: bool = True, index: int | None = None):
    """A checked copy of ``structure`` as ASE Atoms with a MatRIS calculator attached."""
    atoms = check_structure(structure, index)
    atoms.calc = calculator(model, device, dtype, compute_stress)
    atoms.calc.check_plausibility(atoms)  # warned here once, before any step (and not again by the steps)
    return atoms


def check_structure(structure: Any, index: int | None = None):
    """A copy of ``structure`` as ASE Atoms, checked as the model would check it (elements,
    finite positions, a proper cell, no overlapping atoms), before any model is loaded.

    The overlap check is here and not only in the graph builder: phonopy's symmetry search
    (spglib) meets a structure before the model does, and fails on one with a traceback."""
    from ..graph.neighbors import half_neighbor_list
    from ..graph.system import MIN_DISTANCE, overlap_error

    atoms = to_atoms(structure, index)
    system = to_system(atoms)
    system.validate(index)
    i, j, _, d = half_neighbor_list(system, MIN_DISTANCE)
    if len(d):
        m = int(d.argmin())
        raise overlap_error(system.label(index), i[m], j[m], d[m])
    return atoms


def require_periodic(atoms, what: str, fix: str) -> None:
    """Raise :class:`MatRISInputError` unless ``atoms`` is periodic in all three directions."""
    if not atoms.pbc.all():
        name = atoms.info.get("name") or atoms.get_chemical_formula()
        raise MatRISInputError(
            f"structure {name} has pbc={atoms.pbc.tolist()}, but {what} needs a cell periodic in all three "
            f"directions; {fix}"
        )


def check_positive(**values: float) -> None:
    """Raise :class:`MatRISInputError` for any argument that is not a positive number."""
    for name, value in values.items():
        if not isinstance(value, (int, float)) or not value > 0:
            raise MatRISInputError(f"{name} must be a positive number, got {value!r}")
