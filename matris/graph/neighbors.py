"""Neighbour search: every pair of atoms within a cutoff, with periodic images (vesin)."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from .system import AtomicSystem


def half_neighbor_list(system: AtomicSystem, cutoff: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each bond once: ``(i, j, n, d)`` with ``|x_i − x_j − n·L| = d <= cutoff``.

    i, j: ``[B]`` int64 atom indices; n: ``[B, 3]`` int64 image numbers (zero along
    non-periodic directions); d: ``[B]`` float64 lengths, Å. A self-image pair (i, i, n) is
    listed once, for one of ±n. Cells smaller than the cutoff and mixed periodicity are
    handled by vesin; non-periodic systems need no box. Without vesin installed (e.g. a GPU
    image), :func:`torch_half_neighbor_list` gives the same list.
    """
    try:
        import vesin
    except ImportError:
        return torch_half_neighbor_list(system, cutoff)

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


def torch_half_neighbor_list(system: AtomicSystem, cutoff: float, device: str | torch.device | None = None,
                             chunk: int = 4096) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The same list as :func:`half_neighbor_list` by brute force over periodic images.

    O(N² · images), chunked; runs on ``device`` (default: CUDA when available). Used when
    vesin is not installed, and as an independent check of it in the tests.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    pos = torch.as_tensor(system.positions, dtype=torch.float64, device=device)
    cell = torch.as_tensor(system.cell, dtype=torch.float64, device=device)
    ranges = []
    for k in range(3):
        if system.pbc[k]:
            recip = np.linalg.pinv(system.cell[system.pbc]).T  # rows: reciprocal vectors of periodic directions
            width = 1 / np.linalg.norm(recip[list(np.flatnonzero(system.pbc)).index(k)])
            nk = int(np.ceil(cutoff / width))
            ranges.append(range(-nk, nk + 1))
        else:
            ranges.append(range(1))
    n = pos.shape[0]
    out_i, out_j, out_n, out_d = [], [], [], []
    for image in itertools.product(*ranges):
        img = torch.tensor(image, dtype=torch.float64, device=device)
        positive = image > (0, 0, 0)  # canonical copy of a self-image bond: n lexicographically > 0
        shifted = pos + img @ cell
        for start in range(0, n, chunk):
            d = torch.cdist(pos[start : start + chunk], shifted)  # |x_i − (x_j + n·L)|
            i, j = torch.nonzero(d <= cutoff, as_tuple=True)
            i = i + start
            keep = (i < j) | ((i == j) & positive)
            i, j = i[keep], j[keep]
            out_i.append(i)
            out_j.append(j)
            out_d.append(d[i - start, j])
            out_n.append(img.to(torch.int64).expand(i.shape[0], 3))
    i = torch.cat(out_i).cpu().numpy()
    j = torch.cat(out_j).cpu().numpy()
    shifts = torch.cat(out_n).cpu().numpy().reshape(-1, 3)
    d = torch.cat(out_d).cpu().numpy()
    return i.astype(np.int64), j.astype(np.int64), shifts.astype(np.int64), d


def device_half_neighbor_list(positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, cutoff: float
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`half_neighbor_list` on tensors, computed on their device (vesin's torch interface,
    which runs on CUDA tensors too): ``(i, j, n, d)`` as int64, int64 ``[B, 3]`` and float64
    tensors on that device. positions: ``[N, 3]``; cell: ``[3, 3]`` rows; pbc: ``[3]`` bool.
    Raises :class:`~matris.errors.MissingExtraError` (an ``ImportError``) without ``vesin-torch``.
    """
    from ..extras import require

    NeighborList = require("vesin_torch", "gpu", "building graphs on the device", package="vesin-torch").NeighborList

    # vesin reads raw memory: every input contiguous (an expanded pbc view would be read as garbage)
    pos = positions.detach().to(torch.float64).contiguous()
    periodic = pbc.to(device=pos.device, dtype=torch.bool).reshape(3).contiguous()
    box = torch.where(periodic[:, None], cell.detach().to(device=pos.device, dtype=torch.float64),
                      torch.zeros((), dtype=torch.float64, device=pos.device)).contiguous()
    nl = NeighborList(cutoff=float(cutoff) * (1 + 1e-9) + 1e-12, full_list=False)  # as the host search
    try:
        i, j, shifts, d = nl.compute(points=pos, box=box, periodic=periodic, quantities="ijSd")
    except RuntimeError:
        if periodic.device.type == "cpu":
            raise
        # builds that want the three flags on the host
        i, j, shifts, d = nl.compute(points=pos, box=box, periodic=periodic.cpu(), quantities="ijSd")
    keep = d <= cutoff
    return i[keep].to(torch.int64), j[keep].to(torch.int64), shifts[keep].to(torch.int64), d[keep]
