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


__all__ = ["emt_structures", "write_emt_dataset", "EMT_ELEMENTS"]
