"""Batches packed to budgets of atoms, bonds and angles, sharded over ranks, resumable."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import MatRISInputError, counted


class BudgetBatchSampler:
    """A batch sampler that fills each batch up to, never beyond, the given budgets.

    Each epoch the positions ``0..S-1`` are ordered (a permutation seeded by ``seed + epoch``
    when ``shuffle``, else in order) and packed greedily: a batch is closed when the next
    structure would push any of its sums of atoms, bonds or angles (or its structure count)
    over the budget. With ``drop_last`` the epoch's final batch (the remainder) is dropped.

    Sharding (DDP): the epoch's batches are dealt round-robin, rank r getting
    ``batches[r::world_size]``, truncated so that every rank yields the same number,
    ``len(batches) // world_size``. Ranks therefore see disjoint structures. Everything is
    computed from the arguments alone (no torch.distributed calls): all ranks must pass the
    same sizes, budgets and seed.

    Resuming mid-epoch: :meth:`state_dict` holds the epoch and the number of batches already
    yielded; :meth:`load_state_dict` (or :meth:`set_epoch` + :meth:`skip`) makes the next
    iteration continue with exactly the batches not yet seen. A DataLoader with workers
    draws batches ahead of the training loop, so the sampler's own count can run ahead of
    the batches actually trained on: pass the trainer's count, ``state_dict(batches_done)``.

    Call :meth:`set_epoch` at the start of every epoch (Lightning does it through
    ``batch_sampler.sampler.set_epoch``, which forwards here; build the DataLoader with
    ``batch_sampler=`` and give Lightning ``use_distributed_sampler=False``).

    Mixtures: with ``groups`` (``[S]`` dataset number of each position) and ``weights``
    (``[D]``, one per dataset), each epoch draws ``epoch_size`` positions (default S): for
    each slot a dataset is chosen with probability ``weights[d] / sum(weights)``, and the
    slots of dataset d take its positions in a seeded permutation, continued by further
    permutations when d is drawn more often than it has structures (a small, up-weighted set
    repeats; a large, down-weighted one is subsampled). Every draw is seeded by
    ``(seed, epoch, d, ...)`` alone, so ranks agree and resuming is exact as above.

    Args:
        n_atoms: ``[S]`` atoms of each position (e.g. ``GraphDataset.n_atoms``).
        n_bonds: ``[S]`` bonds of each position.
        n_angles: ``[S]`` angles of each position.
        max_atoms: atoms per batch (None = no limit; at least one budget must be given).
        max_bonds: bonds per batch (None = no limit).
        max_angles: angles per batch (None = no limit).
        max_structures: structures per batch (None = no limit).
        memory: ``[S]`` bytes of each position's share of a training step (e.g.
            ``matris.memory.training_bytes``: linear, so a batch costs the sum).
        max_memory: bytes of activations per batch (with ``memory``; None = no limit).
        shuffle: shuffle the order of each epoch.
        seed: seed of the order of each epoch.
        rank: this process's shard (DDP rank).
        world_size: the number of shards (DDP world size).
        groups: a weighted mixture of datasets (above): the dataset of each position.
        weights: the sampling weight of each dataset.
        epoch_size: draws per epoch of a mixture.
    """

    def __init__(
        self,
        n_atoms: Sequence[int] | np.ndarray,
        n_bonds: Sequence[int] | np.ndarray,
        n_angles: Sequence[int] | np.ndarray,
        max_atoms: int | None = None,
        max_bonds: int | None = None,
        max_angles: int | None = None,
        max_structures: int | None = None,
        memory: Sequence[int] | np.ndarray | None = None,
        max_memory: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        groups: Sequence[int] | np.ndarray | None = None,
        weights: Sequence[float] | None = None,
        epoch_size: int | None = None,
    ):
        sizes = {name: np.asarray(a, dtype=np.int64).reshape(-1)
                 for name, a in (("atoms", n_atoms), ("bonds", n_bonds), ("angles", n_angles))}
        lengths = {name: a.size for name, a in sizes.items()}
        if len(set(lengths.values())) != 1:
            raise MatRISInputError(f"n_atoms, n_bonds and n_angles must have the same length, got {lengths}.")
        self.num_structures = lengths["atoms"]
        if self.num_structures == 0:
            raise MatRISInputError("the batch sampler got no structures; the dataset (or this split) is empty.")
        if any((a < 0).any() for a in sizes.values()):
            raise MatRISInputError("n_atoms, n_bonds and n_angles must be non-negative counts.")
        given = {"atoms": max_atoms, "bonds": max_bonds, "angles": max_angles}
        if (memory is None) != (max_memory is None):
            raise MatRISInputError("a memory budget needs both the cost of each structure (memory) and max_memory.")
        if memory is not None:
            sizes["memory"] = np.asarray(memory, dtype=np.int64).reshape(-1)
            if sizes["memory"].size != sizes["atoms"].size or (sizes["memory"] < 0).any():
                raise MatRISInputError("memory must give one non-negative cost per structure.")
            given["memory"] = max_memory
        self.budgets: dict[str, int] = {}
        for name, b in list(given.items()) + [("structures", max_structures)]:
            if b is None:
                continue
            if int(b) != b or b < 1:
                raise MatRISInputError(f"max_{name} must be a positive integer or None, got {b!r}.")
            self.budgets[name] = int(b)
        if not self.budgets:
            raise MatRISInputError("give at least one budget: max_atoms, max_bonds, max_angles, max_memory or "
                                   "max_structures.")
        if not (isinstance(world_size, (int, np.integer)) and world_size >= 1 and 0 <= rank < world_size):
            raise MatRISInputError(f"need world_size >= 1 and 0 <= rank < world_size, got rank={rank}, "
                                   f"world_size={world_size}.")
        problems = []
        for name, b in self.budgets.items():
            if name == "structures":
                continue
            over = sizes[name] > b
            if over.any():
                worst = int(np.argmax(sizes[name]))
                n_over = int(over.sum())
                problems.append(f"{counted(n_over, 'structure')} exceed{'s' if n_over == 1 else ''} max_{name}={b} "
                                f"(the largest, at position "
                                f"{worst}, has {int(sizes[name][worst])} {name})")
        if problems:
            raise MatRISInputError(
                "structures too large for one batch: " + "; ".join(problems) + ". Raise the budget to at least "
                "the largest structure, or filter those structures out of the dataset."
            )
        self._sizes = {name: sizes[name] for name in self.budgets if name != "structures"}
        self.shuffle, self.seed, self.rank, self.world_size = bool(shuffle), int(seed), int(rank), int(world_size)
        self.drop_last = bool(drop_last)
        self._mixture(groups, weights, epoch_size)
        self.epoch = 0
        self._start = 0  # batches of this epoch to skip at the next iteration
        self._yielded = 0  # batches of this epoch handed out so far
        self._cache: tuple[int, list[np.ndarray]] | None = None
        # Lightning calls set_epoch on ``loader.batch_sampler.sampler``, not on the batch sampler
        self.sampler = _EpochForwarder(self)

    def _mixture(self, groups: Any, weights: Any, epoch_size: int | None) -> None:
        self.groups = self.weights = None
        self.epoch_size = self.num_structures if epoch_size is None else epoch_size
        if int(self.epoch_size) != self.epoch_size or self.epoch_size < 1:
            raise MatRISInputError(f"epoch_size must be a positive integer, got {epoch_size!r}.")
        self.epoch_size = int(self.epoch_size)
        if groups is None and weights is None:
            if epoch_size is not None:
                raise MatRISInputError("epoch_size applies to a mixture; give groups and weights too.")
            return
        if groups is None or weights is None:
            raise MatRISInputError("a mixture needs both groups (dataset of each structure) and weights (one per "
                                   "dataset).")
        g = np.asarray(groups, dtype=np.int64).reshape(-1)
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        if g.size != self.num_structures:
            raise MatRISInputError(f"groups has {g.size} entries for {self.num_structures} structures; give one "
                                   "dataset number per structure.")
        if g.min() < 0 or g.max() >= w.size:
            raise MatRISInputError(f"groups must lie in [0, {w.size}) for {w.size} weights.")
        if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
            raise MatRISInputError(f"mixture weights must be finite, >= 0 and not all 0, got {w.tolist()}.")
        empty = [d for d in range(w.size) if w[d] > 0 and not (g == d).any()]
        if empty:
            which = f"dataset {empty[0]} has" if len(empty) == 1 else f"datasets {empty} have"
            raise MatRISInputError(f"{which} a weight but no structures in this split; give "
                                   f"{'it' if len(empty) == 1 else 'them'} data or weight 0.")
        if not self.shuffle:
            raise MatRISInputError("a weighted mixture is drawn at random; it needs shuffle=True.")
        self.groups, self.weights = g, w / w.sum()
        self._members = [np.flatnonzero(g == d) for d in range(w.size)]

    # -- the plan

    def epoch_order(self, epoch: int) -> np.ndarray:
        """``[epoch_size]`` positions in the order packed in ``epoch``."""
        if self.groups is not None:
            return self._mixture_order(epoch)
        if not self.shuffle:
            return np.arange(self.num_structures, dtype=np.int64)
        return np.random.default_rng(self.seed + epoch).permutation(self.num_structures).astype(np.int64)

    def _mixture_order(self, epoch: int) -> np.ndarray:
        which = np.random.default_rng([self.seed, epoch]).choice(self.weights.size, size=self.epoch_size,
                                                                 p=self.weights)
        order = np.empty(self.epoch_size, dtype=np.int64)
        for d, members in enumerate(self._members):
            slots = np.flatnonzero(which == d)
            if not slots.size:
                continue
            cycles = -(-slots.size // members.size)
            stream = [np.random.default_rng([self.seed, epoch, d, c]).permutation(members) for c in range(cycles)]
            order[slots] = np.concatenate(stream)[: slots.size]
        return order

    def all_batches(self, epoch: int) -> list[np.ndarray]:
        """Every batch of ``epoch`` before sharding (positions), in order."""
        order = self.epoch_order(epoch)
        s = order.size
        cums = [(np.concatenate([[0], np.cumsum(a[order])]), self.budgets[name]) for name, a in self._sizes.items()]
        max_structures = self.budgets.get("structures", s)
        batches, start = [], 0
        while start < s:
            end = min(s, start + max_structures)
            for c, b in cums:  # last end with c[end] − c[start] <= b
                end = min(end, int(np.searchsorted(c, c[start] + b, side="right")) - 1)
            end = max(end, start + 1)  # cannot happen after the size check; guards an infinite loop
            batches.append(order[start:end])
            start = end
        if self.drop_last and batches:
            batches.pop()
        return batches

    def rank_batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """The batches this rank yields in ``epoch`` (default: the current one), from the start."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        batches = self.all_batches(epoch)
        per_rank = len(batches) // self.world_size
        if per_rank == 0:
            raise MatRISInputError(
                f"epoch {epoch} packs into only {counted(len(batches), 'batch', 'batches')}, fewer than "
                f"world_size={self.world_size}; "
                "lower the budgets, use fewer ranks, or add data."
            )
        mine = batches[self.rank:: self.world_size][:per_rank]
        self._cache = (epoch, mine)
        return mine

    # -- iteration

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch``; a new epoch starts from its first batch."""
        epoch = int(epoch)
        if epoch != self.epoch:
            self._start = self._yielded = 0
        self.epoch = epoch

    def skip(self, n: int) -> None:
        """Start the next iteration after the first ``n`` batches of this rank's current epoch."""
        total = len(self.rank_batches())
        if not 0 <= int(n) <= total:
            raise MatRISInputError(f"cannot skip {n} batches: epoch {self.epoch} has {total} on this rank.")
        self._start = self._yielded = int(n)

    def __len__(self) -> int:
        """Batches the next iteration yields: this rank's epoch length minus any skipped."""
        return len(self.rank_batches()) - self._start

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.rank_batches()
        start = self._start
        self._yielded = start
        for batch in batches[start:]:
            self._yielded += 1
            yield batch.tolist()
        self._start = 0  # epoch finished; iterating again (or the next epoch) starts from the beginning

    # -- checkpointing

    def state_dict(self, batches_done: int | None = None) -> dict:
        """Epoch and batches consumed (default: the sampler's own count of batches yielded)."""
        return {
            "epoch": self.epoch,
            "batches_yielded": self._yielded if batches_done is None else int(batches_done),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
            "num_structures": self.num_structures,
            "budgets": dict(self.budgets),
            "drop_last": self.drop_last,
            "epoch_size": self.epoch_size,
            "weights": None if self.weights is None else self.weights.tolist(),
        }

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Resume at ``state``: the next iteration yields exactly the batches not yet seen.

        With ``strict`` a state saved with a different seed, world size, dataset size or
        budgets is an error (its remaining batches would not be the ones left unseen).
        """
        if strict:
            mine = self.state_dict()
            diff = [k for k in ("seed", "shuffle", "world_size", "num_structures", "budgets", "drop_last",
                                "epoch_size", "weights")
                    if k in state and state[k] != mine[k]]
            if diff:
                raise MatRISInputError(
                    "the sampler state was saved with different " + ", ".join(
                        f"{k} ({state[k]} then, {mine[k]} now)" for k in diff)
                    + "; resume with the same settings, or load with strict=False to restart the saved epoch's "
                    "remaining batch count on the new plan."
                )
        self.set_epoch(int(state["epoch"]))
        self._start = self._yielded = 0
        n = int(state["batches_yielded"])
        self.skip(n if strict else min(n, len(self.rank_batches())))


class _EpochForwarder:
    """``batch_sampler.sampler`` stand-in whose ``set_epoch`` reaches the batch sampler."""

    def __init__(self, owner: BudgetBatchSampler):
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)
