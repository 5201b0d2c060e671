"""LightningDataModule: cached graphs, seeded splits, batches by budget, per-rank shards, exact resume."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..data import BudgetBatchSampler, MultiPacked, build_or_load
from ..data.cache import PackedDataset
from ..data.readers import expand_data_paths
from ..errors import MatRISInputError
from ._lightning import L
from .config import DataConfig, DatasetConfig
from .module import TrainBatch
from .reference import fit_reference_energies_chunked, read_reference_energies


def reader_options(config: Any, defaults: DataConfig | None = None) -> dict[str, Any]:
    """The reader options of ``config`` (a :class:`DataConfig` or a :class:`DatasetConfig`, whose unset
    keys fall back to ``defaults``); the reader's dispatch applies those of the file's format."""

    def get(key: str) -> Any:
        value = getattr(config, key, None)
        return getattr(defaults, key) if value is None and defaults is not None else value

    keys = {k: get(k) for k in ("energy_key", "forces_key", "stress_key", "magmoms_key", "material_id_key")}
    options = {k: v for k, v in keys.items() if v is not None}
    options["mptrj_energy_key"] = get("mptrj_energy_key") or "corrected_total_energy"
    unit = get("stress_unit") or "eV/A3"
    if unit != "eV/A3":
        options["stress_unit"] = unit
    return options


_LABELS = ("energy", "forces", "stress", "magmoms")


@dataclass
class LabelTransform:
    """Per-dataset label conventions of a mixture, applied when a batch is collated.

    bounds: ``[D + 1]`` global index ranges of the datasets (dataset d owns ``bounds[d]:bounds[d+1]``);
    mask: ``[D, 4]`` bool, which of energy, forces, stress, magmoms dataset d trains on
    (others become NaN, i.e. unlabelled); energy_shift: ``[D, 94]`` eV/atom per element, or
    None: the energy of a structure of dataset d becomes ``E − Σ_i energy_shift[d, Z_i − 1]``.
    """

    bounds: np.ndarray
    mask: np.ndarray
    energy_shift: np.ndarray | None = None

    def group(self, idx: np.ndarray) -> np.ndarray:
        """``[len(idx)]`` dataset number of each global index."""
        return np.searchsorted(self.bounds, idx, side="right") - 1

    def apply(self, idx: np.ndarray, graph: Any, targets: Any) -> Any:
        g = torch.from_numpy(self.group(idx))
        if self.energy_shift is not None:
            shift = torch.from_numpy(self.energy_shift).to(targets.energy.dtype)[g[graph.atom_batch],
                                                                                  graph.atomic_numbers - 1]
            targets.energy = targets.energy - torch.zeros_like(targets.energy).index_add_(0, graph.atom_batch, shift)
        mask = torch.from_numpy(self.mask)[g]  # [S, 4]
        nan = float("nan")
        if not mask[:, 0].all():
            targets.energy = targets.energy.masked_fill(~mask[:, 0], nan)
        if not mask[:, 1].all():
            targets.forces = targets.forces.masked_fill(~mask[graph.atom_batch, 1, None], nan)
        if not mask[:, 2].all():
            targets.stress = targets.stress.masked_fill(~mask[:, 2, None, None], nan)
        if not mask[:, 3].all():
            targets.magmoms = targets.magmoms.masked_fill(~mask[graph.atom_batch, 3], nan)
        return targets


class Subset:
    """Positions ``indices`` of a :class:`PackedDataset` (or several), with their sizes and the
    label conventions of their datasets (``transform``; None: labels as stored)."""

    def __init__(self, packed: PackedDataset, indices: np.ndarray, transform: LabelTransform | None = None):
        self.packed = packed
        self.indices = np.asarray(indices, dtype=np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.indices)

    def sizes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = self.packed
        return (np.asarray(p.n_atoms)[self.indices], np.asarray(p.n_bonds)[self.indices],
                np.asarray(p.n_angles)[self.indices])

    def groups(self) -> np.ndarray:
        """``[len(self)]`` dataset number of each position (0 without a mixture)."""
        if self.transform is None:
            return np.zeros(len(self), dtype=np.int64)
        return self.transform.group(self.indices)


class Collate:
    """Positions within a subset → :class:`TrainBatch` (picklable for worker processes)."""

    def __init__(self, subset: Subset):
        self.subset = subset

    def __call__(self, positions: list[int]) -> TrainBatch:
        idx = self.subset.indices[np.asarray(positions, dtype=np.int64)]
        graph, targets = self.subset.packed.collate(idx.tolist(), dtype=torch.float64)
        if self.subset.transform is not None:
            targets = self.subset.transform.apply(idx, graph, targets)
        return TrainBatch(graph, targets, torch.from_numpy(idx))


class ResumableLoader(DataLoader):
    """A DataLoader whose position inside an epoch is saved in Lightning checkpoints.

    ``state_dict`` records the epoch and the number of training batches already done
    (``progress()``, counted by the LightningModule); ``load_state_dict`` makes the next
    iteration yield exactly the batches not yet seen, so a killed run resumes with nothing
    lost or repeated.
    """

    def __init__(self, *args: Any, progress: Callable[[], int], on_resume: Callable[[int], None], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._progress = progress
        self._on_resume = on_resume

    def __len__(self) -> int:
        # the whole epoch, also while resuming inside it: Lightning counts the batches already
        # done (restored from the checkpoint) against this length
        return len(self.batch_sampler.rank_batches())

    def state_dict(self) -> dict[str, int]:
        return {"epoch": int(self.batch_sampler.epoch), "batches": int(self._progress())}

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, done = int(state["epoch"]), int(state["batches"])
        self.batch_sampler.set_epoch(epoch)
        if done >= len(self.batch_sampler):  # saved at the end of an epoch: start the next one
            self.batch_sampler.set_epoch(epoch + 1)
            done = 0
        self.batch_sampler.skip(done)
        self._on_resume(done)


class ShardedBatches:
    """Evaluation batches of one rank: budget batches dealt round-robin, none dropped."""

    def __init__(self, sampler: BudgetBatchSampler, rank: int, world_size: int):
        self.sampler, self.rank, self.world_size = sampler, rank, world_size

    def __iter__(self):
        for k, batch in enumerate(self.sampler):
            if k % self.world_size == self.rank:
                yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return len(range(self.rank, n, self.world_size))


class MatRISDataModule(L.LightningDataModule):
    """Training, validation and test data of a run.

    Every file is read once into the graph cache (:func:`matris.data.build_or_load`, built by
    ``data.build_workers`` processes, resumable), keyed by the file's content and the model's
    cutoffs. Entries of ``data.train`` etc. may be files, directories or globs. Validation/test
    sets are the given files, or a seeded split of the training files by structure or by
    material id. With ``data.datasets`` the same holds per dataset, and training batches are
    drawn from the weighted mixture (:class:`~matris.data.BudgetBatchSampler`), each dataset
    with its own labels and energy convention (:class:`LabelTransform`).
    """

    def __init__(self, config: DataConfig, cutoff: float, three_body_cutoff: float, seed: int = 0):
        super().__init__()
        self.config = config
        self.cutoff, self.three_body_cutoff, self.seed = float(cutoff), float(three_body_cutoff), int(seed)
        self.train_set: Subset | None = None
        self.val_set: Subset | None = None
        self.test_set: Subset | None = None
        self.datasets = _datasets(config)
        self.build_reports: list = []  # BuildReport of every cache entry loaded or built
        self.reference_energies: dict[str, np.ndarray] = {}  # per-dataset R_d (eV/atom) of a mixture
        # data.max_memory: (cost of each structure from its sizes, bytes per batch); see set_memory_budget
        self.memory_budget: tuple | None = None

    def set_memory_budget(self, cost, budget: int) -> None:
        """Batches by memory (``data.max_memory``): ``cost(n_atoms, n_bonds, n_angles)`` gives each
        structure's bytes (arrays in, array out; :func:`matris.memory.training_bytes`), and a
        batch holds at most ``budget`` of them, besides the other budgets."""
        self.memory_budget = (cost, int(budget))

    # ------------------------------------------------------------------ data
    def _files(self, entries: list[str]) -> list[Path]:
        return expand_data_paths(entries) if entries else []

    def _load_file(self, f: Path, ds: DatasetConfig, progress: bool = True) -> PackedDataset:
        c = self.config
        workers = c.build_workers or min(32, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                         else (os.cpu_count() or 1))
        return build_or_load(f, self.cutoff, self.three_body_cutoff, cache_dir=c.cache_dir,
                             reader_options=reader_options(ds, c), store_angles=c.cache_angles,
                             skip_invalid=c.on_error == "skip", workers=workers, shard_size=c.shard_size,
                             report=self.build_reports, progress=progress)

    def prepare_data(self) -> None:
        # builds the graph caches once (Lightning calls this on one process per node)
        for ds in self.datasets:
            for f in self._files([*ds.train, *ds.val, *ds.test]):
                self._load_file(f, ds)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        c = self.config
        if not self.datasets:
            raise MatRISInputError("no training data: set data.train to one or more files (extxyz, ASE db, .aselmdb, "
                                   "MPtrj or MatPES json), or data.datasets to a mixture")
        parts: list = []  # cache entries in global order: dataset by dataset, its train, val, test files
        spans: list[dict[str, tuple[int, int]]] = []
        for ds in self.datasets:
            span = {}
            for key in ("train", "val", "test"):
                first = sum(len(p) for p in parts)
                parts.extend(self._load_file(f, ds) for f in self._files(getattr(ds, key)))
                span[key] = (first, sum(len(p) for p in parts))
            spans.append(span)
        packed = parts[0] if len(parts) == 1 else MultiPacked(parts)  # MultiPacked flattens to shards
        bounds = np.array([s["train"][0] for s in spans] + [spans[-1]["test"][1]], dtype=np.int64)
        mask = np.array([[label in ds.labels for label in _LABELS] for ds in self.datasets], dtype=bool)
        train, val, test = [], [], []
        for d, (ds, span) in enumerate(zip(self.datasets, spans)):
            lo, hi = span["train"]
            if hi == lo:
                raise MatRISInputError(f"dataset {ds.name!r}: its training files hold no structures")
            val_frac = 0.0 if ds.val else (c.val_fraction if ds.val_fraction is None else ds.val_fraction)
            test_frac = 0.0 if ds.test else (c.test_fraction if ds.test_fraction is None else ds.test_fraction)
            ids = packed_material_ids(packed, lo, hi) if (ds.split_by or c.split_by) == "material" else None
            tr, va, te = split_indices(hi - lo, val_frac, test_frac, ds.split_by or c.split_by, c.split_seed, ids)
            if len(tr) == 0:
                raise MatRISInputError(f"dataset {ds.name!r}: the split leaves no training structures (of {hi - lo}); "
                                       "lower its val_fraction")
            train.append(lo + tr)
            val.append(np.arange(*span["val"]) if ds.val else lo + va)
            test.append(np.arange(*span["test"]) if ds.test else lo + te)
        transform = LabelTransform(bounds, mask)
        self.train_set = Subset(packed, np.concatenate(train), transform)
        transform.energy_shift = self._energy_shifts(packed, train)
        for name, chosen in (("val_set", val), ("test_set", test)):
            idx = np.concatenate(chosen)
            setattr(self, name, Subset(packed, idx, transform) if len(idx) else None)
        if not c.datasets and transform.energy_shift is None:  # plain data: no per-dataset conventions
            for subset in (self.train_set, self.val_set, self.test_set):
                if subset is not None:
                    subset.transform = None

    def _energy_shifts(self, packed: Any, train: list[np.ndarray]) -> np.ndarray | None:
        """``[D, 94]`` per-element energies moving each dataset to the first one's convention, or None."""
        refs = []
        for d, ds in enumerate(self.datasets):
            if ds.reference_energy is None:
                refs.append(None)
            elif ds.reference_energy == "fit":
                refs.append(fit_reference_energies_chunked(_composition_chunks(packed, train[d])))
            else:
                w = read_reference_energies(ds.reference_energy)
                refs.append((w, w != 0))
        if all(r is None for r in refs):
            return None
        base, base_present = refs[0]
        shift = np.zeros((len(refs), len(base)))
        for d, r in enumerate(refs):
            if r is not None and d > 0:
                w, present = r
                both = present & base_present  # elements only one dataset has keep their energies
                shift[d, both] = w[both] - base[both]
        self.reference_energies = {ds.name: r[0] for ds, r in zip(self.datasets, refs) if r is not None}
        return shift

    @property
    def labels(self) -> dict[str, bool]:
        """Which labels the training data has at all (after each dataset's label mask)."""
        assert self.train_set is not None
        p = self.train_set.packed
        has = p.has_labels
        if self.train_set.transform is None:
            return dict(has)
        out = dict.fromkeys(_LABELS, False)
        for d, ds in enumerate(self.datasets):
            lo, hi = self.train_set.transform.bounds[d: d + 2]
            datasets = [sh for sh, off in _shards(p) if lo <= off < hi]
            for k in _LABELS:
                out[k] |= k in ds.labels and any(sh.has_labels[k] for sh in datasets)
        return out

    def _train_chunks(self):
        t = self.train_set
        shift = None if t.transform is None else t.transform.energy_shift
        for comp, energy, idx in _composition_chunks(t.packed, t.indices, with_indices=True):
            if shift is not None:
                energy = energy - (comp * shift[t.transform.group(idx)]).sum(1)
            yield comp, energy

    def fit_reference_energies(self) -> tuple[np.ndarray, int]:
        """Per-element reference energies (eV/atom) fitted on the training split in constant memory,
        and the number of labelled structures used."""
        n = [0]

        def counted():
            for comp, energy in self._train_chunks():
                n[0] += int(np.isfinite(energy).sum())
                yield comp, energy

        w, _ = fit_reference_energies_chunked(counted())
        return w, n[0]

    def model_energies(self, model) -> "Any":
        """Batches of ``(composition [s, 94], label E [s] eV, model E without its reference term [s] eV,
        model E [s] eV)`` over the whole training split (every rank sees all of it), the model in
        eval mode on its device, energies only (no backward pass): the input of the reference refit."""
        from ..model.readout import NUM_ELEMENTS

        sampler = self._sampler(self.train_set, False, 0, 1)
        loader = DataLoader(_Positions(len(self.train_set)), batch_sampler=ShardedBatches(sampler, 0, 1),
                            collate_fn=Collate(self.train_set), num_workers=0)
        was_training = model.training
        model.eval()
        try:
            for batch in loader:
                g = batch.graph.to(model.device, model.dtype)
                with torch.no_grad():
                    out = model(g, compute_forces=False, compute_stress=False, compute_magmoms=False)
                ref = model._reference_term(g, out.energy)  # [S] the per-atom mean reference
                n = g.n_atoms.to(out.energy.dtype)
                bare = out.energy - (ref * n if model.config.is_intensive else ref)
                comp = torch.zeros(g.num_structures, NUM_ELEMENTS, dtype=torch.float64)
                comp.index_put_((g.atom_batch.cpu(), g.atomic_numbers.cpu() - 1),
                                torch.ones(g.num_atoms, dtype=torch.float64), accumulate=True)
                yield (comp.numpy(), batch.targets.energy.detach().double().cpu().numpy(),
                       bare.double().cpu().numpy(), out.energy.double().cpu().numpy())
        finally:
            model.train(was_training)

    # ------------------------------------------------------------------ loaders
    def transfer_batch_to_device(self, batch: TrainBatch, device: torch.device, dataloader_idx: int) -> TrainBatch:
        return batch.to(device)

    def _sampler(self, subset: Subset, shuffle: bool, rank: int, world: int) -> BudgetBatchSampler:
        c = self.config
        a, b, t = subset.sizes()
        mixture = {}
        if c.datasets and shuffle:  # training: draw from the weighted mixture
            mixture = {"groups": subset.groups(), "weights": [ds.weight for ds in self.datasets],
                       "epoch_size": c.epoch_size}
        memory = {}
        if self.memory_budget is not None:
            cost, budget = self.memory_budget
            memory = {"memory": np.asarray(cost(a, b, t), dtype=np.int64), "max_memory": budget}
        return BudgetBatchSampler(a, b, t, max_atoms=c.max_atoms, max_bonds=c.max_bonds, max_angles=c.max_angles,
                                  max_structures=c.max_structures, shuffle=shuffle, seed=self.seed,
                                  rank=rank, world_size=world, **mixture, **memory)

    def _rank(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return int(self.trainer.global_rank), int(self.trainer.world_size)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        assert self.train_set is not None
        sampler = self._sampler(self.train_set, self.config.shuffle, rank, world)
        if len(sampler) == 0:
            raise MatRISInputError(
                f"{len(self.train_set)} training structures make no batch for each of {world} ranks; "
                "use more data, fewer devices or smaller batch budgets")
        module = self.trainer.lightning_module if self.trainer is not None else None

        def progress() -> int:
            return int(getattr(module, "batches_in_epoch", 0))

        def on_resume(done: int) -> None:
            if module is not None:
                module.batches_in_epoch = done

        return ResumableLoader(_Positions(len(self.train_set)), batch_sampler=sampler,
                               collate_fn=Collate(self.train_set), num_workers=self.config.num_workers,
                               persistent_workers=False, progress=progress, on_resume=on_resume)

    def _eval_loader(self, subset: Subset | None) -> DataLoader | list:
        if subset is None:
            return []
        rank, world = self._rank()
        batches = ShardedBatches(self._sampler(subset, False, 0, 1), rank, world)
        return DataLoader(_Positions(len(subset)), batch_sampler=batches, collate_fn=Collate(subset),
                          num_workers=self.config.num_workers)

    def val_dataloader(self):
        return self._eval_loader(self.val_set)

    def test_dataloader(self):
        return self._eval_loader(self.test_set)


class _Positions(torch.utils.data.Dataset):
    """Positions 0..n−1; the collate function turns a list of them into a batch."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return int(i)


def _datasets(config: DataConfig) -> list[DatasetConfig]:
    """The datasets of ``config``: its mixture, or one dataset of data.train/val/test."""
    if config.datasets:
        return [DatasetConfig.from_value(d, f"data.datasets[{k}]") for k, d in enumerate(config.datasets)]
    if not config.train:
        return []
    return [DatasetConfig(name="data", train=list(config.train), val=list(config.val), test=list(config.test))]


def _shards(packed: Any) -> list[tuple[PackedDataset, int]]:
    """``(shard, global offset)`` of a PackedDataset or a MultiPacked (whose shards are flat), in index order."""
    if isinstance(packed, PackedDataset):
        return [(packed, 0)]
    return list(zip(packed.datasets, packed.offsets[:-1].tolist()))


def _composition_chunks(packed: Any, indices: np.ndarray, with_indices: bool = False):
    """``(composition [s, 94], energy [s] eV)`` of ``indices`` (sorted), one shard at a time."""
    idx = np.sort(np.asarray(indices, dtype=np.int64))
    for shard, off in _shards(packed):
        mine = idx[(idx >= off) & (idx < off + len(shard))]
        if not mine.size:
            continue
        local = mine - off
        comp, energy = shard.composition_matrix()[local], shard.energies[local]
        yield (comp, energy, mine) if with_indices else (comp, energy)


def packed_material_ids(packed: Any, lo: int, hi: int) -> list[str]:
    """Material ids of global indices ``lo..hi-1``."""
    out: list[str] = []
    for shard, off in _shards(packed):
        a, b = max(lo, off), min(hi, off + len(shard))
        if a < b:
            out.extend(shard.material_ids[a - off: b - off])
    return out


def split_indices(n: int, val_fraction: float, test_fraction: float, split_by: str, seed: int,
                  material_ids: list[str] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded train/val/test positions of ``n`` structures.

    ``split_by='material'`` keeps all frames of a material id in one split (no leakage of
    near-duplicate frames between training and validation).
    """
    rng = np.random.default_rng(seed)
    if split_by == "material":
        if material_ids is None:
            raise MatRISInputError("split_by=material needs material ids (data.material_id_key or MPtrj data)")
        ids = np.asarray(material_ids)
        unique, inverse = np.unique(ids, return_inverse=True)
        order = rng.permutation(len(unique))
        n_val, n_test = _counts(len(unique), val_fraction, test_fraction)
        group = np.zeros(len(unique), dtype=np.int64)
        group[order[:n_val]] = 1
        group[order[n_val:n_val + n_test]] = 2
        which = group[inverse]
    else:
        order = rng.permutation(n)
        n_val, n_test = _counts(n, val_fraction, test_fraction)
        which = np.zeros(n, dtype=np.int64)
        which[order[:n_val]] = 1
        which[order[n_val:n_val + n_test]] = 2
    return tuple(np.flatnonzero(which == k) for k in range(3))  # type: ignore[return-value]


def _counts(n: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    n_val = int(round(val_fraction * n)) if val_fraction > 0 else 0
    n_test = int(round(test_fraction * n)) if test_fraction > 0 else 0
    if val_fraction > 0:
        n_val = max(1, n_val)
    if test_fraction > 0:
        n_test = max(1, n_test)
    return n_val, n_test


__all__ = ["MatRISDataModule", "split_indices", "ResumableLoader", "reader_options", "LabelTransform"]
