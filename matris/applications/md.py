"""The official molecular dynamics driver (``matris.applications.MolecularDynamics``): ASE's
integrators driving :class:`matris.applications.base.MatRISCalculator`."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from ase import Atoms, units
from ase.io.trajectory import TrajectoryWriter

from ..model import MatRIS
from .base import MatRISCalculator

ENSEMBLES = ("nve", "nvt", "npt")
THERMOSTATS = ("nose-hoover", "berendsen", "berendsen_inhomogeneous", "npt_berendsen")


class MolecularDynamics:
    """Molecular dynamics with ASE's integrators and a MatRIS calculator (the official class).

    Args:
        atoms: ASE ``Atoms`` (integrated in place) or a pymatgen ``Structure``/``Molecule``.
        model: a model name, checkpoint path or :class:`matris.MatRIS` (``calculator=`` takes a
            ready calculator instead).
        ensemble: "nve" (velocity Verlet), "nvt" or "npt".
        thermostat: "Nose-Hoover" (ASE ``NPT``; NVT without ``bulk_modulus``), "Berendsen"
            (NVT: ``NVTBerendsen``; NPT: ``NPTBerendsen``) or "Berendsen_inhomogeneous" (NVT:
            ``NVTBerendsen``; NPT: ``Inhomogeneous_NPTBerendsen``); case-insensitive.
        temperature: K.
        starting_temperature: K, Maxwell–Boltzmann velocities at it (None: the atoms' own momenta).
        timestep: fs.
        pressure: GPa (1 atm by default).
        taut: thermostat coupling time, fs (default 100 time steps).
        taup: barostat coupling time, fs (default 1000 time steps).
        bulk_modulus: GPa, needed for NPT.
        trajectory: ASE's dynamics output: the trajectory file (or None).
        logfile: ASE's dynamics log file (or None).
        loginterval: steps between trajectory frames and log lines.
        append_trajectory: append to an existing trajectory instead of replacing it.
        task: for the calculator ("ef", "efs" or "efsm"; MD needs the forces).
        device: for the calculator (None: CUDA if available, else the CPU).
        mode: for the calculator: "fast" (fused kernels) or "torch" (the references).
        activation_checkpoint: for the calculator (memory level; see its docs).
        tf32: for the calculator (TF32 matmuls on a GPU).
    """

    def __init__(self, atoms: Any, model: str | os.PathLike | MatRIS = "matris_10m_oam", ensemble: str = "nvt",
                 thermostat: str = "Berendsen_inhomogeneous", temperature: float = 300,
                 starting_temperature: float | None = None, timestep: float = 2.0, pressure: float = 1.01325e-4,
                 taut: float | None = None, taup: float | None = None, bulk_modulus: float | None = None,
                 trajectory: Any = None, logfile: str | None = None, loginterval: int = 1,
                 append_trajectory: bool = False, task: str = "efs", device: str | None = None, mode: str = "fast",
                 activation_checkpoint: bool = False, tf32: bool = False, *,
                 calculator: MatRISCalculator | None = None) -> None:
        from ase.md.npt import NPT
        from ase.md.nptberendsen import Inhomogeneous_NPTBerendsen, NPTBerendsen
        from ase.md.nvtberendsen import NVTBerendsen
        from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary
        from ase.md.verlet import VelocityVerlet

        self.ensemble = ensemble = ensemble.lower()
        self.thermostat = thermostat = thermostat.lower()
        if ensemble not in ENSEMBLES:
            raise ValueError("ensemble must be 'nve', 'nvt', or 'npt'")
        if ensemble != "nve" and thermostat not in THERMOSTATS:
            raise ValueError("thermostat must be 'Nose-Hoover', 'Berendsen', or 'Berendsen_inhomogeneous'")
        if ensemble == "npt" and (bulk_modulus is None or bulk_modulus <= 0):
            raise ValueError("NPT requires a positive bulk_modulus in GPa")
        if not isinstance(atoms, Atoms):
            from ..extras import require

            atoms = require("pymatgen.io.ase", "discovery", "MolecularDynamics of a pymatgen structure",
                            package="pymatgen").AseAtomsAdaptor.get_atoms(atoms)
        if starting_temperature is not None:
            MaxwellBoltzmannDistribution(atoms, temperature_K=starting_temperature, force_temp=True)
            Stationary(atoms)
        self.atoms = atoms
        self.atoms.calc = calculator if calculator is not None else MatRISCalculator(
            model=model, task=task, device=device, mode=mode, activation_checkpoint=activation_checkpoint, tf32=tf32)
        taut = 100 * timestep if taut is None else taut
        taup = 1000 * timestep if taup is None else taup
        kwargs: dict[str, Any] = {"atoms": atoms, "timestep": timestep * units.fs, "trajectory": trajectory,
                                  "logfile": logfile, "loginterval": loginterval,
                                  "append_trajectory": append_trajectory}
        if ensemble == "nve":
            integrator: type = VelocityVerlet
        elif thermostat == "nose-hoover":
            self.upper_triangular_cell()  # ASE's NPT needs an upper-triangular cell
            integrator = NPT
            pfactor = bulk_modulus * units.GPa * (taup * units.fs) ** 2 if ensemble == "npt" else None
            kwargs.update(temperature_K=temperature, externalstress=pressure * units.GPa, ttime=taut * units.fs,
                          pfactor=pfactor)
        elif ensemble == "nvt":
            integrator = NVTBerendsen
            kwargs.update(temperature_K=temperature, taut=taut * units.fs)
        else:
            integrator = Inhomogeneous_NPTBerendsen if thermostat == "berendsen_inhomogeneous" else NPTBerendsen
            kwargs.update(temperature_K=temperature, pressure_au=pressure * units.GPa, taut=taut * units.fs,
                          taup=taup * units.fs, compressibility_au=1 / (bulk_modulus * units.GPa))
        self._dynamics_kwargs = kwargs
        self.dyn = integrator(**kwargs)
        if ensemble == "npt":
            self.bulk_modulus = bulk_modulus
        self.trajectory = trajectory
        self.logfile = logfile
        self.loginterval = loginterval
        self.timestep = timestep

    def run(self, steps: int) -> None:
        """Integrate ``steps`` steps."""
        self.dyn.run(steps)

    def set_atoms(self, atoms: Atoms) -> None:
        """Go on with new ``atoms``: the calculator and outputs are kept (trajectories appended),
        the integrator and its step count start again; observers attached to the old ``dyn``
        must be attached to the new one."""
        calculator = self.atoms.calc
        self.dyn.close()
        self.atoms = atoms
        atoms.calc = calculator
        if self.thermostat == "nose-hoover" and self.ensemble != "nve":
            self.upper_triangular_cell()
        self._dynamics_kwargs.update(atoms=atoms, append_trajectory=True)
        if isinstance(self.trajectory, TrajectoryWriter):
            self.trajectory.atoms = atoms
        self.dyn = type(self.dyn)(**self._dynamics_kwargs)

    def upper_triangular_cell(self, verbose: bool = False) -> None:
        """Rotate cell, positions and momenta to ASE ``NPT``'s upper-triangular form (no-op if it is)."""
        cell = self.atoms.cell
        if np.array_equal(cell, np.triu(cell)):
            return
        upper, rotation = cell.standard_form("upper")
        momenta = self.atoms.get_momenta() @ rotation.T
        self.atoms.set_cell(upper, scale_atoms=True)
        self.atoms.set_momenta(momenta, apply_constraint=False)
        if verbose:
            print("Transformed to upper triangular unit cell.", flush=True)


__all__ = ["MolecularDynamics"]
