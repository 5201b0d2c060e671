"""Batched prediction for lists of structures, with automatic splitting of batches that run out of memory."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from .errors import MatRISInputError, MemoryLimitError, is_out_of_memory
from .graph import AtomicSystem, GraphBatch
from .settings import parse_size
from .structures import to_system, warn_implausible

PROGRESS_THRESHOLD = 64  # lists at least this long show a progress bar by default


@dataclass
class Prediction:
    """MatRIS output for one structure.

    energy: eV (total); energy_per_atom: eV/atom; forces: ``[N, 3]`` eV/Å; stress:
    ``[3, 3]`` GPa, positive = tensile (None without a 3-D cell); magmoms: ``[N]`` μB (None
    for models trained without magnetic moments); atomic_energies: ``[N]`` eV, each atom's
    share of ``energy`` (they sum to it).
    """

    energy: float
    energy_per_atom: float
    forces: np.ndarray | None
    stress: np.ndarray | None
    magmoms: np.ndarray | None
    name: str = ""
    atomic_energies: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists instead of arrays)."""
        out: dict[str, Any] = {"name": self.name, "energy": self.energy, "energy_per_atom": self.energy_per_atom}
        for key in ("forces", "stress", "magmoms", "atomic_energies"):
            value = getattr(self, key)
            out[key if key != "stress" else "stress_GPa"] = None if value is None else value.tolist()
        return out


def predict(
    model,
    structures: Sequence[Any] | Any,
    batch_size: int = 16,
    compute_forces: bool = True,
    compute_stress: bool = True,
    compute_magmoms: bool | None = None,
    progress: bool | None = None,
    warn_inputs: bool = True,
    memory_limit: str | int | None = None,
) -> list[Prediction] | Prediction:
    """Evaluate ``model`` on ASE Atoms or pymatgen Structures, ``batch_size`` at a time.

    A single structure gives a single :class:`Prediction`, a list gives a list in the same
    order. A batch that does not fit in memory is split in halves and retried; only a
    single structure that does not fit raises. ``compute_magmoms`` (default: when the model
    was trained on them) gives ``magmoms=None`` otherwise. ``progress`` shows a bar (default: for
    lists of at least 64 structures). ``warn_inputs``: warn
    (:class:`~matris.errors.MatRISInputWarning`) about structures that look like input mistakes
    (:func:`matris.structures.implausibilities`); callers that checked the structure they derived
    these from (an EOS scan, displaced phonon supercells) turn it off. ``memory_limit``: the memory
    one call may use beyond the loaded model (``"8 GB"`` or bytes; None: the model's
    ``options.memory_limit``, by default a share of what the device has free); a batch that needs more
    is split, a single structure that needs more even at the lowest memory level raises
    :class:`~matris.errors.MemoryLimitError` before its call starts.
    """
    single = not isinstance(structures, (list, tuple)) and not _is_iterable_of_structures(structures)
    items = [structures] if single else list(structures)
    if batch_size < 1:
        raise MatRISInputError(f"batch_size must be >= 1, got {batch_size}")
    systems = [to_system(s, i) for i, s in enumerate(items)]
    for i, system in enumerate(systems):
        system.validate(i)
        if warn_inputs:
            warn_implausible(items[i], model.cutoff, i, system)
    if progress is None:
        progress = len(systems) >= PROGRESS_THRESHOLD
    results: list[Prediction] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(systems), unit="struct", desc="MatRIS predict")
    limit = parse_size(memory_limit, "memory_limit")
    options = dict(compute_forces=compute_forces, compute_stress=compute_stress, compute_magmoms=compute_magmoms,
                   compute_atomic_energies=True,
                   options=None if limit is None else dataclasses.replace(model.options, memory_limit=limit))
    try:
        for start in range(0, len(systems), batch_size):
            chunk = systems[start : start + batch_size]
            results.extend(_run_splitting(model, chunk, start, options))
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return results[0] if single else results


def _is_iterable_of_structures(obj: Any) -> bool:
    # An ase.Atoms is iterable (over atoms) and a pymatgen Structure over sites: both are one structure.
    if hasattr(obj, "get_positions") or hasattr(obj, "cart_coords"):
        return False
    return isinstance(obj, Iterable) and not isinstance(obj, (str, bytes, AtomicSystem))


def _run_splitting(model, systems: list[AtomicSystem], offset: int, options: dict) -> list[Prediction]:
    try:
        return _run(model, systems, offset, options)
    except Exception as exc:  # noqa: BLE001 - only out-of-memory errors are handled
        if not is_out_of_memory(exc):
            raise
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
        if len(systems) == 1:
            if isinstance(exc, MemoryLimitError):
                raise MemoryLimitError(f"structure {offset} ({systems[0].name}): {exc}") from None
            raise MemoryError(
                f"structure {offset} ({systems[0].name}, {systems[0].num_atoms} atoms) does not fit in memory on "
                f"{model.device} even alone; use a device with more memory or float32."
            ) from exc
        half = len(systems) // 2
        return _run_splitting(model, systems[:half], offset, options) + _run_splitting(
            model, systems[half:], offset + half, options
        )


def _run(model, systems: list[AtomicSystem], offset: int, options: dict) -> list[Prediction]:
    graph = GraphBatch.from_systems(
        systems, model.cutoff, model.three_body_cutoff, dtype=model.dtype, device=model.device, index_offset=offset
    )
    out = model(graph, **options)
    n_atoms = graph.n_atoms.tolist()
    splits = np.cumsum([0] + n_atoms)
    forces = out.forces.detach().cpu().numpy() if out.forces is not None else None
    magmoms = out.magmoms.detach().cpu().numpy() if out.magmoms is not None else None
    atomic = out.atomic_energies.detach().cpu().numpy()
    stress = out.stress.detach().cpu().numpy() if out.stress is not None else None
    energy = out.energy.detach().cpu().numpy()
    energy_per_atom = out.energy_per_atom.detach().cpu().numpy()
    preds = []
    for k, system in enumerate(systems):
        a, b = splits[k], splits[k + 1]
        s = None if stress is None or np.isnan(stress[k]).any() else stress[k]
        preds.append(
            Prediction(
                energy=float(energy[k]),
                energy_per_atom=float(energy_per_atom[k]),
                forces=None if forces is None else forces[a:b],
                stress=s,
                magmoms=None if magmoms is None else magmoms[a:b],
                name=system.name,
                atomic_energies=atomic[a:b],
            )
        )
    return preds
