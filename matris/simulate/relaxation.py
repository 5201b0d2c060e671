"""Structure relaxation with ASE optimizers: positions, and the cell through a cell filter.

The defaults are the Matbench-Discovery protocol: FIRE on a ``FrechetCellFilter``, converged
when every force (and the filter's cell force) is below 0.05 eV/Å, at most 500 steps.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..errors import MatRISInputError, MatRISInputWarning
from ..structures import like_input
from .inputs import ModelLike, check_positive, prepare, require_periodic
from .trajectory import snapshot, write_frames

# A cell relaxation of a real crystal from a sensible start moves the volume by percents; one that
# grows or shrinks it by more than this factor started from a wrong cell (units, scaling, a
# phase far from zero pressure), whatever "converged" says.
VOLUME_FACTOR = 1.5
OPTIMIZERS = ("FIRE", "BFGS", "LBFGS", "BFGSLineSearch", "LBFGSLineSearch", "MDMin")
CELL_FILTERS = ("FrechetCellFilter", "ExpCellFilter", "UnitCellFilter", "StrainFilter")


@dataclass
class RelaxResult:
    """A relaxed structure.

    structure: the final structure, the same kind of object as the input (Atoms or pymatgen).
    atoms: the final structure as ASE Atoms (with the final energy, forces and stress stored).
    energy: eV; energy_per_atom: eV/atom. forces: ``[N, 3]`` eV/Å. stress: ``[3, 3]`` GPa,
    positive = tensile (None without a 3-D cell). fmax: eV/Å, the largest force the optimizer
    saw (the cell filter's cell forces included). steps: optimizer steps taken.
    trajectory: every step as Atoms with its energy and forces (``steps + 1`` frames).
    warnings: what looks wrong about the result (a volume changed by more than
    :data:`VOLUME_FACTOR`), each also issued as a :class:`~matris.errors.MatRISInputWarning`.
    """

    structure: Any
    atoms: Any
    energy: float
    energy_per_atom: float
    forces: np.ndarray
    stress: np.ndarray | None
    fmax: float
    steps: int
    converged: bool
    trajectory: list = field(default_factory=list, repr=False)
    warnings: list[str] = field(default_factory=list)

    @property
    def energies(self) -> np.ndarray:
        """``[steps + 1]`` energy of every frame, eV."""
        return np.array([f.get_potential_energy() for f in self.trajectory])

    def to_dict(self) -> dict:
        """JSON-ready summary (no trajectory)."""
        a = self.atoms
        return {
            "name": a.info.get("name", a.get_chemical_formula()), "formula": a.get_chemical_formula(),
            "natoms": len(a), "energy_eV": self.energy, "energy_per_atom_eV": self.energy_per_atom,
            "fmax_eV_per_A": self.fmax, "steps": self.steps, "converged": self.converged,
            "volume_A3": float(a.get_volume()) if a.pbc.all() else None,
            "cell_A": np.asarray(a.cell).tolist(),
            "stress_GPa": None if self.stress is None else self.stress.tolist(),
            **({"warnings": list(self.warnings)} if self.warnings else {}),
        }


def volume_warnings(start, end, index: int | None = None) -> list[str]:
    """``[message]`` if the cell volume of ``end`` (ASE Atoms, after a relaxation) is more than
    :data:`VOLUME_FACTOR` times, or less than 1/VOLUME_FACTOR of, that of ``start``, naming both
    volumes (Å³); else ``[]``. Each message is also warned (:class:`MatRISInputWarning`)."""
    if not (start.pbc.all() and end.pbc.all()):
        return []
    v0, v1 = float(start.get_volume()), float(end.get_volume())
    if v0 <= 0 or 1 / VOLUME_FACTOR <= v1 / v0 <= VOLUME_FACTOR:
        return []
    name = start.info.get("name") or start.get_chemical_formula()
    who = f"structure {index} ({name})" if index is not None else f"structure ({name})"
    message = (f"{who}: the relaxation changed the volume by {100 * (v1 / v0 - 1):+.0f} %, from {v0:.4g} Å³ to "
               f"{v1:.4g} Å³ ({v0 / len(start):.4g} to {v1 / len(end):.4g} Å³ per atom), more than a factor of "
               f"{VOLUME_FACTOR}: the starting cell was probably wrong (units, scaling, or a structure far from "
               "this pressure), so check it even if the relaxation converged")
    warnings.warn(message, MatRISInputWarning, stacklevel=3)
    return [message]


def check_pressure(pressure: float, relax_cell: bool, cell_filter: str | None = None) -> None:
    """An external pressure acts only through the cell: refuse one that would be ignored."""
    if not isinstance(pressure, (int, float)) or not np.isfinite(pressure):
        raise MatRISInputError(f"pressure must be a finite number (GPa), got {pressure!r}")
    if pressure == 0:
        return
    if not relax_cell:
        raise MatRISInputError(
            f"pressure={pressure} GPa needs a cell relaxation, but relax_cell=False (--fixed-cell) keeps the cell "
            "fixed, so the pressure would have no effect; drop the pressure or relax the cell")
    if cell_filter == "StrainFilter":
        raise MatRISInputError(f"pressure={pressure} GPa: ASE's StrainFilter takes no pressure; use "
                               "FrechetCellFilter, ExpCellFilter or UnitCellFilter, or drop the pressure")


def relax(
    structure: Any,
    fmax: float = 0.05,
    steps: int = 500,
    optimizer: str = "FIRE",
    cell_filter: str = "FrechetCellFilter",
    relax_cell: bool = True,
    pressure: float = 0.0,
    model: ModelLike = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    trajectory: str | os.PathLike | None = None,
    logfile: str | None = None,
    callback: Callable[[Any, int], None] | None = None,
) -> RelaxResult:
    """Relax ``structure`` (ASE Atoms or pymatgen Structure/Molecule) with MatRIS.

    Args:
        fmax: convergence threshold on the largest force, eV/Å (cell forces included).
        steps: most optimizer steps.
        optimizer: an ASE optimizer name, one of :data:`OPTIMIZERS`.
        cell_filter: an ASE cell filter, one of :data:`CELL_FILTERS` (used when ``relax_cell``).
        relax_cell: relax the cell as well as the positions (needs a 3-D periodic cell).
        pressure: external pressure for the cell relaxation, GPa; with ``relax_cell=False``
            (or the StrainFilter) a nonzero pressure is an error, since it would have no effect.
        model: a :class:`MatRIS`, a :class:`MatRISCalculator`, a checkpoint path, or None
            for the bundled model. device ("cpu", "cuda", "auto") and dtype ("float32",
            "float64"): default to a :class:`MatRIS`'s own, else "auto" and float32.
        trajectory: also write every step to this file (.extxyz or .traj), atomically.
        logfile: ASE optimizer log ("-" for stdout; None for none).
        callback: called as ``callback(atoms, step)`` after every step.
    """
    from ase import filters, optimize, units

    check_positive(fmax=fmax)
    if not isinstance(steps, int) or steps < 0:
        raise MatRISInputError(f"steps must be a non-negative integer, got {steps!r}")
    if optimizer not in OPTIMIZERS:
        raise MatRISInputError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    if relax_cell and cell_filter not in CELL_FILTERS:
        raise MatRISInputError(f"unknown cell filter {cell_filter!r}; choose one of {', '.join(CELL_FILTERS)}")
    check_pressure(pressure, relax_cell, cell_filter)
    atoms = prepare(structure, model, device, dtype, compute_stress=relax_cell)
    if relax_cell:
        require_periodic(atoms, "relaxing the cell", "pass relax_cell=False (--fixed-cell) to relax positions only")
        kwargs = {} if cell_filter == "StrainFilter" else {"scalar_pressure": pressure * units.GPa}
        target = _memoised_forces(getattr(filters, cell_filter)(atoms, **kwargs))
    else:
        target = atoms
    start = atoms.copy()  # the geometry only: for the volume check at the end
    opt = getattr(optimize, optimizer)(target, logfile=logfile)
    frames: list = []

    def record():
        frames.append(snapshot(atoms, relax_step=len(frames)))
        if callback is not None:
            callback(atoms, len(frames) - 1)

    opt.attach(record, interval=1)
    converged = bool(opt.run(fmax=fmax, steps=steps))
    final_fmax = float(np.linalg.norm(target.get_forces(), axis=1).max())
    if trajectory is not None:
        write_frames(trajectory, frames)
    final = snapshot(atoms)
    final.info.pop("relax_step", None)
    energy = float(atoms.get_potential_energy())
    stress = None
    if atoms.pbc.all():
        stress = atoms.get_stress(voigt=False) / units.GPa
    return RelaxResult(
        structure=like_input(final, structure), atoms=final, energy=energy, energy_per_atom=energy / len(atoms),
        forces=atoms.get_forces().copy(), stress=stress, fmax=final_fmax, steps=int(opt.nsteps),
        converged=converged, trajectory=frames, warnings=volume_warnings(start, final) if relax_cell else [],
    )



def _memoised_forces(target):
    """``target.get_forces`` computed once per configuration.

    ASE's cell filters recompute their cell forces on every call (FrechetCellFilter: nine
    matrix-exponential derivatives with scipy), and an ASE optimizer asks about three times
    per step for the same positions and cell. Same steps and numbers, less time (5% on Si8
    on a quiet CPU; much more when scipy competes with other processes for the cores).
    """
    compute = target.get_forces
    memo: dict = {}

    def get_forces(*args, **kwargs):
        key = (target.atoms.positions.tobytes(), np.asarray(target.atoms.cell).tobytes(), args,
               tuple(sorted(kwargs.items())))
        if memo.get("key") != key:
            memo["key"], memo["forces"] = key, compute(*args, **kwargs)
        return memo["forces"].copy()

    target.get_forces = get_forces
    return target
