"""The atom graph and line graph of a batch of structures (spec §2) as one typed object.

Layout. ``B`` bonds (undirected edges) of all structures, then their ``2B`` directed edges:
directed edge ``k < B`` is bond ``k`` as (target i, source j, image n) and ``k + B`` is the
same bond reversed (target j, source i, image −n), so ``d2u[k] = k mod B``. Angles are
records (atom c, target directed edge d_c, source directed edge d'); their target and
source bonds are ``d_c mod B`` and ``d' mod B``. Indices are global over the batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import numpy as np
import torch

from ..errors import MatRISInputError
from .neighbors import device_half_neighbor_list, half_neighbor_list
from .system import MIN_DISTANCE, AtomicSystem, overlap_error

_DEVICE_BUILDER = {"failed": None}


@functools.lru_cache(maxsize=1)
def _vesin_torch_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vesin_torch") is not None


def device_builder_available() -> bool:
    """Whether graphs can be built on a device: vesin's torch interface is installed and has
    not failed on this process's device (then the host builds, as on the CPU)."""
    return _DEVICE_BUILDER["failed"] is None and _vesin_torch_installed()


def device_builder_failed(exc: BaseException) -> None:
    """Fall back to building graphs on the host for the rest of the process, saying why once."""
    import warnings

    if isinstance(exc, torch.OutOfMemoryError):
        raise exc  # out of memory is no reason to stop building on the device
    _DEVICE_BUILDER["failed"] = f"{type(exc).__name__}: {exc}"
    warnings.warn(f"building graphs on the device failed ({str(exc)[:300]}); they are built on the host from now on "
                  "(correct, a little slower). Update vesin-torch to build them on the GPU.", RuntimeWarning,
                  stacklevel=3)


@dataclass
class GraphBatch:
    """Atom graph + line graph of ``S`` structures with ``N`` atoms, ``B`` bonds, ``A`` angles.

    Attributes:
        atomic_numbers: ``[N]`` int64.
        positions: ``[N, 3]`` Cartesian, Å.
        cell: ``[S, 3, 3]`` rows are lattice vectors, Å.
        pbc: ``[S, 3]`` bool.
        atom_batch: ``[N]`` int64, structure of each atom.
        n_atoms: ``[S]`` int64.
        bond_target, bond_source: ``[B]`` int64 atom indices (i, j) of each bond's forward edge.
        bond_image: ``[B, 3]`` image numbers n of the forward edge (float, dtype of positions).
        n_bonds: ``[S]`` int64.
        angle_atom: ``[A]`` int64, the shared atom c.
        angle_target_edge, angle_source_edge: ``[A]`` int64 directed edges d_c and d'.
        n_angles: ``[S]`` int64.
    """

    atomic_numbers: torch.Tensor
    positions: torch.Tensor
    cell: torch.Tensor
    pbc: torch.Tensor
    atom_batch: torch.Tensor
    n_atoms: torch.Tensor
    bond_target: torch.Tensor
    bond_source: torch.Tensor
    bond_image: torch.Tensor
    n_bonds: torch.Tensor
    angle_atom: torch.Tensor
    angle_target_edge: torch.Tensor
    angle_source_edge: torch.Tensor
    n_angles: torch.Tensor

    @property
    def num_structures(self) -> int:
        return int(self.n_atoms.shape[0])

    @property
    def num_atoms(self) -> int:
        return int(self.atomic_numbers.shape[0])

    @property
    def num_bonds(self) -> int:
        return int(self.bond_target.shape[0])

    @property
    def num_angles(self) -> int:
        return int(self.angle_atom.shape[0])

    @property
    def edge_target(self) -> torch.Tensor:
        """``[2B]`` target atom of each directed edge."""
        return torch.cat([self.bond_target, self.bond_source])

    @property
    def edge_source(self) -> torch.Tensor:
        """``[2B]`` source atom of each directed edge."""
        return torch.cat([self.bond_source, self.bond_target])

    @property
    def bond_batch(self) -> torch.Tensor:
        """``[B]`` structure of each bond."""
        return self.atom_batch[self.bond_target]

    def segments(self) -> tuple[tuple, tuple | None]:
        """CSR layouts of the atom graph and the line graph, each ``(by target, by source)``
        :class:`matris.kernels.Segments` (line graph: None without angles), for the fused
        aggregation. Built once per batch on its device, without host synchronisation, and
        reused by every block and every call: directed edges by source come from those by
        target without a second sort (edge ``k + B`` is edge ``k`` reversed)."""
        cached = self.__dict__.get("_segments")
        if cached is None:
            from ..kernels import Segments

            n_b = self.num_bonds
            by_target = Segments.from_index(self.edge_target, self.num_atoms)
            atom = (by_target, by_target.permuted(self.edge_source, n_b))
            line = None
            if self.num_angles:
                line = (Segments.from_index(self.angle_target_edge % n_b, n_b),
                        Segments.from_index(self.angle_source_edge % n_b, n_b))
            cached = self.__dict__["_segments"] = (atom, line)
        return cached

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "GraphBatch":
        """Move to ``device``; floating tensors (positions, cell, images) to ``dtype``."""
        out = {}
        for f in fields(self):
            t = getattr(self, f.name)
            out[f.name] = t.to(device=device, dtype=dtype if (dtype is not None and t.is_floating_point()) else None)
        moved = GraphBatch(**out)
        if "_segments" in self.__dict__ and moved.atomic_numbers.device == self.atomic_numbers.device:
            moved.__dict__["_segments"] = self.__dict__["_segments"]  # integer layouts: device-bound only
        return moved

    @staticmethod
    def from_systems(
        systems: list[AtomicSystem],
        cutoff: float,
        three_body_cutoff: float,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        validate: bool = True,
        index_offset: int = 0,
    ) -> "GraphBatch":
        """Build the graphs of ``systems`` (spec §2) and batch them with offset indices.

        cutoff: atom-graph cutoff r_c, Å; three_body_cutoff: line-graph cutoff r_3, Å.
        Raises :class:`MatRISInputError` for invalid structures, naming each by its position
        in the caller's list (``index_offset`` + position in ``systems``).
        """
        if len(systems) == 0:
            raise MatRISInputError("no structures given: pass at least one structure.")
        if torch.device(device).type != "cpu" and device_builder_available():
            # built where the model runs: no graph round trip through the host
            for k, system in enumerate(systems, start=index_offset):
                if validate:
                    system.validate(k)
            dev = torch.device(device)
            try:
                return GraphBatch.from_tensors(
                    torch.from_numpy(np.concatenate([s.positions for s in systems])).to(dev),
                    torch.from_numpy(np.stack([s.cell for s in systems])).to(dev),
                    torch.from_numpy(np.stack([s.pbc for s in systems])).to(dev),
                    torch.from_numpy(np.concatenate([s.atomic_numbers for s in systems])).to(dev),
                    [s.num_atoms for s in systems], cutoff, three_body_cutoff, dtype=dtype, validate=validate,
                    index_offset=index_offset, names=[s.name for s in systems])
            except RuntimeError as exc:  # a vesin build that cannot run on this device: the host builds
                device_builder_failed(exc)
        atom_offset = 0
        parts: dict[str, list] = {k: [] for k in ("i", "j", "n", "d", "nb")}
        for k, system in enumerate(systems, start=index_offset):
            if validate:
                system.validate(k)
            i, j, n, d = half_neighbor_list(system, cutoff)
            if validate and len(d) and d.min() < MIN_DISTANCE:
                m = int(np.argmin(d))
                raise overlap_error(system.label(k), i[m], j[m], d[m])
            parts["i"].append(i + atom_offset)
            parts["j"].append(j + atom_offset)
            parts["n"].append(n)
            parts["d"].append(d)
            parts["nb"].append(len(i))
            atom_offset += system.num_atoms

        def cat(key, dt):
            return torch.from_numpy(np.concatenate(parts[key]).astype(dt, copy=False))

        bond_target, bond_source = cat("i", np.int64), cat("j", np.int64)
        bond_image = cat("n", np.float64).reshape(-1, 3)
        bond_length = cat("d", np.float64)
        n_bonds = torch.tensor(parts["nb"], dtype=torch.int64)
        n_atoms = torch.tensor([s.num_atoms for s in systems], dtype=torch.int64)
        atom_batch = torch.repeat_interleave(torch.arange(len(systems)), n_atoms)
        angle_atom, angle_target_edge, angle_source_edge = line_graph(
            bond_target, bond_source, bond_length, three_body_cutoff, atom_offset
        )
        n_angles = torch.bincount(atom_batch[angle_atom], minlength=len(systems))
        graph = GraphBatch(
            atomic_numbers=torch.from_numpy(np.concatenate([s.atomic_numbers for s in systems])),
            positions=torch.from_numpy(np.concatenate([s.positions for s in systems])),
            cell=torch.from_numpy(np.stack([s.cell for s in systems])),
            pbc=torch.from_numpy(np.stack([s.pbc for s in systems])),
            atom_batch=atom_batch,
            n_atoms=n_atoms,
            bond_target=bond_target,
            bond_source=bond_source,
            bond_image=bond_image,
            n_bonds=n_bonds,
            angle_atom=angle_atom,
            angle_target_edge=angle_target_edge,
            angle_source_edge=angle_source_edge,
            n_angles=n_angles,
        )
        return graph.to(device=device, dtype=dtype)


    @staticmethod
    def from_tensors(
        positions: torch.Tensor,
        cell: torch.Tensor,
        pbc: torch.Tensor,
        atomic_numbers: torch.Tensor,
        n_atoms: list[int] | torch.Tensor,
        cutoff: float,
        three_body_cutoff: float,
        dtype: torch.dtype | None = None,
        validate: bool = True,
        index_offset: int = 0,
        names: list[str] | None = None,
    ) -> "GraphBatch":
        """Build the graphs on the device of ``positions`` (the GPU path: the neighbour list by
        vesin's torch interface, the line graph by vectorised tensor ops), the same graphs as
        :meth:`from_systems` builds on the host, edge for edge and angle for angle.

        positions: ``[N, 3]`` Å; cell: ``[S, 3, 3]`` rows; pbc: ``[S, 3]``, ``[3]`` or ``[]`` bool;
        atomic_numbers: ``[N]``; n_atoms: atoms per structure. ``dtype``: of the floating
        tensors (default: that of ``positions``). With ``validate``, atoms closer than
        0.1 Å raise :class:`MatRISInputError` (the other checks are on the structures).
        """
        dev = positions.device
        dtype = dtype or positions.dtype
        counts = [int(n) for n in (n_atoms.tolist() if isinstance(n_atoms, torch.Tensor) else n_atoms)]
        n_struct = len(counts)
        if n_struct == 0:
            raise MatRISInputError("no structures given: pass at least one structure.")
        cell = cell.reshape(n_struct, 3, 3)
        pbc = pbc.to(torch.bool)
        # one flag, or per direction
        pbc = (pbc.reshape(1, -1).expand(n_struct, 3) if pbc.dim() < 2 else pbc).contiguous()
        parts: dict[str, list] = {k: [] for k in ("i", "j", "n", "d")}
        n_bonds, start = [], 0
        for k, n in enumerate(counts):
            i, j, img, d = device_half_neighbor_list(positions[start:start + n], cell[k], pbc[k], cutoff)
            if validate and d.numel() and bool(d.min() < MIN_DISTANCE):
                m = int(torch.argmin(d))
                name = names[k] if names and names[k] else ""
                who = f"structure {k + index_offset}" + (f" ({name})" if name else "")
                raise overlap_error(who, i[m], j[m], d[m])
            parts["i"].append(i + start)
            parts["j"].append(j + start)
            parts["n"].append(img)
            parts["d"].append(d)
            n_bonds.append(i.shape[0])
            start += n
        bond_target, bond_source = torch.cat(parts["i"]), torch.cat(parts["j"])
        bond_length = torch.cat(parts["d"])
        n_atoms_t = torch.tensor(counts, dtype=torch.int64, device=dev)
        atom_batch = torch.repeat_interleave(torch.arange(n_struct, device=dev), n_atoms_t)
        angle_atom, angle_target_edge, angle_source_edge = line_graph(
            bond_target, bond_source, bond_length, three_body_cutoff, start)
        n_angles = torch.zeros(n_struct, dtype=torch.int64, device=dev).index_add_(
            0, atom_batch[angle_atom], torch.ones_like(angle_atom))
        return GraphBatch(
            atomic_numbers=atomic_numbers.to(device=dev, dtype=torch.int64),
            positions=positions.to(dtype),
            cell=cell.to(device=dev, dtype=dtype),
            pbc=pbc.to(dev),
            atom_batch=atom_batch,
            n_atoms=n_atoms_t,
            bond_target=bond_target,
            bond_source=bond_source,
            bond_image=torch.cat(parts["n"]).to(dtype).reshape(-1, 3),
            n_bonds=torch.tensor(n_bonds, dtype=torch.int64, device=dev),
            angle_atom=angle_atom,
            angle_target_edge=angle_target_edge,
            angle_source_edge=angle_source_edge,
            n_angles=n_angles,
        )


def line_graph(
    bond_target: torch.Tensor,
    bond_source: torch.Tensor,
    bond_length: torch.Tensor,
    three_body_cutoff: float,
    num_atoms: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Angles of spec §2: every ordered pair of distinct short directed edges sharing a target.

    A directed edge is short when its bond is no longer than r_3. Returns ``(atom c,
    target directed edge d_c, source directed edge d')``, each ``[A]`` int64, on the device of
    the bonds. Vectorised: edges are grouped by target and each group of k short edges yields
    its k·(k−1) ordered pairs.
    """
    n_b = bond_target.shape[0]
    short = torch.nonzero(bond_length <= three_body_cutoff).squeeze(1)
    edges = torch.cat([short, short + n_b])  # both directed copies of every short bond
    targets = torch.cat([bond_target[short], bond_source[short]])
    targets, order = torch.sort(targets, stable=True)
    edges = edges[order]
    dev = bond_target.device
    counts = torch.zeros(num_atoms, dtype=torch.int64, device=dev).index_add_(0, targets, torch.ones_like(targets))
    start = torch.cumsum(counts, 0) - counts  # first position of each atom's group
    k = counts[targets]  # group size of each sorted edge
    rows = torch.repeat_interleave(torch.arange(edges.shape[0], device=dev), k)
    # position of each pair inside its row, 0..k-1, gives the partner's position in the group
    row_start = torch.cumsum(k, 0) - k
    local = torch.arange(rows.shape[0], device=dev) - torch.repeat_interleave(row_start, k)
    cols = start[targets[rows]] + local
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    return targets[rows], edges[rows], edges[cols]
