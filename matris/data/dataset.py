"""A torch Dataset over packed graphs, for use with :class:`torch.utils.data.DataLoader`."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..errors import MatRISInputError
from .batching import BudgetBatchSampler
from .cache import MultiPacked, PackedDataset


class GraphDataset(torch.utils.data.Dataset):
    """A subset of a :class:`PackedDataset` (or :class:`MultiPacked`) as a torch Dataset.

    Item ``i`` is the global structure index ``indices[i]``; batching happens in the packed
    dataset's :meth:`~matris.data.PackedDataset.collate`, which gathers the whole batch from
    the memory maps at once::

        ds = GraphDataset(packed, train_indices)
        loader = DataLoader(ds, batch_sampler=ds.batch_sampler(max_atoms=4096, seed=0),
                            collate_fn=packed.collate, num_workers=4)
        for graph, targets in loader: ...

    Positions ``0..len(ds)-1`` are what a batch sampler yields; :attr:`n_atoms` etc. are
    given per position, in that order.
    """

    def __init__(self, packed: PackedDataset | MultiPacked, indices: Sequence[int] | np.ndarray | None = None):
        self.packed = packed
        n = len(packed)
        self.indices = (np.arange(n, dtype=np.int64) if indices is None
                        else np.asarray(indices, dtype=np.int64).reshape(-1))
        if self.indices.size and (self.indices.min() < 0 or self.indices.max() >= n):
            raise MatRISInputError(f"GraphDataset indices must lie in [0, {n}); got {self.indices.min()}.."
                                   f"{self.indices.max()}. Use indices of the packed dataset.")

    def __len__(self) -> int:
        return int(self.indices.size)

    def __getitem__(self, i: int) -> int:
        return int(self.indices[i])

    @property
    def n_atoms(self) -> np.ndarray:
        """``[len(self)]`` int64 atoms of each position."""
        return self.packed.n_atoms[self.indices]

    @property
    def n_bonds(self) -> np.ndarray:
        return self.packed.n_bonds[self.indices]

    @property
    def n_angles(self) -> np.ndarray:
        return self.packed.n_angles[self.indices]

    def batch_sampler(self, **options: Any) -> BudgetBatchSampler:
        """A :class:`BudgetBatchSampler` over this dataset's positions (options: budgets, seed, rank, ...)."""
        return BudgetBatchSampler(self.n_atoms, self.n_bonds, self.n_angles, **options)
