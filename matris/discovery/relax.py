"""Relaxing the WBM initial structures with the Matbench-Discovery protocol, one shard at a time.

Protocol: FIRE on a ``FrechetCellFilter`` (positions and cell), converged when every atomic
force and cell force is below ``fmax`` = 0.05 eV/Å (0.02 settable), at most 500 steps. On a
GPU the structures of a shard are relaxed together with torch-sim's batched FIRE
(:func:`matris.simulate.relax_batch`), ``batch_size`` at a time; on the CPU one by one with
ASE (:func:`matris.simulate.relax`). Each finished structure is appended to
``DIR/shard-I-of-N.jsonl`` at once (see :mod:`matris.discovery.store`), so a killed shard
restarts where it stopped: nothing is lost and nothing is relaxed twice.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .. import log
from ..errors import MatRISInputError
from ..extras import install_hint
from .readers import StructureSource, read_structures
from .shards import Shard, shard_positions
from .store import RelaxRecord, ShardLog, check_manifest

ENGINES = ("auto", "ase", "torch-sim")
Relaxer = Callable[[list], list[RelaxRecord]]  # Atoms (info["material_id"] set) → one record each


@dataclass(frozen=True)
class RelaxProtocol:
    """fmax: force threshold, eV/Å (atomic and cell forces). steps: most optimizer steps.
    optimizer / cell_filter: ASE names (the batched engine always runs FIRE + Fréchet filter)."""

    fmax: float = 0.05
    steps: int = 500
    optimizer: str = "FIRE"
    cell_filter: str = "FrechetCellFilter"

    def __post_init__(self):
        if not (isinstance(self.fmax, (int, float)) and self.fmax > 0):
            raise MatRISInputError(f"fmax must be a positive number of eV/Å, got {self.fmax!r} (Matbench: 0.05)")
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise MatRISInputError(f"steps must be a positive integer, got {self.steps!r} (Matbench: 500)")


@dataclass
class ShardReport:
    """What one call of :func:`relax_shard` did. seconds: wall time of the relaxations."""

    shard: Shard
    path: Path
    assigned: int
    skipped: int
    relaxed: int
    failed: int
    seconds: float
    engine: str

    def summary(self) -> str:
        if self.assigned and self.skipped == self.assigned:  # the rerun rule (matris.rerun): say it, say the way out
            return (f"shard {self.shard}: all {self.assigned} structures were already done in {self.path}: nothing "
                    "relaxed now (--retry-failed relaxes failed ones again; another --out folder starts afresh)")
        rate = f", {self.relaxed / self.seconds:.2f} structures/s" if self.relaxed and self.seconds > 0 else ""
        return (f"shard {self.shard}: {self.assigned} structures assigned, {self.skipped} already done, "
                f"{self.relaxed} relaxed now ({self.failed} failed) in {self.seconds:.1f} s{rate} with {self.engine}; "
                f"results in {self.path}")


# ------------------------------------------------------------------------------------- engines
def choose_engine(engine: str, device: torch.device) -> str:
    """"ase" or "torch-sim": ``auto`` is torch-sim on CUDA when it is installed, else ASE."""
    if engine not in ENGINES:
        raise MatRISInputError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "auto":
        if device.type != "cuda":
            return "ase"
        import importlib.util

        if importlib.util.find_spec("torch_sim") is None:
            log.info("torch-sim is not installed: relaxing one structure at a time with ASE "
                     f"({install_hint('sim')} for batched GPU relaxation)")
            return "ase"
        return "torch-sim"
    return engine


class RelaxationDiverged(RuntimeError):
    """A relaxation that ended with a non-finite energy, position or cell."""


def is_structure_failure(exc: BaseException) -> bool:
    """Whether ``exc`` belongs to one structure, so that the run records it and goes on: a
    structure MatRIS cannot take (:class:`MatRISInputError`), out of memory, non-finite
    results, or an optimizer that diverged (a singular cell). Anything else is a bug or a
    broken setup, and stops the run instead of turning every structure into a failed record."""
    if isinstance(exc, (MatRISInputError, MemoryError, RelaxationDiverged, np.linalg.LinAlgError)):
        return True
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _check_finite(mid: str, energy, atoms) -> None:
    values = [energy, *np.asarray(atoms.get_positions()).ravel(), *np.asarray(atoms.cell[:]).ravel()]
    if energy is None or not np.isfinite(np.asarray(values, dtype=float)).all():
        raise RelaxationDiverged(f"{mid}: the relaxation ended with a non-finite energy, position or cell "
                                 f"(energy {energy})")


def ase_relaxer(model, protocol: RelaxProtocol, device, dtype) -> Relaxer:
    """One structure at a time with :func:`matris.simulate.relax` (ASE optimizer + cell filter)."""
    from ..simulate import relax
    from ..simulate.inputs import calculator

    calc = calculator(model, device, dtype, compute_stress=True)

    def run(atoms_list: list) -> list[RelaxRecord]:
        records = []
        for atoms in atoms_list:
            mid = atoms.info["material_id"]
            start = time.perf_counter()
            try:
                r = relax(atoms, fmax=protocol.fmax, steps=protocol.steps, optimizer=protocol.optimizer,
                          cell_filter=protocol.cell_filter, model=calc)
                _check_finite(mid, r.energy, r.atoms)
            except Exception as exc:
                if not is_structure_failure(exc):
                    raise  # a bug: stop, rather than record 257k failed structures
                records.append(_failed(mid, atoms, exc, "ase", time.perf_counter() - start))
                continue
            records.append(RelaxRecord.from_atoms(mid, r.atoms, r.energy, fmax=r.fmax, steps=r.steps,
                                                  converged=r.converged, engine="ase",
                                                  seconds=time.perf_counter() - start))
        return records

    return run


def batched_relaxer(model, protocol: RelaxProtocol, device, dtype, max_atoms: int | None = None) -> Relaxer:
    """Many structures at once with torch-sim's batched FIRE on a Fréchet cell filter
    (:func:`matris.simulate.relax_batch`). A batch that fails for a reason that belongs to a
    structure (:func:`is_structure_failure`: out of memory, non-finite results, ...) is split in
    halves and retried; a single structure that fails so is recorded as failed. Other errors
    stop the run."""
    if protocol.optimizer != "FIRE" or protocol.cell_filter != "FrechetCellFilter":
        raise MatRISInputError("the torch-sim engine runs FIRE + FrechetCellFilter only; use --engine ase for "
                               f"{protocol.optimizer} + {protocol.cell_filter}")
    from ..simulate.batched import MatRISModel, relax_batch

    ts_model = MatRISModel(model, device, dtype, compute_stress=True)

    def run(atoms_list: list) -> list[RelaxRecord]:
        if not atoms_list:
            return []
        start = time.perf_counter()
        try:
            results = relax_batch(atoms_list, fmax=protocol.fmax, steps=protocol.steps, model=ts_model,
                                  max_atoms=max_atoms)
            for a, r in zip(atoms_list, results):
                _check_finite(a.info["material_id"], r.energy, r.atoms)
        except Exception as exc:
            if not is_structure_failure(exc):
                raise  # a bug: stop, rather than bisect it into failed records
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if len(atoms_list) == 1:
                a = atoms_list[0]
                return [_failed(a.info["material_id"], a, exc, "torch-sim", time.perf_counter() - start)]
            half = len(atoms_list) // 2
            return run(atoms_list[:half]) + run(atoms_list[half:])
        elapsed = time.perf_counter() - start
        total = sum(len(a) for a in atoms_list)
        return [RelaxRecord.from_atoms(a.info["material_id"], r.atoms, r.energy, fmax=r.fmax, steps=r.steps,
                                       converged=r.converged, engine="torch-sim",
                                       seconds=elapsed * len(a) / total)
                for a, r in zip(atoms_list, results)]

    return run


def _failed(mid: str, atoms, exc: BaseException, engine: str, seconds: float) -> RelaxRecord:
    return RelaxRecord.from_atoms(mid, atoms, None, error=f"{type(exc).__name__}: {exc}"[:500], engine=engine,
                                  seconds=seconds)


# -------------------------------------------------------------------------------------- driver
def relax_shard(
    structures: StructureSource | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    model: Any = None,
    model_name: str | None = None,
    shard: Shard = Shard(0, 1),
    protocol: RelaxProtocol = RelaxProtocol(),
    engine: str = "auto",
    device: str | torch.device | None = "auto",
    dtype: str = "float32",
    batch_size: int | None = None,
    max_atoms: int | None = None,
    limit: int | None = None,
    retry_failed: bool = False,
    progress: bool | None = None,
    relaxer: Relaxer | None = None,
    on_record: Callable[[RelaxRecord], None] | None = None,
) -> ShardReport:
    """Relax the structures of ``shard`` that ``out_dir`` does not hold yet.

    Args:
        structures: a structures file (see :func:`matris.discovery.read_structures`) or a
            :class:`StructureSource`; ``limit`` keeps its first structures only.
        model: a :class:`MatRIS`, a model name or checkpoint path (``MatRIS.load``), or None
            for the bundled model; loaded only if there is work left. model_name: what the run
            manifest calls it (default: ``str(model)``).
        engine: "auto" (torch-sim on CUDA, ASE on the CPU), "ase" or "torch-sim".
        device: "auto", "cpu", "cuda", "cuda:N". dtype: "float32" or "float64".
        batch_size: structures relaxed (and then written) together; default 256 with
            torch-sim, 1 with ASE. max_atoms: torch-sim: most atoms on the device at once.
        retry_failed: relax again the structures whose relaxation failed before.
        relaxer: replaces the model-based engine (tests, other relaxation codes).
        on_record: called after every record is written (e.g. to report progress).
    """
    from ..calculator import resolve_device

    source = structures if isinstance(structures, StructureSource) else read_structures(structures, limit)
    if batch_size is not None and batch_size < 1:
        raise MatRISInputError(f"--batch-size must be a positive number of structures, got {batch_size}")
    name = model_name or (str(model) if isinstance(model, (str, os.PathLike)) else
                          "bundled" if model is None else type(model).__name__)
    out_dir = Path(out_dir)
    check_manifest(out_dir, {
        "model": name, "dtype": str(dtype), "fmax": protocol.fmax, "steps": protocol.steps,
        "optimizer": protocol.optimizer, "cell_filter": protocol.cell_filter, "shards": shard.count,
        "structures": Path(source.path).name, "limit": limit, "n_structures": len(source),
        "material_ids": list(source.material_ids),
    })
    positions = shard_positions(source.material_ids, source.natoms, shard)
    engine_name = "custom" if relaxer is not None else None
    with ShardLog(out_dir, shard, retry_failed=retry_failed) as log:
        done = log.done
        todo = [k for k in positions if source.material_ids[k] not in done]
        report = ShardReport(shard, log.path, len(positions), len(positions) - len(todo), 0, 0, 0.0, "")
        if todo and relaxer is None:
            dev = resolve_device(device)
            engine_name = choose_engine(engine, dev)
            net = _load_model(model, dev, dtype)
            relaxer = (batched_relaxer(net, protocol, dev, dtype, max_atoms) if engine_name == "torch-sim"
                       else ase_relaxer(net, protocol, dev, dtype))
        report.engine = engine_name or choose_engine(engine, resolve_device(device))
        size = batch_size or (256 if report.engine == "torch-sim" else 1)
        bar = _progress_bar(progress, len(todo), shard)
        start = time.perf_counter()
        try:
            for chunk in _chunks(todo, size):
                for record in relaxer(source.load(chunk)):
                    log.append(record)
                    report.relaxed += 1
                    report.failed += not record.ok
                    if bar is not None:
                        bar.update(1)
                    if on_record is not None:
                        on_record(record)
        finally:
            report.seconds = time.perf_counter() - start
            if bar is not None:
                bar.close()
    return report


def _load_model(model, device: torch.device, dtype: str):
    from ..calculator import resolve_dtype
    from ..model import MatRIS

    if isinstance(model, MatRIS):
        return model
    return MatRIS.load(model, device=device, dtype=resolve_dtype(dtype))


def _chunks(items: Sequence[int], size: int):
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


def _progress_bar(progress: bool | None, total: int, shard: Shard):
    if not total or not (progress if progress is not None else _is_tty()):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"relax {shard}", unit="structure", file=sys.stderr)


def _is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


__all__ = ["RelaxProtocol", "ShardReport", "relax_shard", "ase_relaxer", "batched_relaxer", "choose_engine",
           "ENGINES"]
