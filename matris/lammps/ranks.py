"""Every rank of a domain decomposition in one process: what the LAMMPS pair style does across MPI
ranks, for tests and for checking a decomposition without MPI (:func:`simulate`).

:func:`split_system` cuts a structure into subdomains with their ghost atoms, as LAMMPS hands them
to the ranks; :class:`SimulatedComm` is the owner <-> ghost exchange between them
(:class:`matris.domain.halo.Comm`); the ranks run :func:`matris.domain.evaluate`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..domain import Subdomain, build_graphs, evaluate
from ..graph.neighbors import half_neighbor_list
from ..graph.system import AtomicSystem


class SimulatedComm:
    """Every rank in this process: ghost ``k`` of rank ``r`` is a copy of atom
    ``owner_index[r][k]`` of rank ``owner_rank[r][k]``.

    Args:
        n_local: owned atoms per rank.
        owner_rank, owner_index: per rank ``[n_ghost]`` int64.
    """

    def __init__(self, n_local: list[int], owner_rank: list[torch.Tensor], owner_index: list[torch.Tensor]):
        self.n_local = list(n_local)
        offsets = torch.tensor([0] + self.n_local[:-1], dtype=torch.int64).cumsum(0)
        # each ghost's owner as a row of all ranks' owned atoms stacked
        self.rows = [offsets[r.long()] + i.long() for r, i in zip(owner_rank, owner_index)]

    def forward(self, local: list[torch.Tensor]) -> list[torch.Tensor]:
        stacked = torch.cat(local)
        return [stacked.index_select(0, rows.to(stacked.device)) for rows in self.rows]

    def reverse(self, ghost: list[torch.Tensor]) -> list[torch.Tensor]:
        like = ghost[0]
        total = like.new_zeros((sum(self.n_local),) + tuple(like.shape[1:]))
        for rows, g in zip(self.rows, ghost):
            total.index_add_(0, rows.to(total.device), g)
        return list(total.split(self.n_local))

    def total(self, values: list[torch.Tensor], op: str = "sum") -> torch.Tensor:
        stacked = torch.stack([torch.as_tensor(v) for v in values])
        return stacked.sum(0) if op == "sum" else stacked.amax(0)


def split_system(positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, atomic_numbers: np.ndarray,
                 grid: tuple[int, int, int], ghost_cutoff: float) -> tuple[list[Subdomain], SimulatedComm]:
    """A periodic structure cut into ``grid`` = (px, py, pz) subdomains along its fractional
    coordinates, with each subdomain's ghost atoms (every image within ``ghost_cutoff`` of an owned
    atom), as LAMMPS would hand them to the ranks; and the :class:`SimulatedComm` that connects them.
    Tags are the atoms' indices."""
    positions = np.asarray(positions, dtype=np.float64)
    cell = np.asarray(cell, dtype=np.float64)
    grid_a = np.asarray(grid)
    frac = positions @ np.linalg.inv(cell)
    frac = np.where(np.asarray(pbc, dtype=bool), frac - np.floor(frac), np.clip(frac, 0, 1 - 1e-12))
    cellid = np.minimum((frac * grid_a).astype(np.int64), grid_a - 1)
    rank_of = (cellid[:, 0] * grid[1] + cellid[:, 1]) * grid[2] + cellid[:, 2]
    n_ranks = int(np.prod(grid))
    local_index = np.zeros(len(positions), dtype=np.int64)
    owned = [np.nonzero(rank_of == r)[0] for r in range(n_ranks)]
    for r, idx in enumerate(owned):
        local_index[idx] = np.arange(len(idx))
    system = AtomicSystem(positions=positions, cell=cell, pbc=pbc, atomic_numbers=atomic_numbers)
    i, j, n, _ = half_neighbor_list(system, ghost_cutoff)
    # the image of j at x_j + n·L is within reach of i, that of i at x_i − n·L within reach of j
    near = np.concatenate([i, j])
    far = np.concatenate([j, i])
    shift = np.concatenate([n, -n])
    domains, owner_rank, owner_index = [], [], []
    for r, idx in enumerate(owned):
        sel = rank_of[near] == r
        cand = np.concatenate([far[sel][:, None], shift[sel]], axis=1)
        cand = np.unique(cand, axis=0)
        is_self = (rank_of[cand[:, 0]] == r) & (cand[:, 1:] == 0).all(1)
        cand = cand[~is_self]
        ghost_atoms, ghost_shift = cand[:, 0], cand[:, 1:]
        x = np.concatenate([positions[idx], positions[ghost_atoms] + ghost_shift @ cell])
        tags = np.concatenate([idx, ghost_atoms])
        domains.append(Subdomain(positions=torch.from_numpy(x), atomic_numbers=torch.from_numpy(atomic_numbers[tags]),
                                 tags=torch.from_numpy(tags), n_local=len(idx)))
        owner_rank.append(torch.from_numpy(rank_of[ghost_atoms]))
        owner_index.append(torch.from_numpy(local_index[ghost_atoms]))
    return domains, SimulatedComm([len(x) for x in owned], owner_rank, owner_index)


def simulate(model, positions, cell, pbc, atomic_numbers, grid=(2, 1, 1), skin: float = 1.0,
             skip: tuple[int, str] | None = None) -> dict:
    """The whole structure's results from a domain decomposition run in this process (every rank in
    turn, :class:`SimulatedComm`): ``energy`` (eV), ``atomic`` ``[N]`` (eV), ``forces`` ``[N, 3]``
    (eV/Å), ``virial`` ``[N, 6]`` (eV) and ``stress`` ``[6]`` (eV/Å³, xx yy zz yz xz xy as ASE),
    in the order of ``positions``; ``ranks``: the atoms each rank owned. What the LAMMPS pair style
    does across MPI ranks, for checking a decomposition without MPI."""
    positions = np.asarray(positions, dtype=np.float64)
    atomic_numbers = np.asarray(atomic_numbers, dtype=np.int64)
    domains, comm = split_system(positions, cell, pbc, atomic_numbers, grid, model.cutoff + skin)
    graphs = build_graphs(domains, comm, torch.as_tensor(np.asarray(cell, dtype=np.float64)), model.cutoff,
                          model.three_body_cutoff)
    results = evaluate(model, graphs, comm, skip=skip)
    n_local = [d.n_local for d in domains]
    forces = [res.forces[:k] + gh for res, k, gh in zip(results, n_local, comm.reverse([x.forces[k:] for x, k in
                                                                                          zip(results, n_local)]))]
    virial = [res.virial[:k] + gh for res, k, gh in zip(results, n_local, comm.reverse([x.virial[k:] for x, k in
                                                                                          zip(results, n_local)]))]
    order = np.concatenate([d.tags[: d.n_local].numpy() for d in domains])
    out_f = np.zeros((len(positions), 3))
    out_w = np.zeros((len(positions), 6))
    out_a = np.zeros(len(positions))
    out_f[order] = torch.cat(forces).cpu().numpy()
    out_w[order] = torch.cat(virial).cpu().numpy()
    out_a[order] = torch.cat([res.atomic for res in results]).cpu().numpy()
    volume = abs(float(np.linalg.det(np.asarray(cell, dtype=np.float64))))
    w = out_w.sum(0)
    stress = -np.array([w[0], w[1], w[2], w[5], w[4], w[3]]) / volume
    return {"energy": float(out_a.sum()), "atomic": out_a, "forces": out_f, "virial": out_w, "stress": stress,
            "ranks": [int(k) for k in n_local]}
