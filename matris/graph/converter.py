"""``GraphConverter``: structures → :class:`~matris.graph.radiusgraph.RadiusGraph`, as the official
MatRIS package's ``model.graph_converter(structure)`` does, built by our neighbour search (vesin)
and line-graph construction (:meth:`matris.graph.GraphBatch.from_systems`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from .radiusgraph import RadiusGraph, batch_to_graph

MODES = ("fast", "torch")


class GraphConverter(nn.Module):
    """Build the :class:`RadiusGraph` of a pymatgen ``Structure`` (or ASE ``Atoms``, or ``Molecule``).

    ``atom_graph_cutoff`` r_c and ``line_graph_cutoff`` r_3 in Å (None: r_c). ``dtype``: of the
    graph's coordinates (float32 as in the official package; ``model.graph_converter`` uses the
    model's). Graphs are built on the host and moved with ``graph.to(device)``; ``mode`` is
    accepted for the official signature (both modes build the same graph).
    """

    def __init__(self, atom_graph_cutoff: float = 6, line_graph_cutoff: float | None = 4, verbose: bool = False,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.atom_graph_cutoff = atom_graph_cutoff
        self.line_graph_cutoff = atom_graph_cutoff if line_graph_cutoff is None else line_graph_cutoff
        self.dtype = dtype
        if verbose:
            print(self)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(atom_graph_cutoff={self.atom_graph_cutoff}, "
                f"line_graph_cutoff={self.line_graph_cutoff})")

    def forward(self, structure: Any, graph_id: str | None = None, mp_id: str | None = None,
                atomic_numbers: Any = None, frac_coords: Any = None, lattice_matrix: Any = None,
                cart_coords: Any = None, *, mode: str = "fast",
                device: str | torch.device | None = None) -> RadiusGraph:
        """The graph of ``structure``; ``atomic_numbers`` ``[N]``, ``frac_coords`` ``[N, 3]``,
        ``lattice_matrix`` ``[3, 3]`` (rows, Å) and ``cart_coords`` ``[N, 3]`` (Å), when given,
        replace the structure's own. ``device``: where the graph's tensors go (default: the CPU)."""
        from .batch import GraphBatch
        from .system import AtomicSystem

        if mode not in MODES:
            raise ValueError(f"Unknown mode {mode!r}; choose 'fast' or 'torch'.")
        base = _system(structure)
        numbers = base.atomic_numbers if atomic_numbers is None else np.asarray(atomic_numbers, dtype=np.int64)
        cell = base.cell if lattice_matrix is None else _numpy(lattice_matrix).reshape(3, 3)
        if frac_coords is not None:
            frac = _numpy(frac_coords).reshape(-1, 3)
            positions = frac @ cell if cart_coords is None else _numpy(cart_coords).reshape(-1, 3)
        else:
            positions = base.positions if cart_coords is None else _numpy(cart_coords).reshape(-1, 3)
            frac = None
        system = AtomicSystem(positions, cell, base.pbc, numbers, base.name)
        batch = GraphBatch.from_systems([system], float(self.atom_graph_cutoff), float(self.line_graph_cutoff),
                                        dtype=torch.float64)
        composition = getattr(getattr(structure, "composition", None), "formula", None) or base.name
        graph = batch_to_graph(batch, graph_id=graph_id, mp_id=mp_id, composition=composition,
                               atom_graph_cutoff=self.atom_graph_cutoff, line_graph_cutoff=self.line_graph_cutoff)
        if frac is not None and abs(np.linalg.det(cell)) > 1e-12:
            graph.atom_frac_coord = torch.from_numpy(frac)  # the given ones, as the official converter keeps them
        for name in ("atom_frac_coord", "lattice", "neighbor_image"):
            setattr(graph, name, getattr(graph, name).to(self.dtype))
        return graph if device is None else graph.to(device)

    def as_dict(self) -> dict[str, float]:
        return {"atom_graph_cutoff": self.atom_graph_cutoff, "line_graph_cutoff": self.line_graph_cutoff}

    @classmethod
    def from_dict(cls, config: dict) -> "GraphConverter":
        return cls(**config)


def _system(structure: Any):
    """The arrays of a pymatgen ``Structure``/``Molecule`` or ASE ``Atoms`` (read by their
    attributes: the graph package imports neither library)."""
    from .system import AtomicSystem

    if isinstance(structure, AtomicSystem):
        return structure
    if hasattr(structure, "get_positions") and hasattr(structure, "pbc"):  # ase.Atoms
        return AtomicSystem(structure.get_positions(), np.asarray(structure.cell[:]), structure.pbc,
                            structure.get_atomic_numbers(), structure.get_chemical_formula())
    if hasattr(structure, "cart_coords") and hasattr(structure, "composition"):  # pymatgen
        numbers = [getattr(site.specie, "Z", 0) for site in structure]
        name = structure.composition.reduced_formula
        lattice = getattr(structure, "lattice", None)
        if lattice is None:  # a Molecule
            return AtomicSystem(structure.cart_coords, np.zeros((3, 3)), False, numbers, name)
        # a pymatgen Lattice may be periodic in some directions only
        return AtomicSystem(structure.cart_coords, lattice.matrix, getattr(lattice, "pbc", True), numbers, name)
    raise TypeError("GraphConverter takes a pymatgen Structure or Molecule or ASE Atoms, "
                    f"got {type(structure).__name__}")


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


__all__ = ["GraphConverter", "MODES"]
