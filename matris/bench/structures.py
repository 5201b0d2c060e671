"""Structures to benchmark on: standard supercell ladders (8 to 8,192 atoms) and user files.

A standard structure is a supercell of a cubic 8-atom cell (diamond Si, or rock-salt MgO as
a two-element oxide), repeated as close to a cube as the size allows (8,192 atoms is
8 × 8 × 16 cells), with every atom displaced by a seeded Gaussian of 0.02 Å so forces and
stresses are not zero by symmetry. Sizes must be multiples of 8 atoms.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import MatRISInputError

# family → (label, ASE bulk arguments of the cubic 8-atom cell)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "si": ("Si", {"name": "Si", "crystalstructure": "diamond", "a": 5.43, "cubic": True}),
    "mgo": ("MgO", {"name": "MgO", "crystalstructure": "rocksalt", "a": 4.21, "cubic": True}),
}
ATOMS_PER_CELL = 8
DEFAULT_SIZES: tuple[int, ...] = (8, 64, 216, 512, 1000, 2048, 4096, 8192)
RATTLE_A = 0.02  # Å, standard deviation of the displacements


@dataclass
class BenchStructure:
    """One structure of a benchmark.

    name: label in tables and files; atoms: the ASE Atoms (never modified by a benchmark);
    source: ``"standard"`` or the file it was read from.
    """

    name: str
    atoms: Any
    source: str = "standard"

    @property
    def num_atoms(self) -> int:
        return len(self.atoms)

    @property
    def has_volume(self) -> bool:
        """Periodic in all three directions, so a stress is defined."""
        return bool(np.all(self.atoms.pbc))


def supercell_repeats(cells: int) -> tuple[int, int, int]:
    """The most cubic ``(nx, ny, nz)`` with ``nx·ny·nz == cells`` and ``nx ≤ ny ≤ nz``."""
    best = (1, 1, cells)
    for nx in range(1, round(cells ** (1 / 3)) + 2):
        if cells % nx:
            continue
        for ny in range(nx, int((cells // nx) ** 0.5) + 1):
            if (cells // nx) % ny:
                continue
            nz = cells // (nx * ny)
            if nz >= ny and nz / nx < best[2] / best[0]:
                best = (nx, ny, nz)
    return best


def check_sizes(sizes: Iterable[int]) -> list[int]:
    """Validated standard sizes, ascending and without duplicates."""
    sizes = list(sizes)
    bad = [n for n in sizes if not isinstance(n, (int, np.integer)) or n <= 0 or n % ATOMS_PER_CELL]
    if bad:
        raise MatRISInputError(
            f"standard sizes must be positive multiples of {ATOMS_PER_CELL} atoms (the cubic 8-atom cell is "
            f"repeated), got {bad}; use e.g. --sizes {' '.join(map(str, DEFAULT_SIZES))}"
        )
    return sorted(set(int(n) for n in sizes))


def standard_structure(family: str, num_atoms: int, seed: int = 0) -> BenchStructure:
    """The ``num_atoms``-atom supercell of ``family`` (``"si"`` or ``"mgo"``), rattled by 0.02 Å."""
    from ase.build import bulk

    key = str(family).lower()
    if key not in FAMILIES:
        raise MatRISInputError(f"unknown structure family {family!r}; use one of {sorted(FAMILIES)}")
    (num_atoms,) = check_sizes([num_atoms])
    label, kwargs = FAMILIES[key]
    reps = supercell_repeats(num_atoms // ATOMS_PER_CELL)
    atoms = bulk(**kwargs).repeat(reps)
    rng = np.random.default_rng([seed, num_atoms])
    atoms.positions += rng.normal(scale=RATTLE_A, size=atoms.positions.shape)
    name = f"{label} {num_atoms}"
    atoms.info["name"] = name
    return BenchStructure(name, atoms, "standard")


def standard_structures(sizes: Sequence[int] = DEFAULT_SIZES, families: Sequence[str] = ("si",),
                        max_atoms: int | None = None) -> list[BenchStructure]:
    """The ladder of every family at every size up to ``max_atoms`` (None: no limit)."""
    sizes = [n for n in check_sizes(sizes) if max_atoms is None or n <= max_atoms]
    return [standard_structure(f, n) for f in families for n in sizes]


def read_bench_structures(paths: Sequence[str | Path], index: str = "-1") -> list[BenchStructure]:
    """Frames ``index`` (an ASE index, default the last frame) of each file.

    Files are read with ``ase.io.read`` (any format ASE knows); a file ASE cannot read is
    tried with pymatgen's ``Structure.from_file``.
    """
    from ..structure_files import read_frames

    out = []
    for path in map(Path, paths):
        frames = read_frames(path, index)
        for k, atoms in enumerate(frames):
            name = path.name + (f"[{k}]" if len(frames) > 1 else "")
            atoms.info["name"] = name
            out.append(BenchStructure(name, atoms, str(path)))
    return out


def from_objects(objects: Sequence[Any]) -> list[BenchStructure]:
    """:class:`BenchStructure` objects from ASE Atoms or pymatgen Structures/Molecules (copied)."""
    from ..structures import to_atoms

    out = []
    for k, obj in enumerate(objects):
        if isinstance(obj, BenchStructure):
            out.append(obj)
            continue
        atoms = to_atoms(obj, k)
        name = str(atoms.info.get("name", "")) or f"{atoms.get_chemical_formula()} #{k}"
        atoms.info["name"] = name
        out.append(BenchStructure(name, atoms, "python"))
    return out


__all__ = ["BenchStructure", "DEFAULT_SIZES", "FAMILIES", "check_sizes", "from_objects", "read_bench_structures",
           "standard_structure", "standard_structures", "supercell_repeats"]
