"""Conversion of user structures (ASE Atoms, pymatgen Structure/Molecule) to :class:`AtomicSystem`.

This is the edge of the package where ase and pymatgen objects enter; everything after it
works on arrays and tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import MatRISInputError
from .graph import AtomicSystem


def to_system(obj: Any, index: int | None = None) -> AtomicSystem:
    """An :class:`AtomicSystem` from ASE ``Atoms``, a pymatgen ``Structure``/``Molecule``, or itself.

    pymatgen Structures are periodic in all directions; Molecules are not periodic.
    """
    if isinstance(obj, AtomicSystem):
        return obj
    if hasattr(obj, "get_positions") and hasattr(obj, "get_atomic_numbers") and hasattr(obj, "pbc"):  # ase.Atoms
        name = str(obj.info.get("name", "")) or obj.get_chemical_formula()
        return AtomicSystem(obj.get_positions(), np.asarray(obj.cell[:]), obj.pbc, obj.get_atomic_numbers(), name)
    if hasattr(obj, "cart_coords") and hasattr(obj, "species"):  # pymatgen
        if not getattr(obj, "is_ordered", True):
            raise MatRISInputError(
                f"{_where(index)}: the structure is disordered (partial occupancies); MatRIS needs one element per "
                "site. Order it first, e.g. with pymatgen's OrderDisorderedStructureTransformation."
            )
        numbers = [getattr(site.specie, "Z", 0) for site in obj]
        name = obj.composition.reduced_formula
        if hasattr(obj, "lattice"):
            return AtomicSystem(obj.cart_coords, obj.lattice.matrix, True, numbers, name)
        return AtomicSystem(obj.cart_coords, np.zeros((3, 3)), False, numbers, name)
    raise MatRISInputError(
        f"{_where(index)} is a {type(obj).__module__}.{type(obj).__name__}; MatRIS takes ase.Atoms or "
        "pymatgen Structure/Molecule objects."
    )


def _where(index: int | None) -> str:
    return "structure" if index is None else f"structure {index}"


def to_atoms(obj: Any, index: int | None = None):
    """A new ASE ``Atoms`` from Atoms (copied), a pymatgen Structure/Molecule or an AtomicSystem.

    The caller's object is never modified. Raises :class:`MatRISInputError` for anything else.
    """
    from ase import Atoms

    if isinstance(obj, Atoms):
        atoms = obj.copy()
        atoms.calc = None
        return atoms
    system = to_system(obj, index)
    atoms = Atoms(numbers=system.atomic_numbers, positions=system.positions, cell=system.cell, pbc=system.pbc)
    if system.name:
        atoms.info["name"] = system.name
    return atoms


def like_input(atoms: Any, template: Any) -> Any:
    """``atoms`` as the kind of object ``template`` is: a pymatgen Structure/Molecule or ASE Atoms."""
    if hasattr(template, "cart_coords") and hasattr(template, "species"):  # pymatgen
        from pymatgen.io.ase import AseAtomsAdaptor

        plain = atoms.copy()  # without the calculator: only the geometry goes across
        plain.calc = None
        if hasattr(template, "lattice"):
            return AseAtomsAdaptor.get_structure(plain)
        return AseAtomsAdaptor.get_molecule(plain)
    return atoms
