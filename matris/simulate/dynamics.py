"""Molecular dynamics with ASE integrators: NVE, NVT (Langevin, Nosé–Hoover chain, Bussi) and
NPT (Martyna–Tobias–Klein, full cell).

A run with a trajectory file also keeps a restart file beside it (``<trajectory>.restart.json``):
the step, positions, momenta, cell and the thermostat's own state (its random generator, chain
variables, cell momenta), rewritten atomically with every logged frame. Running the same call
(or command) again continues from there: the trajectory is cut back to the restart point and
the remaining steps are run, so ``steps`` is the total length of the run, not an increment.
Without a restart file the run continues from the last frame of the trajectory (positions and
momenta; a thermostat's internal state then starts afresh).

Reruns follow :mod:`matris.rerun`: a run already at ``steps`` is returned as it is (``loaded``
set, the speed of the run that made it) with a one-line notice; ``overwrite=True``
(``--overwrite``) starts afresh.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..atomic import write_json
from ..errors import MatRISInputError
from ..rerun import notice, overwrite, spell
from ..structures import like_input
from .inputs import ModelLike, check_positive, prepare, require_periodic
from .progress import Progress
from .trajectory import append_frame, read_frames, snapshot, trajectory_format, truncate

ENSEMBLES = ("nve", "nvt", "npt")
THERMOSTATS = ("langevin", "nose-hoover", "bussi")
RESTART_VERSION = 1
LOG_KEYS = ("step", "time_ps", "potential_energy", "kinetic_energy", "total_energy", "temperature")


@dataclass
class MDResult:
    """The end of an MD run and its log.

    structure: final structure, the same kind as the input; atoms: final ASE Atoms (momenta
    included). steps: steps done in total (earlier segments included); time_ps: simulated time.
    log: one dict per logged frame with ``step``, ``time_ps``, ``potential_energy``,
    ``kinetic_energy`` and ``total_energy`` (eV), ``temperature`` (K), and under NPT
    ``volume`` (Å³) and ``pressure`` (GPa). steps_per_s and ns_per_day: speed of this segment;
    for a run found finished, the speed of the segment that finished it (NaN if unknown).
    resumed_from: the step this call started at (0 for a fresh run).
    loaded: True when the run was already finished and this call only read it back.
    """

    structure: Any
    atoms: Any
    steps: int
    timestep_fs: float
    log: list[dict] = field(repr=False)
    trajectory: Path | None
    restart: Path | None
    resumed_from: int
    steps_per_s: float
    ns_per_day: float
    loaded: bool = False

    @property
    def time_ps(self) -> float:
        return self.steps * self.timestep_fs / 1000

    def column(self, key: str) -> np.ndarray:
        """One logged quantity over the frames, e.g. ``column("temperature")``."""
        return np.array([row[key] for row in self.log])

    def to_dict(self) -> dict:
        return {
            "steps": self.steps, "time_ps": self.time_ps, "timestep_fs": self.timestep_fs,
            "resumed_from": self.resumed_from, "loaded": self.loaded,
            "steps_per_s": _number(self.steps_per_s), "ns_per_day": _number(self.ns_per_day),
            "trajectory": None if self.trajectory is None else str(self.trajectory),
            "restart": None if self.restart is None else str(self.restart),
            "final": self.log[-1] if self.log else None,
            "mean_temperature_K": float(self.column("temperature").mean()) if self.log else None,
        }


def _number(value: float) -> float | None:
    return None if value != value else value  # NaN (unknown) as JSON null


def check_pressure(pressure: float, ensemble: str) -> None:
    """Only a barostat applies a pressure: refuse one that the ensemble would ignore."""
    if pressure != 0 and ensemble != "npt":
        raise MatRISInputError(f"pressure={pressure} GPa has no effect in the {str(ensemble).upper()} ensemble (its "
                               "cell is fixed); use ensemble='npt' (--ensemble npt) or drop the pressure")


def md(
    structure: Any,
    ensemble: str = "nve",
    temperature: float = 300.0,
    pressure: float = 0.0,
    timestep: float = 1.0,
    steps: int = 1000,
    thermostat: str = "langevin",
    friction: float = 0.01,
    tdamp: float = 100.0,
    pdamp: float = 1000.0,
    trajectory: str | os.PathLike | None = None,
    loginterval: int = 10,
    restart: str | os.PathLike | None = None,
    overwrite: bool = False,
    resume: bool = True,
    init_temperature: float | None = None,
    seed: int = 0,
    model: ModelLike = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    progress: bool | Progress = False,
    callback: Callable[[Any, int], None] | None = None,
) -> MDResult:
    """Run molecular dynamics of ``structure`` (ASE Atoms or pymatgen) with MatRIS.

    Args:
        ensemble: "nve", "nvt" or "npt".
        temperature: K; the thermostat target (NVT, NPT) and, for a structure without momenta,
            the Maxwell–Boltzmann temperature of the initial velocities (also under NVE).
        pressure: GPa, the NPT target (a nonzero pressure in another ensemble is an error).
        timestep: fs. steps: total number of steps of the run (a resumed run does the rest).
        thermostat: NVT only: "langevin", "nose-hoover" (chain of 3) or "bussi".
        friction: Langevin friction, 1/fs. tdamp: Nosé–Hoover/Bussi/NPT thermostat time, fs.
        pdamp: NPT barostat time, fs.
        trajectory: write a frame every ``loginterval`` steps to this .extxyz or .traj file.
        restart: restart file (default: ``<trajectory>.restart.json`` when there is a trajectory).
        overwrite: start afresh, replacing an existing trajectory and restart file (only
            those two files). Without it a run continues from them, and a run already at
            ``steps`` is returned as it is (``loaded``), with a one-line notice on stderr.
        resume: the older name: ``resume=False`` is ``overwrite=True``.
        init_temperature: K, initial velocities when the structure has none (default: temperature).
        seed: seeds the initial velocities and the stochastic thermostats.
        model: as in :func:`matris.simulate.relax`.
        device: as in :func:`matris.simulate.relax`.
        dtype: as in :func:`matris.simulate.relax`.
        progress: print live progress (steps/s, ns/day, T, E) to stderr, or a :class:`Progress`.
        callback: called as ``callback(atoms, step)`` after every step (and at step 0 of a fresh run).
    """
    from ase import units

    _check_arguments(ensemble, thermostat, timestep, steps, loginterval, temperature, friction, tdamp, pdamp)
    check_pressure(pressure, ensemble)
    atoms = prepare(structure, model, device, dtype, compute_stress=ensemble == "npt")
    if ensemble == "npt":
        require_periodic(atoms, "NPT dynamics", "use ensemble='nvt' for slabs, wires and molecules")
    if trajectory is not None:
        trajectory = Path(trajectory)
        trajectory_format(trajectory)  # fail early on an unknown extension
    restart = Path(restart) if restart is not None else (
        trajectory.with_name(trajectory.name + ".restart.json") if trajectory is not None else None)
    settings = {"ensemble": ensemble, "thermostat": thermostat if ensemble == "nvt" else None,
                "timestep_fs": float(timestep), "temperature_K": float(temperature),
                "pressure_GPa": float(pressure) if ensemble == "npt" else None}

    resume = resume and not overwrite
    start, dynamics_state, history, speed = 0, None, [], None
    if resume and restart is not None and restart.exists():
        data = _read_restart(restart, atoms, settings)
        atoms.set_cell(data["cell"])
        atoms.set_positions(data["positions"])
        atoms.set_momenta(data["momenta"])
        start, dynamics_state, speed = int(data["step"]), data["dynamics"], data.get("speed")
        if trajectory is not None:
            history = truncate(trajectory, lambda f: f.info.get("md_step", 0) <= start)
        _say_resumed(restart, start, steps)
    elif resume and trajectory is not None and read_frames(trajectory):
        last = _check_frame(trajectory, read_frames(trajectory)[-1], atoms)
        atoms.set_cell(last.cell)
        atoms.set_positions(last.positions)
        atoms.set_momenta(last.get_momenta())
        start = int(last.info["md_step"])
        history = truncate(trajectory, lambda f: f.info.get("md_step", 0) <= start)
        warnings.warn(f"{trajectory}: no restart file; continuing from its last frame (step {start}); the "
                      "thermostat's internal state starts afresh", stacklevel=2)
        _say_resumed(trajectory, start, steps)
    else:
        for path in (trajectory, restart):
            if path is not None:
                Path(path).unlink(missing_ok=True)
    if start == 0 and not np.any(atoms.get_momenta()):
        thermalize(atoms, init_temperature if init_temperature is not None else temperature,
                   np.random.default_rng(seed))

    rng = np.random.default_rng(seed + start)
    dyn = _dynamics(atoms, ensemble, thermostat, timestep * units.fs, temperature, pressure * units.GPa,
                    friction / units.fs, tdamp * units.fs, pdamp * units.fs, rng)
    if dynamics_state:
        _set_dynamics_state(dyn, dynamics_state)
    log = [_row_of_frame(f) for f in history]
    if start >= steps and start > 0:  # finished before: read back, not run (and not timed as 0 steps/s)
        # the trajectory's frame of the last step carries its energy and forces; the restart file has none
        if history and int(history[-1].info.get("md_step", -1)) == start:
            atoms.calc = history[-1].calc
        final = snapshot(atoms)
        speed = speed or {}
        return MDResult(structure=like_input(final, structure), atoms=final, steps=start, timestep_fs=float(timestep),
                        log=log, trajectory=trajectory, restart=restart, resumed_from=start,
                        steps_per_s=float(speed.get("steps_per_s", float("nan"))),
                        ns_per_day=float(speed.get("ns_per_day", float("nan"))), loaded=True)
    meter = progress if isinstance(progress, Progress) else Progress(steps, timestep, start=start)

    def observe():
        step = start + dyn.nsteps
        if step == start and start > 0:  # that frame was written by the previous segment
            return
        if callback is not None:
            callback(atoms, step)
        temperature_now = atoms.get_temperature()
        epot = atoms.get_potential_energy()
        if progress:
            meter.update(step, temperature_now, epot + atoms.get_kinetic_energy(), force=step == steps)
        if step % loginterval and step != steps:
            return
        row = _row(atoms, step, timestep, ensemble)
        log.append(row)
        rates[:] = meter.rates(step)  # at the last frame: the result's speed, and the one a rerun reads back
        if trajectory is not None:
            append_frame(trajectory, snapshot(atoms, md_step=step, time_ps=row["time_ps"],
                                              temperature_K=row["temperature"]))
        if restart is not None:
            _write_restart(restart, atoms, step, settings, _dynamics_state(dyn),
                           {"steps_per_s": rates[0], "ns_per_day": rates[1]})

    rates: list[float] = []
    dyn.attach(observe, interval=1)
    if steps > start:
        dyn.run(steps - start)
    if progress and not isinstance(progress, Progress):
        meter.close()
    steps_per_s, ns_day = rates if rates else meter.rates(max(steps, start))
    final = snapshot(atoms)
    return MDResult(structure=like_input(final, structure), atoms=final, steps=max(steps, start),
                    timestep_fs=float(timestep), log=log, trajectory=trajectory, restart=restart,
                    resumed_from=start, steps_per_s=steps_per_s, ns_per_day=ns_day)


# ---------------------------------------------------------------------------- integrators
def thermalize(atoms, temperature: float, rng: np.random.Generator) -> None:
    """Maxwell–Boltzmann momenta at ``temperature`` K with zero total momentum."""
    from ase.md import velocitydistribution as vd

    if hasattr(vd, "thermalize_momenta"):  # ASE ≥ 3.29
        vd.thermalize_momenta(atoms, temperature_K=temperature, rng=rng)
    else:
        vd.MaxwellBoltzmannDistribution(atoms, temperature_K=temperature, rng=rng)
    vd.Stationary(atoms)


def _dynamics(atoms, ensemble, thermostat, dt, temperature, pressure_au, friction, tdamp, pdamp, rng):
    """The ASE integrator (all times in ASE units)."""
    if ensemble == "nve":
        from ase.md.verlet import VelocityVerlet

        return VelocityVerlet(atoms, timestep=dt)
    if ensemble == "npt":
        from ase.md.nose_hoover_chain import MTKNPT

        return MTKNPT(atoms, timestep=dt, temperature_K=temperature, pressure_au=pressure_au, tdamp=tdamp,
                      pdamp=pdamp)
    if thermostat == "langevin":
        from ase.md.langevin import Langevin

        # fixcm=False: ASE's fixcm=True does not sample NVT exactly (deprecated in ASE 3.28)
        return Langevin(atoms, timestep=dt, temperature_K=temperature, friction=friction, fixcm=False, rng=rng)
    if thermostat == "bussi":
        from ase.md.bussi import Bussi

        return Bussi(atoms, timestep=dt, temperature_K=temperature, taut=tdamp, rng=rng)
    from ase.md.nose_hoover_chain import NoseHooverChainNVT

    return NoseHooverChainNVT(atoms, timestep=dt, temperature_K=temperature, tdamp=tdamp)


def _dynamics_state(dyn) -> dict:
    """What an integrator keeps besides positions, momenta and cell (JSON-ready)."""
    state: dict[str, Any] = {}
    rng = getattr(dyn, "rng", None)
    if isinstance(rng, np.random.Generator):
        state["rng"] = rng.bit_generator.state
    if hasattr(dyn, "transferred_energy"):
        state["transferred_energy"] = float(dyn.transferred_energy)
    for owner, names in (("_thermostat", ("_eta", "_p_eta")), ("_barostat", ("_xi", "_p_xi"))):
        obj = getattr(dyn, owner, None)
        if obj is not None:
            state[owner] = {n: np.asarray(getattr(obj, n)).tolist() for n in names}
    if hasattr(dyn, "_p_g"):
        state["_p_g"] = np.asarray(dyn._p_g).tolist()
    return state


def _set_dynamics_state(dyn, state: dict) -> None:
    if "rng" in state and isinstance(getattr(dyn, "rng", None), np.random.Generator):
        dyn.rng.bit_generator.state = state["rng"]
    if "transferred_energy" in state:
        dyn.transferred_energy = state["transferred_energy"]
    for owner in ("_thermostat", "_barostat"):
        if owner in state and getattr(dyn, owner, None) is not None:
            for name, value in state[owner].items():
                setattr(getattr(dyn, owner), name, np.array(value, dtype=float))
    if "_p_g" in state and hasattr(dyn, "_p_g"):
        dyn._p_g = np.array(state["_p_g"], dtype=float)


# ---------------------------------------------------------------------------- log and restart
def _row(atoms, step: int, timestep: float, ensemble: str) -> dict:
    from ase import units

    epot, ekin = float(atoms.get_potential_energy()), float(atoms.get_kinetic_energy())
    row = {"step": int(step), "time_ps": step * timestep / 1000, "potential_energy": epot, "kinetic_energy": ekin,
           "total_energy": epot + ekin, "temperature": float(atoms.get_temperature())}
    if ensemble == "npt":
        row["volume"] = float(atoms.get_volume())
        row["pressure"] = float(-np.trace(atoms.get_stress(voigt=False)) / 3 / units.GPa)
    return row


def _row_of_frame(frame) -> dict:
    epot = float(frame.get_potential_energy())
    ekin = float(frame.get_kinetic_energy())
    return {"step": int(frame.info["md_step"]), "time_ps": float(frame.info["time_ps"]), "potential_energy": epot,
            "kinetic_energy": ekin, "total_energy": epot + ekin, "temperature": float(frame.get_temperature())}


def _say_resumed(path: Path, start: int, steps: int) -> None:
    """The rerun rule's one line (:mod:`matris.rerun`): finished, or resumed."""
    if start >= steps:
        asked = spell(f"--steps {steps}", f"steps={steps}")
        notice(f"md: {path} holds a finished run (step {start}, {asked}): returning it as it is, not run "
               f"again; raise {spell('--steps', 'steps')} to continue it, or pass {overwrite()} or another "
               f"{spell('--trajectory', 'trajectory')} to start afresh")
    elif start > 0:
        notice(f"md: resuming the run in {path} at step {start} of {steps} ({overwrite()} starts afresh)")


def _write_restart(path: Path, atoms, step: int, settings: dict, dynamics: dict, speed: dict | None = None) -> None:
    data = {"version": RESTART_VERSION, "step": int(step), **settings,
            "numbers": atoms.numbers.tolist(), "pbc": atoms.pbc.tolist(), "cell": np.asarray(atoms.cell).tolist(),
            "positions": atoms.positions.tolist(), "momenta": atoms.get_momenta().tolist(), "dynamics": dynamics,
            "speed": speed}
    write_json(path, data, indent=None)


def _read_restart(path: Path, atoms, settings: dict) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MatRISInputError(f"cannot read the restart file {path} ({exc}); delete it to start afresh") from exc
    if data.get("version") != RESTART_VERSION or data.get("numbers") != atoms.numbers.tolist():
        raise MatRISInputError(
            f"the restart file {path} belongs to another structure; delete it (and its trajectory) or pass "
            f"{overwrite()} to start afresh"
        )
    changed = {k: (data.get(k), v) for k, v in settings.items() if data.get(k) != v}
    if changed:
        what = ", ".join(f"{k} {old!r} → {new!r}" for k, (old, new) in changed.items())
        raise MatRISInputError(
            f"the restart file {path} was written with other settings ({what}); rerun with the original settings, "
            f"or pass {overwrite()} to start afresh"
        )
    return data


def _check_frame(path, frame, atoms):
    if frame.numbers.tolist() != atoms.numbers.tolist() or "md_step" not in frame.info:
        raise MatRISInputError(
            f"the trajectory {path} was not written by an MD run of this structure; choose another trajectory file "
            f"or pass {overwrite()} to overwrite it"
        )
    return frame


def _check_arguments(ensemble, thermostat, timestep, steps, loginterval, temperature, friction, tdamp, pdamp):
    if ensemble not in ENSEMBLES:
        raise MatRISInputError(f"unknown ensemble {ensemble!r}; choose one of {', '.join(ENSEMBLES)}")
    if ensemble == "nvt" and thermostat not in THERMOSTATS:
        raise MatRISInputError(f"unknown thermostat {thermostat!r}; choose one of {', '.join(THERMOSTATS)}")
    check_positive(timestep=timestep, friction=friction, tdamp=tdamp, pdamp=pdamp)
    if ensemble != "nve":
        check_positive(temperature=temperature)
    if not isinstance(steps, int) or steps < 0:
        raise MatRISInputError(f"steps must be a non-negative integer, got {steps!r}")
    if not isinstance(loginterval, int) or loginterval < 1:
        raise MatRISInputError(f"loginterval must be a positive integer, got {loginterval!r}")
    if timestep > 10:
        raise MatRISInputError(f"timestep is in fs; {timestep} fs is far too long for atomistic MD (use 0.5–2 fs)")
