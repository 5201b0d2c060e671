"""Conversion of user structures (ASE Atoms, pymatgen Structure/Molecule) to :class:`AtomicSystem`.

This is the edge of the package where ase and pymatgen objects enter; everything after it
works on arrays and tensors.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .errors import MatRISInputError, MatRISInputWarning, counted
from .graph import AtomicSystem

# Plausibility thresholds (warnings, never errors). Two atoms closer than CONTACT_FACTOR × the
# sum of their covalent radii (Cordero's, as ase.data.covalent_radii) are not a real crystal:
# bonds, even triple bonds (N≡N 0.78×) and metallic hydrogen at TPa pressures, stay above it.
# Large, soft atoms (alkali, alkaline earth) compress far below their covalent radii (Cs near
# 100 GPa: 0.63× the Cs+Cs sum), so each radius counts at most CONTACT_RADIUS_CAP: the limit of
# a pair is then never above 0.7 × 2.4 = 1.68 Å, which no two heavy atoms in a real crystal
# approach, and one Si atom in a 1.5 Å cube (limit 1.55 Å) is caught.
CONTACT_FACTOR = 0.7
CONTACT_RADIUS_CAP = 1.2  # Å


def to_system(obj: Any, index: int | None = None) -> AtomicSystem:
    """An :class:`AtomicSystem` from ASE ``Atoms``, a pymatgen ``Structure``/``Molecule``, or itself.

    pymatgen Structures are periodic in all directions; Molecules are not periodic.
    """
    if isinstance(obj, AtomicSystem):
        return obj
    if hasattr(obj, "get_positions") and hasattr(obj, "get_atomic_numbers") and hasattr(obj, "pbc"):  # ase.Atoms
        name = str(obj.info.get("name", "")) or obj.get_chemical_formula()
        return AtomicSystem(obj.get_positions(), np.asarray(obj.cell[:]), obj.pbc, obj.get_atomic_numbers(), name)
    # pymatgen (not hasattr "species": a disordered structure raises on it)
    if hasattr(obj, "cart_coords") and hasattr(obj, "composition"):
        if not getattr(obj, "is_ordered", True):
            raise MatRISInputError(f"{_where(index)} ({obj.composition.reduced_formula}) is disordered: "
                                   f"{_disordered_site(obj)}; MatRIS needs one element per site. {ORDER_HINT}")
        numbers = [getattr(site.specie, "Z", 0) for site in obj]
        name = obj.composition.reduced_formula
        if hasattr(obj, "lattice"):
            return AtomicSystem(obj.cart_coords, obj.lattice.matrix, True, numbers, name)
        return AtomicSystem(obj.cart_coords, np.zeros((3, 3)), False, numbers, name)
    raise MatRISInputError(
        f"{_where(index)} is a {type(obj).__module__}.{type(obj).__name__}; MatRIS takes ase.Atoms or "
        "pymatgen Structure/Molecule objects."
    )


def contact_limits(numbers: np.ndarray) -> np.ndarray:
    """``[Zmax+1]`` radius of each element for the close-contact check, Å: its covalent radius,
    at most :data:`CONTACT_RADIUS_CAP`; a pair warns below CONTACT_FACTOR × (r_i + r_j)."""
    from ase.data import covalent_radii

    return np.minimum(np.asarray(covalent_radii[: int(numbers.max()) + 1]), CONTACT_RADIUS_CAP)


def implausibilities(system: AtomicSystem, cutoff: float | None = None, index: int | None = None) -> list[str]:
    """What about ``system`` is almost surely an input mistake, as phrases naming the numbers
    and the threshold (empty when nothing is): atoms closer than CONTACT_FACTOR × their capped
    covalent radii, and, given the model's ``cutoff`` (Å), a periodic cell in which no atom has
    a neighbour (nor a periodic image of itself) within it. One short neighbour search, after
    :meth:`AtomicSystem.check_finite`: a NaN or infinite position or lattice vector raises
    :class:`MatRISInputError` (structure ``index``) before it, as every entry point's check does."""
    from .graph.neighbors import half_neighbor_list
    from .graph.system import MIN_DISTANCE, element_symbol

    system.check_finite(index)  # the neighbour-list library fails on such input with an error of its own
    problems = []
    if system.num_atoms == 0:
        return problems
    radius = contact_limits(system.atomic_numbers)
    i, j, _, d = half_neighbor_list(system, 2 * CONTACT_FACTOR * float(radius.max()))
    if len(d) and d.min() < MIN_DISTANCE:
        return problems  # overlapping atoms: the graph builder raises, naming them
    if len(d):
        limit = CONTACT_FACTOR * (radius[system.atomic_numbers[i]] + radius[system.atomic_numbers[j]])
        close = d < limit
        if close.any():
            ratio = np.where(close, d / limit, np.inf)
            m = int(ratio.argmin())
            a, b = int(i[m]), int(j[m])
            pair = f"{element_symbol(int(system.atomic_numbers[a]))}–{element_symbol(int(system.atomic_numbers[b]))}"
            which = f"atom {a} and a periodic image of itself" if a == b else f"atoms {a} and {b}"
            volume = f", {system.volume / system.num_atoms:.3g} Å³ per atom" if system.pbc.all() else ""
            problems.append(
                f"{which} ({pair}) are {d[m]:.3f} Å apart, below {limit[m]:.3f} Å ({CONTACT_FACTOR} × the sum of "
                f"their covalent radii, each capped at {CONTACT_RADIUS_CAP} Å), closer than atoms in any real crystal "
                f"({counted(int(close.sum()), 'such pair')}{volume}): the cell or the positions are probably in the "
                "wrong units or scaled wrong")
    if cutoff is not None and system.pbc.any() and not len(d) and _isolated(system, cutoff):
        problems.append(
            f"no atom has a neighbour, nor a periodic image of itself, within the model's cutoff of {cutoff:g} Å "
            "(the vacuum is wider than the cutoff everywhere), so the model sees only isolated atoms: check the "
            "cell and the position units")
    return problems


def _isolated(system: AtomicSystem, cutoff: float) -> bool:
    """Whether no pair of atoms of ``system`` is within ``cutoff`` (Å)."""
    from .graph.neighbors import half_neighbor_list

    if system.pbc.all() and system.volume > 0:
        # equal spheres pack at most π/(3√2) of space: N atoms in volume V have a pair closer than
        # (√2·V/N)^(1/3), so dense cells (all real bulk crystals) need no neighbour search
        if (np.sqrt(2) * system.volume / system.num_atoms) ** (1 / 3) <= cutoff:
            return False
    return len(half_neighbor_list(system, cutoff)[3]) == 0


def occupancy_problem(atoms: Any) -> str | None:
    """For ASE Atoms read from a CIF with partial occupancies (``atoms.info["occupancy"]``, as
    ASE's CIF reader stores it per site kind), a phrase naming the first such site, else None."""
    from .structure_files import partial_sites

    sites = partial_sites(atoms)
    if not sites:
        return None
    index, _, text = sites[0]
    return (f"atoms.info['occupancy'] holds partial occupancies ({counted(len(sites), 'site')}, e.g. atom {index}: "
            f"{text}); "
            f"ASE kept one species per site, so the model sees an ordered structure that is not the one in the file")


def warn_implausible(structure: Any, cutoff: float | None = None, index: int | None = None,
                     system: AtomicSystem | None = None) -> list[str]:
    """Warn (:class:`MatRISInputWarning`) once for each of :func:`implausibilities` of
    ``structure`` (and ASE partial occupancies); returns the messages. ``system``: its
    :class:`AtomicSystem`, when the caller has it already."""
    system = system if system is not None else to_system(structure, index)
    problems = implausibilities(system, cutoff, index)
    occupancy = occupancy_problem(structure) if hasattr(structure, "info") else None
    if occupancy is not None:
        problems.append(occupancy)
    messages = [f"{system.label(index)}: {p}" for p in problems]
    for message in messages:
        warnings.warn(message, MatRISInputWarning, stacklevel=2)
    return messages


ORDER_HINT = ("Order it first: pick one species per site (e.g. pymatgen's OrderDisorderedStructureTransformation on "
              "a supercell, or a special quasirandom structure (SQS)), or replace each site by its majority species "
              "yourself.")


def _disordered_site(structure) -> str:
    """``"site 0 is Fe 0.5 + Ni 0.5 (1 of 4 sites partially occupied)"`` for a disordered pymatgen structure."""
    partial = [k for k, site in enumerate(structure) if not site.is_ordered]
    if not partial:
        return "its sites are not ordered"
    site = structure[partial[0]]
    shares = sorted(((el.symbol if hasattr(el, "symbol") else str(el), float(x)) for el, x in site.species.items()),
                    key=lambda kv: -kv[1])
    text = " + ".join(f"{name} {x:g}" for name, x in shares)
    empty = 1 - sum(x for _, x in shares)
    if empty > 1e-6:
        text += f" + vacancy {empty:.4g}"
    label = getattr(site, "label", None)
    label = f" ({label})" if label and label != site.species_string else ""  # pymatgen's default is the species
    return f"site {partial[0]}{label} is {text} ({len(partial)} of {len(structure)} sites partially occupied)"


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
