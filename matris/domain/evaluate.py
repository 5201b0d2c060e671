"""MatRIS on a domain decomposition: each rank evaluates its own atoms, bonds and angles, and the
ranks exchange, inside every block, what the block reads from the others (the method, its exchanges and their volume:
docs/lammps.md, "The domain decomposition").

A rank owns its atoms (LAMMPS's local atoms) and the angles centred on them, and computes every bond with an owned end
(a bond between two ranks on both); its ghost atoms need only reach one bond (LAMMPS's ghost cutoff r_c + skin).
:func:`evaluate` runs the model's own forward with a :class:`RankHalo` that its blocks call at the four
:data:`EXCHANGES`: the line-graph attention (a bond's softmax spans the angles at both its ends, which two ranks may
own: per end the aggregate ``T`` and log-sum-exp ``lse`` go from the end atom's owner to its ghost copies and are
merged, :func:`matris.kernels.merge_softmax`), the line-graph Refine (the plain sums, likewise), and after the
atom-graph attention and Refine (ghost features refreshed from their owners). The backward runs each exchange's
transpose (:func:`matris.domain.halo.forward_exchange`). Exact: the whole system's sums in another order. Bonds are
named across ranks by integers, ``t ← s`` by ``(tag_s, n_s − n_t)`` (:mod:`matris.domain.halo`); the owner of ``t``
lists the short edges ending at ``t`` by name (its *slots*), where ghost copies of ``t`` find theirs."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch

from ..graph.batch import GraphBatch, line_graph
from ..graph.neighbors import half_neighbor_list
from ..graph.system import AtomicSystem
from ..kernels import dispatch, merge_softmax
from .halo import Comm, forward_exchange, image_indices, refreshed

# where a block reads from other ranks: the exchanges of :func:`evaluate`, by step
EXCHANGES = ("line_attention", "atom_attention", "line_refine", "atom_refine")


@dataclass
class Subdomain:
    """What a rank holds, owned atoms first, then ghosts: positions ``[n, 3]`` Å (ghosts where the rank sees them:
    shifted images); atomic_numbers, tags ``[n]`` int64 (a tag names an atom on every rank); n_local: owned atoms."""

    positions: torch.Tensor
    atomic_numbers: torch.Tensor
    tags: torch.Tensor
    n_local: int


@dataclass
class RankGraph:
    """One rank's part of the atom graph and line graph, and its exchange plan.

    bond_target, bond_source: ``[B]`` bonds with an owned end (directed edge ``k`` is ``target ← source``, ``k + B``
    the reverse); angle_*: ``[A]`` the angles at owned atoms. short_bond: ``[S]`` the bonds no longer than r_3 (the
    only ones with angles); the line-graph sums run over their directed edges, numbered ``j`` (short bond ``j`` as
    ``target ← source``) and ``j + S``; angle_target_short, angle_source_short: ``[A]`` the angles' in that numbering.
    pack_*: ``[P]`` the short directed edges ending at owned atoms → (atom, slot) of the payload sent to ghost copies;
    unpack_*: ``[Q]`` those ending at ghosts ← (ghost, slot) received. n_slots: slots per atom, the most short bonds
    at any atom of any rank."""

    domain: Subdomain
    bond_target: torch.Tensor
    bond_source: torch.Tensor
    angle_atom: torch.Tensor
    angle_target_edge: torch.Tensor
    angle_source_edge: torch.Tensor
    short_bond: torch.Tensor
    angle_target_short: torch.Tensor
    angle_source_short: torch.Tensor
    pack_edge: torch.Tensor
    pack_atom: torch.Tensor
    pack_slot: torch.Tensor
    unpack_edge: torch.Tensor
    unpack_ghost: torch.Tensor
    unpack_slot: torch.Tensor
    n_slots: int

    @property
    def n_local(self) -> int:
        return self.domain.n_local

    def to(self, device: torch.device) -> "RankGraph":
        """The graph's index tensors on ``device`` (where the model runs; the graph is built on the host)."""
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **moved)

    @property
    def num_bonds(self) -> int:
        return int(self.bond_target.shape[0])

    @property
    def num_angles(self) -> int:
        return int(self.angle_atom.shape[0])

    @functools.cached_property
    def ends_without_angles(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``[2S, 1]`` bool per short directed edge: no angle here has it as target (first) or source (second) edge."""
        n_e = 2 * self.short_bond.shape[0]
        return tuple((torch.zeros(n_e, dtype=torch.int64, device=index.device).index_add_(
            0, index, torch.ones_like(index)) == 0).unsqueeze(1)
            for index in (self.angle_target_short, self.angle_source_short))


def build_graphs(domains: list[Subdomain], comm: Comm, cell: torch.Tensor, cutoff: float,
                 three_body_cutoff: float) -> list[RankGraph]:
    """Each rank's graph (bonds within ``cutoff`` with an owned end, angles within ``three_body_cutoff`` at owned
    atoms) and exchange plan; ``cell`` ``[3, 3]``: rows are the box's lattice vectors (Å). Collective: two exchanges."""
    pieces = []
    for d in domains:
        x = d.positions.detach().to(torch.float64).cpu().numpy()
        system = AtomicSystem(positions=x, cell=np.zeros((3, 3)), pbc=np.zeros(3, dtype=bool),
                              atomic_numbers=d.atomic_numbers.cpu().numpy())
        i, j, _, length = half_neighbor_list(system, cutoff)
        keep = np.minimum(i, j) < d.n_local
        dev = d.positions.device
        bt, bs = torch.from_numpy(i[keep]).to(dev), torch.from_numpy(j[keep]).to(dev)
        length = torch.from_numpy(length[keep]).to(dev)
        c, t_edge, s_edge = line_graph(bt, bs, length, three_body_cutoff, x.shape[0])
        own = c < d.n_local
        short = torch.nonzero(length <= three_body_cutoff).squeeze(1)  # the bonds that can have angles
        pieces.append((bt, bs, short, c[own], t_edge[own], s_edge[own]))
    images = image_indices(comm, [d.positions for d in domains], [d.n_local for d in domains], cell)

    named = []  # the short directed edges and their names (tag_s, n_s − n_t), sorted per target atom
    for d, (bt, bs, short, *_), n in zip(domains, pieces, images):
        edges = torch.arange(2 * short.shape[0], device=short.device)  # the short directed edges' numbers
        tgt = torch.cat([bt[short], bs[short]])
        src = torch.cat([bs[short], bt[short]])
        key = torch.cat([d.tags[src].unsqueeze(1), n[src] - n[tgt]], dim=1)  # [E, 4]
        order = _lexsort(torch.cat([tgt.unsqueeze(1), key], dim=1))
        edges, tgt, key = edges[order], tgt[order], key[order]
        first = torch.searchsorted(tgt, tgt, side="left")
        slot = torch.arange(tgt.shape[0], device=tgt.device) - first
        named.append((edges, tgt, key, slot))
    n_slots = int(comm.total([torch.tensor(int(s.max()) + 1 if s.numel() else 0) for *_, s in named], "max"))

    payload = []  # the owners' names by slot, to the ghost copies
    for d, (edges, tgt, key, slot) in zip(domains, named):
        buf = torch.full((d.n_local, max(n_slots, 1), 4), -1, dtype=torch.int64, device=tgt.device)
        own = tgt < d.n_local
        buf[tgt[own], slot[own]] = key[own]
        payload.append(buf)
    received = comm.forward(payload)

    graphs = []
    for d, (bt, bs, short, c, t_edge, s_edge), (edges, tgt, key, slot), names in zip(domains, pieces, named,
                                                                                       received):
        own = tgt < d.n_local
        ghost = ~own
        g_index = tgt[ghost] - d.n_local
        # each edge ending at a ghost: the slot of its owner's list with the same name
        match = (names[g_index] == key[ghost].unsqueeze(1)).all(-1)  # [Q, n_slots]
        found = match.any(-1)
        if not bool(found.all()):
            k = int(torch.nonzero(~found)[0])
            raise RuntimeError(
                f"domain decomposition: the owner of atom tag {int(d.tags[tgt[ghost][k]])} has no bond to tag "
                f"{int(key[ghost][k, 0])} (image {key[ghost][k, 1:].tolist()}): its ghost atoms must reach at least "
                f"one bond (ghost cutoff >= the model's cutoff)")
        n_b, n_s = bt.shape[0], short.shape[0]
        number = torch.full((2 * n_b,), -1, dtype=torch.int64, device=bt.device)
        number[torch.cat([short, short + n_b])] = torch.arange(2 * n_s, device=bt.device)
        graphs.append(RankGraph(
            domain=d, bond_target=bt, bond_source=bs, angle_atom=c, angle_target_edge=t_edge,
            angle_source_edge=s_edge, short_bond=short, angle_target_short=number[t_edge],
            angle_source_short=number[s_edge], pack_edge=edges[own], pack_atom=tgt[own], pack_slot=slot[own],
            unpack_edge=edges[ghost], unpack_ghost=g_index, unpack_slot=match.to(torch.int64).argmax(-1),
            n_slots=n_slots))
    return graphs


def _lexsort(rows: torch.Tensor) -> torch.Tensor:
    """The order that sorts the rows of an int64 matrix lexicographically (first column first)."""
    order = torch.arange(rows.shape[0], device=rows.device)
    for col in reversed(range(rows.shape[1])):
        order = order[torch.sort(rows[order, col], stable=True).indices]
    return order


def _exchange_edges(comm: Comm, graphs: list[RankGraph], values: list[list[torch.Tensor]], skip: bool
                    ) -> list[list[torch.Tensor]]:
    """Per rank, tensors ``[2B, w_k]`` of sums per directed edge (nonzero only for edges ending at owned atoms) → the
    same with the edges ending at ghosts filled from their owners: one exchange, a slot's rows side by side."""
    if skip:
        return values
    payload = []
    for g, vs in zip(graphs, values):
        rows = torch.cat([v.index_select(0, g.pack_edge) for v in vs], dim=1)
        buf = rows.new_zeros((g.n_local, max(g.n_slots, 1), rows.shape[1]))
        payload.append(buf.index_put((g.pack_atom, g.pack_slot), rows))
    received = forward_exchange(comm, payload)
    out = []
    for g, vs, r in zip(graphs, values, received):
        pieces = r[g.unpack_ghost, g.unpack_slot].split([v.shape[1] for v in vs], dim=1)
        out.append([v.index_copy(0, g.unpack_edge, p) for v, p in zip(vs, pieces)])
    return out


@dataclass
class RankResult:
    """One rank's share: ``energy`` (eV, its owned atoms'), ``atomic`` ``[n_local]`` eV; on all its atoms (ghosts'
    not yet sent to their owners) ``forces`` ``[n, 3]`` eV/Å, per-atom ``virial`` ``[n, 6]`` eV (xx yy zz xy xz yz)."""

    energy: float
    atomic: torch.Tensor
    forces: torch.Tensor
    virial: torch.Tensor


def evaluate(model, graphs: list[RankGraph], comm: Comm, skip: tuple[int, str] | None = None) -> list[RankResult]:
    """Energies, forces and virials of the ranks in ``graphs``: the model's own forward (:meth:`matris.MatRIS._energy`)
    on this process's ranks side by side, its blocks exchanging through a :class:`RankHalo`. Collective. ``skip`` =
    (block, step of :data:`EXCHANGES`): leave out that one exchange, to show that it is needed."""
    dtype, dev = model.dtype, model.device
    graphs = [g if g.bond_target.device == dev else g.to(dev) for g in graphs]
    has_angles = int(comm.total([torch.tensor(int(g.angle_atom.shape[0])) for g in graphs])) > 0
    halo = RankHalo(comm, graphs, has_angles, skip)
    batch = _side_by_side(graphs, dtype, dev)
    v = (batch.positions[batch.bond_target] - batch.positions[batch.bond_source]).detach().requires_grad_(True)
    owned = torch.cat([torch.arange(n, device=dev) + start for n, start in zip(halo.n_local, halo.atom_start)])
    with model._frozen_weights(), torch.enable_grad():
        atomic = model._energy(batch, batch.positions, None, 0, dispatch(dev, model.options.kernels)[0], bond_vectors=v,
                               halo=halo)[3]
        atomic = atomic.index_select(0, owned)
        (dv,) = torch.autograd.grad(atomic.sum(), [v], allow_unused=True, materialize_grads=True)
    results = []
    n_bonds = [g.num_bonds for g in graphs]
    for g, vr, dvr, at, ref in zip(graphs, v.split(n_bonds), dv.split(n_bonds), atomic.detach().split(halo.n_local),
                                   _atomic_reference(model, graphs, comm)):
        forces, virial = bond_forces_and_virials(vr, dvr, g.bond_target, g.bond_source, g.domain.positions.shape[0])
        results.append(RankResult(float((at + ref).sum()), at + ref, forces, virial))
    return results


def _side_by_side(graphs: list[RankGraph], dtype: torch.dtype, dev: torch.device) -> GraphBatch:
    """The ranks' graphs as one structure, atoms, bonds and angles rank after rank (a rank's directed edge ``k`` is
    ``start + k``, edge ``k + B`` is ``total + start + k``); positions as held (ghosts shifted: no periodic images)."""
    n_atoms = [g.domain.positions.shape[0] for g in graphs]
    n_bonds = [g.num_bonds for g in graphs]
    atom_start, bond_start = _starts(n_atoms), _starts(n_bonds)
    total = sum(n_bonds)

    def edge(g, k, start):  # a rank's directed edge numbers → the stacked ones
        return torch.where(k < g.num_bonds, k + start, k - g.num_bonds + total + start)

    cat = lambda xs: torch.cat(xs).to(dev)  # noqa: E731
    one = lambda n: torch.tensor([n], dtype=torch.int64, device=dev)  # noqa: E731
    n, b, a = sum(n_atoms), total, sum(int(g.angle_atom.shape[0]) for g in graphs)
    return GraphBatch(
        atomic_numbers=cat([g.domain.atomic_numbers for g in graphs]),
        positions=cat([g.domain.positions for g in graphs]).to(dtype),
        cell=torch.zeros(1, 3, 3, dtype=dtype, device=dev), pbc=torch.zeros(1, 3, dtype=torch.bool, device=dev),
        atom_batch=torch.zeros(n, dtype=torch.int64, device=dev), n_atoms=one(n),
        bond_target=cat([g.bond_target + s for g, s in zip(graphs, atom_start)]),
        bond_source=cat([g.bond_source + s for g, s in zip(graphs, atom_start)]),
        bond_image=torch.zeros(b, 3, dtype=dtype, device=dev), n_bonds=one(b),
        angle_atom=cat([g.angle_atom + s for g, s in zip(graphs, atom_start)]),
        angle_target_edge=cat([edge(g, g.angle_target_edge, s) for g, s in zip(graphs, bond_start)]),
        angle_source_edge=cat([edge(g, g.angle_source_edge, s) for g, s in zip(graphs, bond_start)]),
        n_angles=one(a))


def _starts(sizes: list[int]) -> list[int]:
    return [sum(sizes[:k]) for k in range(len(sizes))]


class RankHalo:
    """The exchanges of :func:`evaluate` as the blocks' hook (:class:`matris.model.block.HaloLines`) for this process's
    ranks side by side (:func:`_side_by_side`). Line-graph ends: each rank's short directed edges
    (``j`` and ``j + S`` the two ends of its short bond ``j``)."""

    def __init__(self, comm: Comm, graphs: list[RankGraph], has_angles: bool, skip: tuple[int, str] | None):
        self.comm, self.graphs, self.has_angles, self.skip, self.block = comm, graphs, has_angles, skip, 0
        self.n_local = [g.n_local for g in graphs]
        self.n_atoms = [g.domain.positions.shape[0] for g in graphs]
        self.atom_start = _starts(self.n_atoms)
        n_short = [int(g.short_bond.shape[0]) for g in graphs]
        self.n_rank_ends = [2 * s for s in n_short]
        end_start, bond_start = _starts(self.n_rank_ends), _starts([g.num_bonds for g in graphs])
        self.n_ends = sum(self.n_rank_ends)
        self.n_bonds = sum(g.num_bonds for g in graphs)
        self.angle_target_end = torch.cat([g.angle_target_short + s for g, s in zip(graphs, end_start)])
        self.angle_source_end = torch.cat([g.angle_source_short + s for g, s in zip(graphs, end_start)])
        self.short_bond = torch.cat([g.short_bond + s for g, s in zip(graphs, bond_start)])  # [S], stacked
        self.end_bond = torch.cat([g.short_bond.repeat(2) + s for g, s in zip(graphs, bond_start)])
        # each short bond's two ends, stacked: [S] each
        dev = self.short_bond.device
        self.first_end = torch.cat([torch.arange(k, device=dev) + s for k, s in zip(n_short, end_start)])
        self.second_end = torch.cat([torch.arange(k, device=dev) + s + k for k, s in zip(n_short, end_start)])
        self.empty = [torch.cat(x) for x in zip(*(g.ends_without_angles for g in graphs))]  # [n_ends, 1] each

    def _skipped(self, step: str) -> bool:
        return self.skip == (self.block, step)

    def _exchange(self, values: list[torch.Tensor], step: str) -> list[torch.Tensor]:
        """Per-end rows (nonzero at ends on owned atoms) → with the ends on ghosts filled from their owners."""
        per_rank = [list(x) for x in zip(*(v.split(self.n_rank_ends) for v in values))]
        out = _exchange_edges(self.comm, self.graphs, per_rank, self._skipped(step))
        return [torch.cat(x) for x in zip(*out)]

    def _to_bonds(self, short: torch.Tensor) -> torch.Tensor:
        return short.new_zeros((self.n_bonds, short.shape[1])).index_copy(0, self.short_bond, short)

    def line_softmax(self, t_agg, lse_t, s_agg, lse_s):
        inf = float("-inf")
        lse_t, lse_s = (torch.where(e, torch.full_like(x, inf), x) for e, x in zip(self.empty, (lse_t, lse_s)))
        t_agg, lse_t, s_agg, lse_s = self._exchange([t_agg, lse_t, s_agg, lse_s], "line_attention")
        return tuple(self._to_bonds(merge_softmax([(agg[ends], None, lse[ends]) for ends in (self.first_end,
                                                                                             self.second_end)]))
                     for agg, lse in ((t_agg, lse_t), (s_agg, lse_s)))

    def line_sums(self, sums):
        (sums,) = self._exchange([sums], "line_refine")
        return self._to_bonds(sums[self.first_end] + sums[self.second_end])

    def atoms(self, h, step):
        rows = refreshed(self.comm, list(h.split(self.n_atoms)), self.n_local, self._skipped(step))
        return torch.cat(rows)


def bond_forces_and_virials(v: torch.Tensor, dv: torch.Tensor, target: torch.Tensor, source: torch.Tensor,
                            n_atoms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Forces ``[N, 3]`` (eV/Å) and per-atom virials ``[N, 6]`` (eV; xx yy zz xy xz yz, as LAMMPS stores them) from
    bond vectors ``v = x_target − x_source`` ``[B, 3]`` and ``dv = ∂E/∂v``: force −∂E/∂v on the target, +∂E/∂v on the
    source; the virial ``W = −Σ_b v_b ⊗ ∂E/∂v_b`` goes half to each of a bond's atoms."""
    v, dv = v.detach(), dv.detach()
    forces = v.new_zeros((n_atoms, 3)).index_add_(0, target, -dv).index_add_(0, source, dv)
    w = -(v.unsqueeze(2) * dv.unsqueeze(1))  # [B, 3, 3]
    voigt = torch.stack([w[:, 0, 0], w[:, 1, 1], w[:, 2, 2], w[:, 0, 1], w[:, 0, 2], w[:, 1, 2]], dim=1) / 2
    virial = v.new_zeros((n_atoms, 6)).index_add_(0, target, voigt).index_add_(0, source, voigt)
    return forces, virial


def _atomic_reference(model, graphs: list[RankGraph], comm: Comm) -> list[torch.Tensor]:
    """Each owned atom's share of the reference energy (spec §6): its element's for intensive models; otherwise an
    equal share of the whole system's mean reference (two sums over ranks)."""
    z = [g.domain.atomic_numbers[: g.n_local].to(model.device) for g in graphs]
    if model.reference_energy is None:
        return [torch.zeros(len(x), dtype=model.dtype, device=model.device) for x in z]
    w = model.reference_energy.fc.weight[0].to(model.dtype)
    if model.config.is_intensive:
        return [w[x - 1] for x in z]
    n = comm.total([torch.tensor(float(len(x)), dtype=torch.float64) for x in z])
    total = comm.total([w[x - 1].sum().to(torch.float64).cpu() for x in z])
    share = (total / n / n).to(model.dtype)
    return [share.expand(len(x)).to(model.device) for x in z]
