"""The graph of one structure in the layout of the official MatRIS package (``RadiusGraph``).

Scripts written for the official MatRIS 1.0 build these with ``model.graph_converter(structure)``
and pass lists of them to ``model([graph, ...], task=...)``; this module gives them the same class
with the same fields, and turns a list of them into our :class:`~matris.graph.GraphBatch`, so one
model computes both. The layout (official names; ``E`` directed edges, ``U = E / 2`` bonds, ``A``
angles):

- ``atom_graph``: ``[E, 2]`` int32 rows ``(center, neighbor)``; the edge vector is
  ``x_center − (x_neighbor + image · lattice)``;
- ``neighbor_image``: ``[E, 3]`` image numbers (float); ``directed2undirected``: ``[E]`` bond of each
  directed edge; ``undirected2directed``: ``[U]`` one directed edge of each bond (its forward edge);
- ``line_graph``: ``[A, 5]`` int32 rows ``(center atom, bond of the target edge, target directed
  edge, bond of the source edge, source directed edge)``;
- ``atomic_number`` ``[N]``, ``atom_frac_coord`` ``[N, 3]``, ``lattice`` ``[3, 3]`` (rows, Å).

Our batch numbers directed edge ``k < B`` as bond ``k`` forward and ``k + B`` as its reverse
(:mod:`matris.graph.batch`); :func:`graphs_to_batch` maps any valid official numbering onto that one.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
from torch import Tensor

from ..errors import MatRISInputError

#: the official module's default dtype of graph coordinates (``matris.graph.datatype``)
datatype = torch.float32


class RadiusGraph:
    """One structure's atom graph and line graph, with the official MatRIS fields (module docstring).

    ``pbc`` (ours, optional): ``[3]`` bool periodicity; None (official graphs) counts as periodic in
    every direction, which only decides whether a stress is reported.
    """

    def __init__(
        self,
        graph_id: str | None,
        mp_id: str | None,
        composition: str | None,
        atomic_number: Tensor,
        atom_frac_coord: Tensor,
        lattice: Tensor,
        neighbor_image: Tensor,
        atom_graph: Tensor,
        atom_graph_cutoff: float,
        line_graph: Tensor,
        line_graph_cutoff: float,
        directed2undirected: Tensor,
        undirected2directed: Tensor,
        pbc: Tensor | None = None,
    ):
        if len(directed2undirected) != 2 * len(undirected2directed):
            raise MatRISInputError(
                f"RadiusGraph: {len(directed2undirected)} directed edges but {len(undirected2directed)} bonds; "
                "every bond "
                "has two directed edges (build graphs with model.graph_converter(structure))")
        self.graph_id = graph_id
        self.mp_id = mp_id
        self.composition = composition
        self.atomic_number = atomic_number
        self.atom_frac_coord = atom_frac_coord
        self.lattice = lattice
        self.neighbor_image = neighbor_image
        self.atom_graph = atom_graph
        self.atom_graph_cutoff = atom_graph_cutoff
        self.line_graph = line_graph
        self.line_graph_cutoff = line_graph_cutoff
        self.directed2undirected = directed2undirected
        self.undirected2directed = undirected2directed
        self.pbc = pbc

    _TENSORS = ("atomic_number", "atom_frac_coord", "lattice", "neighbor_image", "atom_graph", "line_graph",
                "directed2undirected", "undirected2directed")

    def to(self, device: str | torch.device = "cpu") -> "RadiusGraph":
        """A copy on ``device``."""
        fields = self.to_dict()
        for name in self._TENSORS:
            fields[name] = fields[name].to(device)
        return RadiusGraph(**fields, pbc=self.pbc)

    def to_dict(self) -> dict[str, Any]:
        """The official fields by name (``RadiusGraph(**d)`` rebuilds it)."""
        return {"graph_id": self.graph_id, "mp_id": self.mp_id, "composition": self.composition,
                **{name: getattr(self, name) for name in self._TENSORS},
                "atom_graph_cutoff": self.atom_graph_cutoff, "line_graph_cutoff": self.line_graph_cutoff}

    def save(self, fname: str | None = None, save_dir: str = ".") -> str:
        """Write :meth:`to_dict` with ``torch.save`` to ``save_dir/fname`` (default: ``<graph_id>.pt``,
        else ``<composition>.pt``), through a temporary file; returns the path."""
        from ..atomic import atomic_path

        name = fname if fname is not None else f"{self.graph_id if self.graph_id is not None else self.composition}.pt"
        path = os.path.join(save_dir, name)
        with atomic_path(path, suffix=".tmp") as tmp:
            torch.save(self.to_dict(), tmp)
        return path

    @classmethod
    def from_file(cls, file_name: str | os.PathLike) -> "RadiusGraph":
        """A graph written by :meth:`save` (this package's or the official one's)."""
        return cls(**torch.load(file_name, weights_only=True))

    @classmethod
    def from_dict(cls, dic: dict[str, Any]) -> "RadiusGraph":
        return cls(**dic)

    @property
    def num_atoms(self) -> int:
        return int(self.atomic_number.shape[0])

    def __repr__(self) -> str:
        return (f"RadiusGraph(composition={self.composition!r}, atom_graph_cutoff={self.atom_graph_cutoff}, "
                f"line_graph_cutoff={self.line_graph_cutoff}, n_atoms={self.num_atoms}, "
                f"atom_graph_len={len(self.atom_graph)}, line_graph_len={len(self.line_graph)})")


def batch_to_graph(batch, k: int = 0, **ids: Any) -> RadiusGraph:
    """Structure ``k`` of a :class:`~matris.graph.GraphBatch` as a :class:`RadiusGraph`
    (official numbering: directed edge ``u`` is bond ``u`` forward, ``u + U`` its reverse).
    Coordinates keep the batch's dtype. ``ids``: ``graph_id``, ``mp_id``, ``composition``."""
    a0 = int(batch.n_atoms[:k].sum())
    b0 = int(batch.n_bonds[:k].sum())
    c0 = int(batch.n_angles[:k].sum())
    n, n_b, n_a = int(batch.n_atoms[k]), int(batch.n_bonds[k]), int(batch.n_angles[k])
    total_b = batch.num_bonds
    i = batch.bond_target[b0:b0 + n_b] - a0
    j = batch.bond_source[b0:b0 + n_b] - a0
    image = batch.bond_image[b0:b0 + n_b]
    cell = batch.cell[k]
    positions = batch.positions[a0:a0 + n]

    def local(edge):  # a global directed edge of the batch → this graph's official numbering
        bond = edge % total_b - b0 if total_b else edge
        return torch.where(edge >= total_b, bond + n_b, bond)

    tgt = local(batch.angle_target_edge[c0:c0 + n_a])
    src = local(batch.angle_source_edge[c0:c0 + n_a])
    line = torch.stack([batch.angle_atom[c0:c0 + n_a] - a0, tgt % max(n_b, 1), tgt, src % max(n_b, 1), src], 1)
    pbc = batch.pbc[k]
    lattice = _complete(cell)
    frac = torch.linalg.solve(lattice.mT, positions.mT).mT
    bonds = torch.arange(n_b, dtype=torch.int32, device=i.device)
    return RadiusGraph(
        graph_id=ids.get("graph_id"), mp_id=ids.get("mp_id"), composition=ids.get("composition"),
        atomic_number=batch.atomic_numbers[a0:a0 + n].to(torch.int32),
        atom_frac_coord=frac, lattice=lattice,
        neighbor_image=torch.cat([image, -image]),
        atom_graph=torch.cat([torch.stack([i, j], 1), torch.stack([j, i], 1)]).to(torch.int32),
        atom_graph_cutoff=ids.get("atom_graph_cutoff"),
        line_graph=line.to(torch.int32), line_graph_cutoff=ids.get("line_graph_cutoff"),
        directed2undirected=torch.cat([bonds, bonds]), undirected2directed=bonds, pbc=pbc.clone(),
    )


def _complete(cell: Tensor) -> Tensor:
    """``cell`` with its missing (zero) vectors replaced by unit vectors normal to the others, so
    that fractional coordinates exist (a molecule, or a slab given without its third vector);
    images are zero along those directions, so the choice changes no edge."""
    missing = cell.norm(dim=1) < 1e-12
    if not bool(missing.any()):
        return cell
    out = cell.clone()
    # right-singular vectors of the zero singular values span what the given vectors do not
    basis = torch.linalg.svd(cell.to(torch.float64)).Vh[-int(missing.sum()):].to(cell.dtype)
    out[missing] = basis
    return out


def graphs_to_batch(graphs: Sequence[RadiusGraph], device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None):
    """A :class:`~matris.graph.GraphBatch` of official-layout graphs (any valid numbering of their
    directed edges), on ``device`` in ``dtype`` (default: the first graph's). Cartesian positions
    are ``atom_frac_coord @ lattice`` in the graphs' dtype, as the official code computes them."""
    from .batch import GraphBatch

    if isinstance(graphs, RadiusGraph):
        graphs = [graphs]
    if len(graphs) == 0:
        raise MatRISInputError("no graphs given: pass a list of at least one RadiusGraph "
                               "(model.graph_converter(structure))")
    for k, g in enumerate(graphs):
        if not isinstance(g, RadiusGraph):
            raise MatRISInputError(f"graph {k} is a {type(g).__name__}, not a RadiusGraph; build graphs with "
                                   "model.graph_converter(structure)")
    device = torch.device(device) if device is not None else graphs[0].lattice.device
    parts: dict[str, list[Tensor]] = {k: [] for k in ("z", "x", "cell", "pbc", "i", "j", "n", "c", "t", "s")}
    counts: dict[str, list[int]] = {"atoms": [], "bonds": [], "angles": []}
    atoms = bonds = 0
    for g in graphs:
        d2u = g.directed2undirected.to(device, torch.int64)
        u2d = g.undirected2directed.to(device, torch.int64)
        edges = g.atom_graph.to(device, torch.int64)
        n_b = int(u2d.shape[0])
        # our numbering of each official directed edge: its bond if it is the bond's forward edge, else bond + B
        forward = u2d[d2u] == torch.arange(d2u.shape[0], device=device)
        ours = torch.where(forward, d2u, d2u + n_b)
        lattice = g.lattice.to(device)
        parts["z"].append(g.atomic_number.to(device, torch.int64))
        parts["x"].append(g.atom_frac_coord.to(device).detach() @ lattice.detach())
        parts["cell"].append(lattice.detach())
        pbc = torch.ones(3, dtype=torch.bool) if g.pbc is None else torch.as_tensor(g.pbc, dtype=torch.bool)
        parts["pbc"].append(pbc.reshape(3).to(device))
        parts["i"].append(edges[u2d, 0] + atoms)
        parts["j"].append(edges[u2d, 1] + atoms)
        parts["n"].append(g.neighbor_image.to(device)[u2d])
        line = g.line_graph.to(device, torch.int64).reshape(-1, 5)
        parts["c"].append(line[:, 0] + atoms)
        parts["t"].append(ours[line[:, 2]])
        parts["s"].append(ours[line[:, 4]])
        counts["atoms"].append(int(g.atomic_number.shape[0]))
        counts["bonds"].append(n_b)
        counts["angles"].append(int(line.shape[0]))
        atoms += counts["atoms"][-1]
        bonds += n_b
    # the directed edges of each graph were numbered within it: shift to the batch's 2B numbering
    total = bonds
    first = 0
    for k, n_b in enumerate(counts["bonds"]):
        for key in ("t", "s"):
            e = parts[key][k]
            parts[key][k] = torch.where(e >= n_b, e - n_b + total, e) + first
        first += n_b
    dtype = dtype or graphs[0].atom_frac_coord.dtype
    n_atoms = torch.tensor(counts["atoms"], dtype=torch.int64, device=device)
    return GraphBatch(
        atomic_numbers=torch.cat(parts["z"]),
        positions=torch.cat(parts["x"]).to(dtype),
        cell=torch.stack(parts["cell"]).to(dtype),
        pbc=torch.stack(parts["pbc"]),
        atom_batch=torch.repeat_interleave(torch.arange(len(graphs), device=device), n_atoms),
        n_atoms=n_atoms,
        bond_target=torch.cat(parts["i"]),
        bond_source=torch.cat(parts["j"]),
        bond_image=torch.cat(parts["n"]).to(dtype).reshape(-1, 3),
        n_bonds=torch.tensor(counts["bonds"], dtype=torch.int64, device=device),
        angle_atom=torch.cat(parts["c"]),
        angle_target_edge=torch.cat(parts["t"]),
        angle_source_edge=torch.cat(parts["s"]),
        n_angles=torch.tensor(counts["angles"], dtype=torch.int64, device=device),
    )


__all__ = ["RadiusGraph", "batch_to_graph", "graphs_to_batch", "datatype"]
