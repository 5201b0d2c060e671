"""LightningDataModule: cached graphs, seeded splits, batches by budget, per-rank shards, exact resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from ..data import BudgetBatchSampler, MultiPacked, build_or_load
from ..data.cache import PackedDataset
from ..errors import MatRISInputError
from .config import DataConfig
from .module import TrainBatch


def reader_options(config: DataConfig) -> dict[str, Any]:
    """The reader options of ``config``; the reader's dispatch applies those of the file's format."""
    keys = {"energy_key": config.energy_key, "forces_key": config.forces_key, "stress_key": config.stress_key,
            "magmoms_key": config.magmoms_key, "material_id_key": config.material_id_key}
    options = {k: v for k, v in keys.items() if v is not None}
    options["mptrj_energy_key"] = config.mptrj_energy_key
    if config.stress_unit != "eV/A3":
        options["stress_unit"] = config.stress_unit
    return options


class Subset:
    """Positions ``indices`` of a :class:`PackedDataset` (or several), with their sizes."""

    def __init__(self, packed: PackedDataset, indices: np.ndarray):
        self.packed = packed
        self.indices = np.asarray(indices, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def sizes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = self.packed
        return (np.asarray(p.n_atoms)[self.indices], np.asarray(p.n_bonds)[self.indices],
                np.asarray(p.n_angles)[self.indices])


class Collate:
    """Positions within a subset → :class:`TrainBatch` (picklable for worker processes)."""

    def __init__(self, subset: Subset):
        self.subset = subset

    def __call__(self, positions: list[int]) -> TrainBatch:
        idx = self.subset.indices[np.asarray(positions, dtype=np.int64)]
        graph, targets = self.subset.packed.collate(idx.tolist(), dtype=torch.float64)
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

    Every file is read once into the packed graph cache (:func:`matris.data.build_or_load`),
    keyed by the file's content and the model's cutoffs. Validation/test sets are the given
    files, or a seeded split of the training files by structure or by material id.
    """

    def __init__(self, config: DataConfig, cutoff: float, three_body_cutoff: float, seed: int = 0):
        super().__init__()
        self.config = config
        self.cutoff, self.three_body_cutoff, self.seed = float(cutoff), float(three_body_cutoff), int(seed)
        self.train_set: Subset | None = None
        self.val_set: Subset | None = None
        self.test_set: Subset | None = None

    # ------------------------------------------------------------------ data
    def _load(self, files: list[str]) -> PackedDataset | None:
        if not files:
            return None
        parts = []
        for f in files:
            if not Path(f).is_file():
                raise FileNotFoundError(f"data file {f} does not exist (data.train/val/test)")
            parts.append(build_or_load(f, self.cutoff, self.three_body_cutoff, cache_dir=self.config.cache_dir,
                                       reader_options=reader_options(self.config),
                                       store_angles=self.config.cache_angles))
        return parts[0] if len(parts) == 1 else MultiPacked(parts)

    def prepare_data(self) -> None:
        # builds the graph caches once (Lightning calls this on one process per node)
        for f in [*self.config.train, *self.config.val, *self.config.test]:
            self._load([f])

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        c = self.config
        if not c.train:
            raise MatRISInputError("no training data: set data.train to one or more files (extxyz, ASE db, MPtrj json)")
        train = self._load(c.train)
        n = len(train)
        val_frac = 0.0 if c.val else c.val_fraction
        test_frac = 0.0 if c.test else c.test_fraction
        train_idx, val_idx, test_idx = split_indices(n, val_frac, test_frac, c.split_by, c.split_seed,
                                                     train.material_ids)
        if len(train_idx) == 0:
            raise MatRISInputError(f"the split leaves no training structures (of {n}); lower data.val_fraction")
        self.train_set = Subset(train, train_idx)
        val = self._load(c.val)
        self.val_set = Subset(val, np.arange(len(val))) if val is not None else (
            Subset(train, val_idx) if len(val_idx) else None)
        test = self._load(c.test)
        self.test_set = Subset(test, np.arange(len(test))) if test is not None else (
            Subset(train, test_idx) if len(test_idx) else None)

    @property
    def labels(self) -> dict[str, bool]:
        """Which labels the training data has at all."""
        assert self.train_set is not None
        return dict(self.train_set.packed.has_labels)

    def training_composition(self) -> tuple[np.ndarray, np.ndarray]:
        """``[S, 94]`` element counts and ``[S]`` total energies (eV) of the training split."""
        assert self.train_set is not None
        p, idx = self.train_set.packed, self.train_set.indices
        return np.asarray(p.composition_matrix())[idx], np.asarray(p.energies)[idx]

    # ------------------------------------------------------------------ loaders
    def transfer_batch_to_device(self, batch: TrainBatch, device: torch.device, dataloader_idx: int) -> TrainBatch:
        return batch.to(device)

    def _sampler(self, subset: Subset, shuffle: bool, rank: int, world: int) -> BudgetBatchSampler:
        c = self.config
        a, b, t = subset.sizes()
        return BudgetBatchSampler(a, b, t, max_atoms=c.max_atoms, max_bonds=c.max_bonds, max_angles=c.max_angles,
                                  max_structures=c.max_structures, shuffle=shuffle, seed=self.seed,
                                  rank=rank, world_size=world)

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


__all__ = ["MatRISDataModule", "split_indices", "ResumableLoader", "reader_options"]
