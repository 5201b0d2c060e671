"""Ghost atoms, their identity across ranks, and the exchanges between owners and ghost copies.

A rank holds its *owned* atoms (``[0, n_local)``) and *ghost* atoms (``[n_local, n)``): periodic images or other
ranks' atoms within the ghost cutoff, as LAMMPS gives them. Data moves only between an owned atom and its ghost copies,
by LAMMPS's ``forward_comm`` and ``reverse_comm`` of a pair style: :meth:`Comm.forward` gives every ghost row its
owner's row (``[n_local, …]`` per rank → ``[n_ghost, …]``); :meth:`Comm.reverse`, the transpose, gives every owner
the sum of its ghost copies' rows. Both take a list with one entry per rank that *this process* runs: one in LAMMPS
(each MPI rank its own), all of them in :class:`matris.lammps.ranks.SimulatedComm` (tests, decompositions without MPI);
the model's code is the same in both. :func:`forward_exchange` is the forward operation as an autograd node whose
backward is the reverse one, so the force pass sends the ghost copies' gradients back to their owners.

Identity. A ghost is its owner's atom shifted by a lattice vector: its *image index* ``n`` (integers,
:func:`image_indices`) comes from exchanging the owners' positions once, so a bond is named on every rank by integers,
``(tag of the far atom, n_far − n_near)`` seen from its near atom, without comparing floating-point positions."""

from __future__ import annotations

from typing import Protocol

import torch


class Comm(Protocol):
    """Owner ↔ ghost exchanges for the ranks this process runs (see the module docstring)."""

    def forward(self, local: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per rank ``[n_local, *shape]`` → per rank ``[n_ghost, *shape]``: each ghost's owner's row."""
        ...

    def reverse(self, ghost: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per rank ``[n_ghost, *shape]`` → ``[n_local, *shape]``: each owned atom's copies' rows, summed over ranks."""
        ...

    def total(self, values: list[torch.Tensor], op: str = "sum") -> torch.Tensor:
        """The sum (``op="sum"``) or maximum (``"max"``) over all ranks of a per-rank tensor (MPI allreduce)."""
        ...


class _Forward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, comm, *local):
        ctx.comm = comm
        return tuple(comm.forward([t.detach() for t in local]))

    @staticmethod
    def backward(ctx, *grads):
        grads = [g.contiguous() for g in grads]
        return (None, *ctx.comm.reverse(grads))


def forward_exchange(comm: Comm, local: list[torch.Tensor]) -> list[torch.Tensor]:
    """:meth:`Comm.forward`, differentiable: ghost rows' gradients go back to their owners (the reverse exchange)."""
    if not any(t.requires_grad for t in local):
        return comm.forward(local)
    return list(_Forward.apply(comm, *local))


def refreshed(comm: Comm, rows: list[torch.Tensor], n_local: list[int], skip: bool = False) -> list[torch.Tensor]:
    """Per rank ``[n, d]`` atom rows with the ghost rows replaced by their owners' (differentiable).
    ``skip``: leave the ghost rows as they are (only to show that the exchange is needed)."""
    if skip:
        return rows
    ghosts = forward_exchange(comm, [x[:k] for x, k in zip(rows, n_local)])
    return [torch.cat([x[:k], gh]) for x, k, gh in zip(rows, n_local, ghosts)]


def image_indices(comm: Comm, positions: list[torch.Tensor], n_local: list[int], cell: torch.Tensor
                  ) -> list[torch.Tensor]:
    """Per rank ``[n, 3]`` int64: each atom's lattice shift from its owner (0 if owned),
    ``round((x_ghost − x_owner)·L⁻¹)`` (exact: ghosts are shifted by whole lattice vectors); ``cell`` ``[3, 3]``: rows
    are the lattice vectors."""
    owners = comm.forward([x[:k] for x, k in zip(positions, n_local)])
    inverse = torch.linalg.inv(cell.to(torch.float64))
    out = []
    for x, k, xo in zip(positions, n_local, owners):
        n = torch.zeros(x.shape[0], 3, dtype=torch.int64, device=x.device)
        if x.shape[0] > k:
            n[k:] = torch.round((x[k:].to(torch.float64) - xo.to(torch.float64)) @ inverse).to(torch.int64)
        out.append(n)
    return out
