"""Small labelled datasets made offline with ASE's EMT potential (for examples, tests and demos).

EMT covers Al, Cu, Ag, Au, Ni, Pd and Pt; the structures are fcc alloys with random
substitutions, strained cells and rattled positions, labelled with energy (eV), forces
(eV/Å) and stress (ASE sign, eV/Å³ in the file; the readers convert to GPa).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

EMT_ELEMENTS = ("Al", "Cu", "Ag", "Au", "Ni", "Pd", "Pt")
_LATTICE = {"Al": 4.05, "Cu": 3.61, "Ag": 4.09, "Au": 4.08, "Ni": 3.52, "Pd": 3.89, "Pt": 3.92}


def emt_structures(n: int, seed: int = 0, elements: tuple[str, ...] = EMT_ELEMENTS, max_atoms: int = 8,
                   rattle: float = 0.08, strain: float = 0.04, energy_scale: float = 1.0,
                   energy_shift: dict[str, float] | None = None):
    """``n`` labelled ASE Atoms: fcc alloys of ``elements`` (1–``max_atoms`` atoms), strained and rattled.

    ``energy_scale`` and ``energy_shift`` ({symbol: eV/atom}) relabel the EMT energies and
    forces, E' = s·E + Σ shift — a stand-in for "the same materials under another
    functional", used to demonstrate fine-tuning.
    """
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    rng = np.random.default_rng(seed)
    shift = energy_shift or {}
    repeats = [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2)]
    out = []
    for k in range(n):
        host = str(rng.choice(elements))
        cubic = bool(rng.random() < 0.5)
        atoms = bulk(host, "fcc", a=_LATTICE[host], cubic=cubic)
        options = [r for r in repeats if len(atoms) * np.prod(r) <= max_atoms] or [(1, 1, 1)]
        atoms = atoms.repeat(options[int(rng.integers(len(options)))])
        symbols = atoms.get_chemical_symbols()
        for i in range(len(atoms)):
            if rng.random() < 0.4:
                symbols[i] = str(rng.choice(elements))
        atoms.set_chemical_symbols(symbols)
        # lattice parameter of the mixture (Vegard) so alloys are near equilibrium
        a_mix = np.mean([_LATTICE[s] for s in symbols]) / _LATTICE[host]
        eps = rng.uniform(-strain, strain, size=(3, 3))
        atoms.set_cell(atoms.cell[:] @ (a_mix * (np.eye(3) + (eps + eps.T) / 2)), scale_atoms=True)
        atoms.positions += rng.normal(scale=rattle, size=atoms.positions.shape)
        atoms.calc = EMT()
        energy = atoms.get_potential_energy() * energy_scale + sum(shift.get(s, 0.0) for s in symbols)
        forces = atoms.get_forces() * energy_scale
        stress = atoms.get_stress(voigt=False) * energy_scale
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces, stress=stress)
        atoms.info["material_id"] = f"emt-{seed}-{k // 2}"  # pairs of frames share an id
        out.append(atoms)
    return out


def write_emt_dataset(path: str | Path, n: int, seed: int = 0, **kwargs) -> Path:
    """Write :func:`emt_structures` to an extxyz file (atomically) and return its path."""
    from ase.io import write

    from ..atomic import atomic_path

    with atomic_path(path, suffix=".extxyz") as tmp:
        write(tmp, emt_structures(n, seed, **kwargs), format="extxyz")
    return Path(path)


# OMat24-like prototypes: fractional sites of one conventional/primitive cell (cubic unless noted)
_PROTOTYPES = {
    "fcc": np.array([[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]]),
    "bcc": np.array([[0, 0, 0], [0.5, 0.5, 0.5]]),
    "sc": np.array([[0, 0, 0]]),
    "rocksalt": np.array([[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0],
                          [0.5, 0.5, 0.5], [0.5, 0, 0], [0, 0.5, 0], [0, 0, 0.5]]),
    "perovskite": np.array([[0, 0, 0], [0.5, 0.5, 0.5], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]]),
    "fluorite": np.array([[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0], [0.25, 0.25, 0.25],
                          [0.75, 0.75, 0.25], [0.75, 0.25, 0.75], [0.25, 0.75, 0.75], [0.75, 0.75, 0.75],
                          [0.25, 0.25, 0.75], [0.25, 0.75, 0.25], [0.75, 0.25, 0.25]]),
}
# elements drawn for OMat-like cells: H–Bi without the noble gases (Z = 1..83)
_OMAT_Z = np.array([z for z in range(1, 84) if z not in (2, 10, 18, 36, 54)])


def omat_like_atoms(n: int, seed: int = 0, max_atoms: int = 24):
    """``n`` OMat24-like labelled ASE Atoms for data-pipeline benchmarks (labels are random).

    OMat24 is mostly rattled and AIMD snapshots of small bulk cells (a few to ~20 atoms) over
    the periodic table, labelled with energy, forces (large: far from equilibrium) and
    stress, without magnetic moments. Here: a prototype of 1–12 sites with random elements,
    repeated up to ``max_atoms``, at 10–22 Å³ per atom, strained ±4 % and rattled by 0.1 Å;
    energy ≈ −5 eV/atom with noise, forces ~N(0, 1) eV/Å, stress ~N(0, 0.01) eV/Å³. Only the
    sizes matter for throughput; the values are not physical.
    """
    from ase import Atoms
    from ase.calculators.singlepoint import SinglePointCalculator

    rng = np.random.default_rng(seed)
    names = list(_PROTOTYPES)
    out = []
    for k in range(n):
        frac = _PROTOTYPES[names[int(rng.integers(len(names)))]]
        reps = [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2)]
        reps = [r for r in reps if len(frac) * np.prod(r) <= max_atoms]
        r = np.array(reps[int(rng.integers(len(reps)))])
        grid = np.stack(np.meshgrid(*[np.arange(m) for m in r], indexing="ij"), -1).reshape(-1, 3)
        frac_all = ((grid[:, None, :] + frac[None]) / r).reshape(-1, 3)
        natoms = len(frac_all)
        species = rng.choice(_OMAT_Z, size=min(3, len(frac)), replace=False)
        z = species[rng.integers(len(species), size=len(frac))][np.tile(np.arange(len(frac)), len(grid))]
        volume = natoms * rng.uniform(10.0, 22.0)
        shape = np.diag(r.astype(float))
        cell = shape * (volume / np.prod(r)) ** (1 / 3)
        eps = rng.uniform(-0.04, 0.04, (3, 3))
        cell = cell @ (np.eye(3) + (eps + eps.T) / 2)
        pos = frac_all @ cell + rng.normal(scale=0.1, size=(natoms, 3))
        atoms = Atoms(numbers=z, positions=pos, cell=cell, pbc=True)
        atoms.calc = SinglePointCalculator(atoms, energy=float(-5.0 * natoms + rng.normal()),
                                           forces=rng.normal(size=(natoms, 3)), stress=rng.normal(scale=0.01, size=6))
        atoms.info["sid"] = f"omat-like-{seed}-{k}"
        out.append(atoms)
    return out


def write_omat_like_lmdb(path: str | Path, n: int, seed: int = 0, **kwargs) -> Path:
    """Write :func:`omat_like_atoms` to an ASE-LMDB file (``.aselmdb``, as OMat24 ships), atomically."""
    import ase.db

    from ..atomic import atomic_path

    path = Path(path)
    with atomic_path(path, suffix=".aselmdb") as tmp:
        tmp.unlink()  # the LMDB backend creates its own file
        db = ase.db.connect(str(tmp), type="aselmdb")
        with db:
            for atoms in omat_like_atoms(n, seed, **kwargs):
                db.write(atoms, sid=atoms.info["sid"])
        if hasattr(db, "close"):  # the LMDB backend holds the file open until closed
            db.close()
    return path


__all__ = ["emt_structures", "write_emt_dataset", "EMT_ELEMENTS", "omat_like_atoms", "write_omat_like_lmdb"]
