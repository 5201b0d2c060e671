"""A structure as plain arrays, and the checks every structure passes before MatRIS sees it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MatRISInputError

MAX_Z = 94
MIN_DISTANCE = 0.1  # Å; closer atoms are almost certainly an input error

_SYMBOLS = (
    "X H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br Kr "
    "Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm Yb "
    "Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf Es Fm Md No Lr Rf "
    "Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og"
).split()


def distinct_digits(value: float, limit: float) -> str:
    """``value`` (< ``limit``) with the fewest decimals (at least 4) at which it reads below
    ``limit``: 0.09999 must not print as 0.1000 next to a limit of 0.1."""
    for digits in range(4, 17):
        text = f"{value:.{digits}f}"
        if float(text) < limit:
            return text
    return repr(value)


def overlap_error(who: str, i: int, j: int, distance: float) -> MatRISInputError:
    """The error for atoms ``i`` and ``j`` of structure ``who`` closer than :data:`MIN_DISTANCE`
    (``distance`` in Å): the one message of every builder that checks it."""
    return MatRISInputError(
        f"{who}: atoms {int(i)} and {int(j)} are {distinct_digits(float(distance), MIN_DISTANCE)} Å apart, closer "
        f"than {MIN_DISTANCE} Å (overlapping atoms or a duplicated site); remove one of them or fix "
        "the positions.")


FINITE_HINT = "positions and the cell must be finite numbers — check how the structure was made"


def _vector(values) -> str:
    """``(nan, 0.0, 1.3575)``: three numbers as a user reads them (6 decimals at most)."""
    return "(" + ", ".join(repr(round(float(x), 6)) for x in values) + ")"


def non_finite_problem(positions: np.ndarray, cell: np.ndarray) -> str | None:
    """What is NaN or infinite in one structure (``positions [N, 3]``, ``cell [3, 3]`` rows, Å),
    as a phrase naming the first bad lattice vector or atom and its value; None when all is finite.
    The whole cell counts, periodic or not: the model shifts every bond by image · cell."""
    bad_rows = ~np.isfinite(cell).all(axis=1)
    if bad_rows.any():
        k = int(np.flatnonzero(bad_rows)[0])
        return f"lattice vector {'abc'[k]} of the cell is NaN or infinite {_vector(cell[k])} Å"
    bad_atoms = ~np.isfinite(positions).all(axis=1)
    if bad_atoms.any():
        k = int(np.flatnonzero(bad_atoms)[0])
        return f"atom {k} has a NaN or infinite position {_vector(positions[k])} Å"
    return None


def non_finite_error(who: str, problem: str) -> MatRISInputError:
    """The error for a structure ``who`` with a :func:`non_finite_problem`: the one message of
    every entry point (arrays and torch-sim states alike), raised before any neighbour search."""
    return MatRISInputError(f"{who}: {problem}; {FINITE_HINT}.")


def element_symbol(z: int) -> str:
    """Chemical symbol of atomic number ``z`` (``'Z=<z>'`` outside the periodic table)."""
    return _SYMBOLS[z] if 0 < z < len(_SYMBOLS) else f"Z={z}"


def atom_element(k: int, z: int) -> str:
    """``"atom k is Am (Z=95)"``; ``"atom k has Z=0 (ASE's dummy atom X, not an element)"`` and
    ``"atom k has Z=-1"`` where ``z`` names no element, so no value is said twice."""
    if 0 < z < len(_SYMBOLS):
        return f"atom {k} is {_SYMBOLS[z]} (Z={z})"
    return f"atom {k} has Z={z}" + (" (ASE's dummy atom X, not an element)" if z == 0 else "")


@dataclass
class AtomicSystem:
    """One structure as arrays: the input of graph construction.

    positions: ``[N, 3]`` Cartesian, Å. cell: ``[3, 3]``, rows are lattice vectors, Å
    (rows of non-periodic directions are ignored). pbc: ``[3]`` bool.
    atomic_numbers: ``[N]`` int. name: used in error messages.
    """

    positions: np.ndarray
    cell: np.ndarray
    pbc: np.ndarray
    atomic_numbers: np.ndarray
    name: str = ""

    def __post_init__(self) -> None:
        self.positions = np.asarray(self.positions, dtype=np.float64).reshape(-1, 3)
        self.cell = np.asarray(self.cell, dtype=np.float64).reshape(3, 3)
        self.pbc = np.broadcast_to(np.asarray(self.pbc, dtype=bool), (3,)).copy()
        self.atomic_numbers = np.asarray(self.atomic_numbers, dtype=np.int64).reshape(-1)

    @property
    def num_atoms(self) -> int:
        return len(self.atomic_numbers)

    @property
    def volume(self) -> float:
        """Cell volume in Å³ (0 unless all three directions are periodic)."""
        return float(abs(np.linalg.det(self.cell))) if self.pbc.all() else 0.0

    def label(self, index: int | None = None) -> str:
        where = f"structure {index}" if index is not None else "structure"
        return f"{where} ({self.name})" if self.name else where

    def check_finite(self, index: int | None = None) -> None:
        """Raise :class:`MatRISInputError` if a position or a lattice vector is NaN or infinite,
        naming the first one and its value. Every check that searches neighbours
        (:meth:`validate`, the plausibility check) calls it first: the neighbour-list library
        fails on such input with an error of its own (or a floating-point trap)."""
        if np.isfinite(self.positions).all() and np.isfinite(self.cell).all():
            return
        raise non_finite_error(self.label(index), non_finite_problem(self.positions, self.cell))

    def validate(self, index: int | None = None) -> None:
        """Raise :class:`MatRISInputError` naming the problem, the structure and the fix."""
        who = self.label(index)
        if self.num_atoms == 0:
            raise MatRISInputError(f"{who} is empty: it has no atoms. Remove it from the input.")
        if len(self.positions) != self.num_atoms:
            raise MatRISInputError(
                f"{who} has {len(self.positions)} positions but {self.num_atoms} atomic numbers; they must match."
            )
        bad = (self.atomic_numbers < 1) | (self.atomic_numbers > MAX_Z)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            z = int(self.atomic_numbers[k])
            raise MatRISInputError(
                f"{who}: {atom_element(k, z)}; MatRIS covers Z = 1 (H) to {MAX_Z} (Pu). "
                "Remove or replace that element."
            )
        self.check_finite(index)
        if self.pbc.any():
            periodic = self.cell[self.pbc]
            sv = np.linalg.svd(periodic, compute_uv=False)
            if sv.min() < 1e-4:
                dirs = "".join("abc"[i] for i in np.flatnonzero(self.pbc))
                raise MatRISInputError(
                    f"{who}: the cell is degenerate in its periodic directions ({dirs}): the lattice vectors "
                    f"{periodic.round(6).tolist()} are zero or linearly dependent. Give a proper cell, or set "
                    "pbc=False along directions that are not periodic."
                )
