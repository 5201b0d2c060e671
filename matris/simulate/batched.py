"""Many structures relaxed or run with MD together on one device, through torch-sim.

:class:`MatRISModel` is MatRIS behind torch-sim's model interface: a batched ``SimState`` in,
energies, forces and stresses of every structure out. :func:`relax_batch` relaxes a list of
structures with torch-sim's batched FIRE on a Fréchet cell filter (the batched twin of
:func:`matris.simulate.relax`), taking converged structures out of the batch as it goes;
:func:`md_batch` integrates NVE or Langevin NVT for all of them at once.

Works with torch-sim-atomistic 0.3.0 (the newest for Python 3.11) and with the later API
(``ts.Optimizer``/``ts.CellFilter``, ``*_init``/``*_step`` integrators), chosen at run time.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from ..extras import require

try:
    import torch_sim as ts
    from torch_sim.models.interface import ModelInterface
except ImportError:  # pragma: no cover - depends on the environment
    # torch-sim-atomistic >= 0.3.0 (Python >= 3.11): one line naming the sim extra when it is missing
    require("torch_sim", "sim", "batched simulation", package="torch-sim-atomistic")
    raise

from ..calculator import resolve_device, resolve_dtype
from ..devices import device_and_dtype
from ..errors import MatRISInputError
from ..graph import AtomicSystem, GraphBatch
from ..graph.batch import device_builder_available, device_builder_failed
from ..graph.system import MAX_Z, element_symbol, non_finite_error, non_finite_problem
from ..model import MatRIS
from ..model.model import EV_PER_A3_TO_GPA
from ..structures import like_input, to_atoms, to_system, warn_implausible
from .dynamics import thermalize
from .inputs import check_positive
from .progress import Progress
from .relaxation import RelaxResult, check_pressure, volume_warnings
from .trajectory import snapshot

NEW_API = hasattr(ts, "Optimizer")  # torch-sim ≥ 0.4: enums and *_init/*_step functions


class MatRISModel(ModelInterface):
    """MatRIS as a torch-sim model.

    ``forward(state)`` returns ``energy [S]`` eV, ``forces [N, 3]`` eV/Å and ``stress
    [S, 3, 3]`` eV/Å³ (positive = tensile, ASE's sign, as torch-sim expects) for a batched
    ``SimState`` of ``S`` structures and ``N`` atoms. Graphs are rebuilt from the positions on
    every call (neighbour lists on the CPU with vesin; the model runs on ``device``).

    Args:
        model: a :class:`MatRIS`, a checkpoint path, or None for the bundled model.
        device: "cpu", "cuda", "cuda:N" or "auto". dtype: "float32" or "float64". Both
            default to a :class:`MatRIS`'s own, else "auto" and float32.
        compute_stress: needed for cell relaxation and NPT; off saves time.
    """

    def __init__(self, model: MatRIS | str | None = None, device: str | torch.device | None = None,
                 dtype: str | torch.dtype | None = None, compute_stress: bool = True, compute_forces: bool = True):
        super().__init__()
        device, dtype = device_and_dtype(model, device, dtype)
        self._device = resolve_device(device)
        self._dtype = resolve_dtype(dtype)
        if isinstance(model, MatRIS):
            if model.dtype != self._dtype or model.device != self._device:
                model = copy.deepcopy(model)  # .to() is in place: leave the caller's model alone
            net = model.to(device=self._device, dtype=self._dtype)
        else:
            net = MatRIS.load(model, device=self._device, dtype=self._dtype)
        self.model = net.eval()
        self._compute_stress = compute_stress
        self._compute_forces = compute_forces
        self._compute_magmoms = False
        self.run_options = None  # RunOptions of this model's calls (None: the MatRIS model's own)
        self._memory_scales_with = "n_atoms_x_density"

    @property
    def compute_stress(self) -> bool:
        return self._compute_stress

    @compute_stress.setter
    def compute_stress(self, value: bool) -> None:
        self._compute_stress = bool(value)

    @property
    def compute_forces(self) -> bool:
        return self._compute_forces

    @compute_forces.setter
    def compute_forces(self, value: bool) -> None:
        self._compute_forces = bool(value)

    def graph(self, state) -> GraphBatch:
        """The :class:`GraphBatch` of a ``SimState`` (or a dict with the same keys). On a GPU it
        is built there from the state's tensors: positions never leave the device between steps."""
        get = state.get if isinstance(state, dict) else lambda k, d=None: getattr(state, k, d)
        check_finite_state(get("positions"), get("cell"), get("atomic_numbers"), get("system_idx"))
        if self._device.type != "cpu" and device_builder_available():
            try:
                return self._device_graph(get)
            except RuntimeError as exc:  # the host builds instead (said once)
                device_builder_failed(exc)
        positions = get("positions").detach().to("cpu", torch.float64).numpy()
        cell = get("cell").detach().to("cpu", torch.float64)
        rows = cell.transpose(-2, -1).numpy()  # torch-sim stores lattice vectors as columns
        numbers = get("atomic_numbers").detach().cpu().numpy()
        system_idx = get("system_idx")
        if system_idx is None:
            system_idx = torch.zeros(len(positions), dtype=torch.long)
        counts = torch.bincount(system_idx.detach().cpu(), minlength=rows.shape[0]).numpy()
        pbc = get("pbc")
        pbc = pbc.detach().cpu().numpy() if isinstance(pbc, torch.Tensor) else np.asarray(pbc)
        pbc = np.broadcast_to(pbc, (3,)) if pbc.ndim < 2 else pbc
        systems, start = [], 0
        for k, n in enumerate(counts):
            systems.append(AtomicSystem(positions[start:start + n], rows[k], pbc if pbc.ndim == 1 else pbc[k],
                                        numbers[start:start + n]))
            start += n
        return GraphBatch.from_systems(systems, self.model.cutoff, self.model.three_body_cutoff,
                                       dtype=self._dtype, device=self._device)

    def _device_graph(self, get) -> GraphBatch:
        positions = get("positions").detach().to(self._device)
        cell = get("cell").detach().to(self._device).transpose(-2, -1)  # torch-sim: lattice vectors as columns
        cell = cell.reshape(-1, 3, 3)
        system_idx = get("system_idx")
        if system_idx is None:
            system_idx = torch.zeros(positions.shape[0], dtype=torch.long, device=self._device)
        counts = torch.zeros(cell.shape[0], dtype=torch.long, device=self._device).index_add_(
            0, system_idx.to(self._device), torch.ones_like(system_idx, device=self._device))
        pbc = torch.as_tensor(get("pbc"), dtype=torch.bool, device=self._device)
        return GraphBatch.from_tensors(positions, cell, pbc, get("atomic_numbers"), counts, self.model.cutoff,
                                       self.model.three_body_cutoff, dtype=self._dtype)

    def forward(self, state, **kwargs: Any) -> dict[str, torch.Tensor]:
        out = self.model(self.graph(state), compute_forces=self._compute_forces,
                         compute_stress=self._compute_stress, compute_magmoms=self._compute_magmoms,
                         options=self.run_options)
        result = {"energy": out.energy.detach()}
        if self._compute_forces:
            result["forces"] = out.forces.detach()
        if self._compute_stress:  # GPa → eV/Å³; structures without a 3-D cell get zero stress
            result["stress"] = torch.nan_to_num(out.stress.detach() / EV_PER_A3_TO_GPA, nan=0.0)
        if self._compute_magmoms:
            result["magmoms"] = out.magmoms.detach()
        return result


def check_finite_state(positions: torch.Tensor, cell: torch.Tensor, atomic_numbers: torch.Tensor,
                       system_idx: torch.Tensor | None) -> None:
    """Raise :class:`MatRISInputError` if a position or a lattice vector of a torch-sim state is
    NaN or infinite, naming the structure, the first bad atom or lattice vector and its value:
    the message of :meth:`AtomicSystem.check_finite`, before any neighbour search (vesin fails
    on such input with an error of its own, which would also turn the device builder off).
    One reduction on the tensors' device and one host synchronisation; the details are looked
    up on the host only when something is wrong. ``cell``: ``[S, 3, 3]``, lattice vectors as
    columns (torch-sim's layout)."""
    positions, cell = positions.detach(), cell.detach()
    if bool(torch.isfinite(positions).all() & torch.isfinite(cell).all()):
        return
    from ase.formula import Formula

    pos = positions.to("cpu", torch.float64).numpy()
    rows = cell.to("cpu", torch.float64).reshape(-1, 3, 3).transpose(-2, -1).numpy()
    numbers = atomic_numbers.detach().cpu().numpy()
    index = np.zeros(len(pos), dtype=np.int64) if system_idx is None else system_idx.detach().cpu().numpy()
    for k in range(rows.shape[0]):
        mine = index == k
        problem = non_finite_problem(pos[mine], rows[k])
        if problem is not None:
            z = numbers[mine]
            name = Formula.from_list([element_symbol(int(n)) for n in z]).format("hill") if (
                len(z) and ((z >= 1) & (z <= MAX_Z)).all()) else ""
            raise non_finite_error(AtomicSystem(pos[mine], rows[k], True, z, name).label(k), problem)


def relax_batch(
    structures: Sequence[Any],
    fmax: float = 0.05,
    steps: int = 500,
    relax_cell: bool = True,
    pressure: float = 0.0,
    model: MatRIS | MatRISModel | str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_atoms: int | None = None,
    check_every: int = 5,
) -> list[RelaxResult]:
    """Relax many structures together with torch-sim's batched FIRE (Fréchet cell filter).

    The same protocol as :func:`matris.simulate.relax` with its defaults: converged when every
    atomic force and cell force is below ``fmax`` eV/Å, at most ``steps`` steps. Convergence is
    checked every ``check_every`` steps, and converged structures leave the batch (their
    places go to waiting ones when ``max_atoms`` limits the batch size).

    Args:
        max_atoms: most atoms on the device at once (None: all structures in one batch).

    Returns one :class:`RelaxResult` per structure, in input order. ``steps`` is None (torch-sim
    does not report per-structure step counts) and ``trajectory`` is empty. ``fmax`` is
    evaluated at the final structure: the largest atomic force, and with ``relax_cell`` the
    largest row of the cell force V·(σ + p)/N that a Fréchet filter starting there would see.
    """
    from ase import units

    check_positive(fmax=fmax)
    if not isinstance(steps, int) or steps < 1:
        raise MatRISInputError(f"steps must be a positive integer, got {steps!r}")
    check_pressure(pressure, relax_cell)
    items, atoms = _as_atoms(structures, need_cell=relax_cell, what="relaxing the cell")
    ts_model = model if isinstance(model, MatRISModel) else MatRISModel(model, device, dtype,
                                                                          compute_stress=relax_cell)
    for i, a in enumerate(atoms):
        warn_implausible(a, ts_model.model.cutoff, i)
    state = ts.io.atoms_to_state(atoms, ts_model.device, ts_model.dtype)
    autobatcher = False if max_atoms is None else ts.InFlightAutoBatcher(
        model=ts_model, memory_scales_with="n_atoms", max_memory_scaler=float(max_atoms))
    convergence = ts.generate_force_convergence_fn(force_tol=fmax, include_cell_forces=relax_cell)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*max.*steps.*")  # reported per structure below
        final = ts.optimize(state, ts_model, convergence_fn=convergence, max_steps=steps,
                            steps_between_swaps=check_every, autobatcher=autobatcher,
                            **_fire_arguments(relax_cell, pressure * units.GPa))
    relaxed = ts.io.state_to_atoms(final)
    predictions = ts_model.model.predict(relaxed, batch_size=max(1, len(relaxed)), warn_inputs=False)
    results = []
    for k, (item, start, end, pred) in enumerate(zip(items, atoms, relaxed, predictions)):
        end.info = dict(start.info)
        stress = pred.stress
        largest = float(np.linalg.norm(pred.forces, axis=1).max())
        if relax_cell:
            virial = -end.get_volume() * (stress * units.GPa + pressure * units.GPa * np.eye(3))
            largest = max(largest, float(np.linalg.norm(virial / len(end), axis=1).max()))
        frame = _with_results(end, pred)
        results.append(RelaxResult(
            structure=like_input(frame, item), atoms=frame, energy=pred.energy, energy_per_atom=pred.energy_per_atom,
            forces=pred.forces, stress=stress, fmax=largest, steps=None, converged=largest < fmax, trajectory=[],
            warnings=volume_warnings(start, end, k) if relax_cell else []))
    return results


@dataclass
class BatchMDResult:
    """The end of a batched MD run.

    structures / atoms: final structures (input kind / ASE Atoms with momenta). log: one dict
    per logged step with ``step``, ``time_ps`` and, per structure (lists of length S),
    ``temperature`` K, ``potential_energy``, ``kinetic_energy`` and ``total_energy`` eV.
    steps_per_s: integration steps per second of the whole batch; ns_per_day per structure.
    """

    structures: list
    atoms: list
    steps: int
    timestep_fs: float
    log: list[dict] = field(repr=False)
    steps_per_s: float
    ns_per_day: float

    def column(self, key: str) -> np.ndarray:
        """``[frames, S]`` (or ``[frames]`` for step/time_ps) of one logged quantity."""
        return np.array([row[key] for row in self.log])


def md_batch(
    structures: Sequence[Any],
    ensemble: str = "nvt",
    temperature: float = 300.0,
    timestep: float = 1.0,
    steps: int = 1000,
    friction: float = 0.01,
    loginterval: int = 10,
    seed: int = 0,
    model: MatRIS | MatRISModel | str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    progress: bool = False,
) -> BatchMDResult:
    """NVE or Langevin NVT of all ``structures`` at once (torch-sim integrators).

    temperature: K (thermostat target; initial Maxwell–Boltzmann velocities for structures
    without momenta). timestep: fs. friction: Langevin friction, 1/fs. Each structure keeps
    its own cell (no NPT here: use :func:`matris.simulate.md` per structure).
    """
    from ase import units

    if ensemble not in ("nve", "nvt"):
        raise MatRISInputError(f"md_batch runs 'nve' or 'nvt' (Langevin), got {ensemble!r}; "
                               "for NPT use matris.simulate.md on each structure")
    check_positive(timestep=timestep, friction=friction)
    if not isinstance(steps, int) or steps < 0 or not isinstance(loginterval, int) or loginterval < 1:
        raise MatRISInputError(f"steps must be ≥ 0 and loginterval ≥ 1 (integers), got {steps!r}, {loginterval!r}")
    items, atoms = _as_atoms(structures, need_cell=False, what="")
    rng = np.random.default_rng(seed)
    for a in atoms:
        if not np.any(a.get_momenta()):
            thermalize(a, temperature, rng)
    ts_model = model if isinstance(model, MatRISModel) else MatRISModel(model, device, dtype, compute_stress=False)
    for i, a in enumerate(atoms):
        warn_implausible(a, ts_model.model.cutoff, i)
    dev, dt_ = ts_model.device, ts_model.dtype
    state = ts.io.atoms_to_state(atoms, dev, dt_)
    momenta = torch.tensor(np.concatenate([a.get_momenta() for a in atoms]), device=dev, dtype=dt_)
    kT = torch.tensor(temperature * units.kB, device=dev, dtype=dt_)
    dt = torch.tensor(timestep * units.fs, device=dev, dtype=dt_)  # torch-sim's time unit is ASE's
    gamma = torch.tensor(friction / units.fs, device=dev, dtype=dt_)
    n_atoms = torch.tensor([len(a) for a in atoms], device=dev)
    log: list[dict] = []
    meter = Progress(steps, timestep, label="md-batch")
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        init, step = _integrator(ensemble, ts_model, kT, dt, gamma, seed)
        state = init(state)
        state.momenta = momenta
        for k in range(steps + 1):
            if k:
                state = step(state)
            if k % loginterval == 0 or k == steps:
                ekin = _kinetic_energy(state, len(atoms))
                epot = state.energy.detach().double().cpu()
                temps = 2 * ekin / (3 * n_atoms.cpu().double() * units.kB)
                log.append({"step": k, "time_ps": k * timestep / 1000, "temperature": temps.tolist(),
                            "potential_energy": epot.tolist(), "kinetic_energy": ekin.tolist(),
                            "total_energy": (epot + ekin).tolist()})
                if progress:
                    meter.update(k, float(temps.mean()), float((epot + ekin).sum()), force=k == steps)
    if progress:
        meter.close()
    steps_per_s, ns_day = meter.rates(steps)
    finals = ts.io.state_to_atoms(state)
    p = state.momenta.detach().double().cpu().numpy()
    start = 0
    out = []
    for a, f in zip(atoms, finals):
        f.info = dict(a.info)
        f.set_momenta(p[start:start + len(f)])
        start += len(f)
        out.append(f)
    return BatchMDResult(structures=[like_input(f, i) for f, i in zip(out, items)], atoms=out, steps=steps,
                         timestep_fs=float(timestep), log=log, steps_per_s=steps_per_s, ns_per_day=ns_day)


# ---------------------------------------------------------------------------- version adapters
def _fire_arguments(relax_cell: bool, pressure_au: float) -> dict:
    """``ts.optimize`` keywords for FIRE (ASE flavour), with a Fréchet cell filter if asked."""
    if NEW_API:
        init = {"cell_filter": ts.CellFilter.frechet, "scalar_pressure": pressure_au} if relax_cell else {}
        return {"optimizer": ts.Optimizer.fire, "init_kwargs": init}
    if relax_cell:
        return {"optimizer": ts.optimizers.frechet_cell_fire, "scalar_pressure": pressure_au}
    return {"optimizer": ts.optimizers.fire}


def _integrator(ensemble, model, kT, dt, gamma, seed):
    """``(init(state), step(state))`` of NVE or Langevin NVT for either torch-sim API."""
    if NEW_API:
        init_fn = ts.nve_init if ensemble == "nve" else ts.nvt_langevin_init
        step_fn = ts.nve_step if ensemble == "nve" else ts.nvt_langevin_step

        def init(state):
            if hasattr(state, "rng"):
                state.rng = seed
            return init_fn(state=state, model=model, kT=kT)

        if ensemble == "nve":
            return init, lambda s: step_fn(state=s, model=model, dt=dt)
        return init, lambda s: step_fn(state=s, model=model, dt=dt, kT=kT, gamma=gamma)
    if ensemble == "nve":
        init, update = ts.integrators.nve(model=model, dt=dt, kT=kT, seed=seed)
        return init, update
    init, update = ts.integrators.nvt_langevin(model=model, dt=dt, kT=kT, gamma=gamma, seed=seed)
    return init, lambda s: update(s, kT=kT, gamma=gamma)


def _kinetic_energy(state, n_systems: int) -> torch.Tensor:
    """``[S]`` kinetic energy per structure, eV (float64 on the CPU)."""
    p = state.momenta.detach().double()
    per_atom = 0.5 * (p * p).sum(-1) / state.masses.detach().double()
    return torch.zeros(n_systems, dtype=torch.float64, device=p.device).index_add_(
        0, state.system_idx, per_atom).cpu()


def _as_atoms(structures, need_cell: bool, what: str):
    items = list(structures) if isinstance(structures, (list, tuple)) else [structures]
    if not items:
        raise MatRISInputError("no structures given: pass at least one structure")
    atoms = [to_atoms(s, i) for i, s in enumerate(items)]
    for i, a in enumerate(atoms):
        to_system(a).validate(i)
        a.info.setdefault("name", a.get_chemical_formula())
        if need_cell and not a.pbc.all():
            raise MatRISInputError(f"structure {i} ({a.info['name']}) has pbc={a.pbc.tolist()}, but {what} needs a "
                                   "3-D periodic cell; pass relax_cell=False or relax it with matris.simulate.relax")
    kinds = {tuple(a.pbc) for a in atoms}
    if len(kinds) > 1 or not (all(kinds.pop()) or not any(atoms[0].pbc)):
        raise MatRISInputError(
            "torch-sim batches structures that are all periodic in 3-D or all non-periodic; "
            "got a mix (or a slab/wire): "
            "run these with matris.simulate.relax / md one at a time"
        )
    return items, atoms


def _with_results(atoms, pred):
    """``atoms`` with a prediction stored as calculator results (ASE units)."""
    from ase import units
    from ase.calculators.singlepoint import SinglePointCalculator

    results = {"energy": pred.energy, "free_energy": pred.energy, "forces": pred.forces}
    if pred.stress is not None:
        s = pred.stress * units.GPa
        results["stress"] = np.array([s[0, 0], s[1, 1], s[2, 2], s[1, 2], s[0, 2], s[0, 1]])
    atoms.calc = SinglePointCalculator(atoms, **results)
    return snapshot(atoms)
