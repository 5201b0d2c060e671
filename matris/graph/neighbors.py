"""Neighbour search: every pair of atoms within a cutoff, with periodic images (vesin)."""

from __future__ import annotations

import numpy as np

from .system import AtomicSystem


def half_neighbor_list(system: AtomicSystem, cutoff: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each bond once: ``(i, j, n, d)`` with ``|x_i − x_j − n·L| = d <= cutoff``.

    i, j: ``[B]`` int64 atom indices; n: ``[B, 3]`` int64 image numbers (zero along
    non-periodic directions); d: ``[B]`` float64 lengths, Å. A self-image pair (i, i, n) is
    listed once, for one of ±n. Cells smaller than the cutoff and mixed periodicity are
    handled by vesin; non-periodic systems need no box.
    """
    import vesin

    # vesin keeps d < cutoff; the spec includes d == cutoff, so search a hair wider and filter
    nl = vesin.NeighborList(cutoff=float(cutoff) * (1 + 1e-9) + 1e-12, full_list=False)
    box = np.where(system.pbc[:, None], system.cell, 0.0)
    if not system.pbc.any():
        box = np.zeros((3, 3))
    i, j, shifts, d = nl.compute(system.positions, box, system.pbc.tolist(), "ijSd")
    keep = d <= cutoff
    if not keep.all():
        i, j, shifts, d = i[keep], j[keep], shifts[keep], d[keep]
    return i.astype(np.int64), j.astype(np.int64), shifts.astype(np.int64), d
