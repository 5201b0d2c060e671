"""Packed datasets: the memory-mapped arrays of packed directories (:mod:`matris.data.packing`
describes and writes them) and the batches gathered from them.

A batch is read from the memory maps of its structures only. :meth:`PackedDataset.collate`
returns the batch :meth:`GraphBatch.from_systems` builds of the same structures, field by
field and in the same order; without stored angles (``store_angles=False``) each batch's line
graph is rebuilt from the stored vesin bond lengths, identically.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from ..errors import MatRISInputError
from ..graph.batch import GraphBatch, line_graph
from ..graph.system import MAX_Z
from .labels import Targets
from .packing import (
    _KINDS,
    _LAYOUT,
    FORMAT_VERSION,
    LABELS,
    _array_names,
    _build,
    _check_cutoffs,
    _replace_dir,
)
from .readers import BadRecord, Sample


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each (s, c), vectorised."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(counts) - counts
    return np.repeat(np.asarray(starts, dtype=np.int64) - offsets, counts) + np.arange(total, dtype=np.int64)


@dataclass
class _Parts:
    """Arrays of a selection of structures, indices still local to each structure.

    counts: ``{"atom", "bond", "angle"}`` → ``[S]`` int64 per structure; arrays: name → rows
    (ragged by the kind in ``_LAYOUT``, or one row per structure).
    """

    counts: dict[str, np.ndarray]
    arrays: dict[str, np.ndarray]

    @staticmethod
    def concat(parts: Sequence["_Parts"]) -> "_Parts":
        keys = [sorted(p.arrays) for p in parts]
        if any(k != keys[0] for k in keys):
            raise MatRISInputError("cannot batch datasets built with and without store_angles together; "
                                   "build them all the same way.")
        return _Parts({k: np.concatenate([p.counts[k] for p in parts]) for k in _KINDS},
                      {k: np.concatenate([p.arrays[k] for p in parts]) for k in keys[0]})

    def take(self, order: np.ndarray) -> "_Parts":
        """The structures in ``order`` (positions into this selection)."""
        rows = {k: _ranges((np.cumsum(c) - c)[order], c[order]) for k, c in self.counts.items()}
        rows["structure"] = order
        return _Parts({k: c[order] for k, c in self.counts.items()},
                      {name: a[rows[_LAYOUT[name][0]]] for name, a in self.arrays.items()})


def _assemble(p: _Parts, dtype: torch.dtype, three_body_cutoff: float) -> tuple[GraphBatch, Targets]:
    """Global, offset indices exactly as :meth:`GraphBatch.from_systems` lays them out."""
    a = p.arrays
    na, nb = p.counts["atom"].astype(np.int64), p.counts["bond"].astype(np.int64)
    s = len(na)
    atom_off, bond_off = np.cumsum(na) - na, np.cumsum(nb) - nb
    n_b = int(nb.sum())
    bond_struct = np.repeat(np.arange(s), nb)
    bond_target = a["bond_i"].astype(np.int64) + atom_off[bond_struct]
    bond_source = a["bond_j"].astype(np.int64) + atom_off[bond_struct]
    atom_batch = torch.repeat_interleave(torch.arange(s), torch.from_numpy(na))
    if "angle_target_edge" in a:
        ng = p.counts["angle"].astype(np.int64)
        angle_struct = np.repeat(np.arange(s), ng)
        b_s, off = nb[angle_struct], bond_off[angle_struct]

        def edge(e: np.ndarray) -> np.ndarray:  # local directed edge → global (forward block, then reversed)
            e = e.astype(np.int64)
            return np.where(e < b_s, off + e, n_b + off + e - b_s)

        target_edge = torch.from_numpy(edge(a["angle_target_edge"]))
        source_edge = torch.from_numpy(edge(a["angle_source_edge"]))
        angle_atom = torch.from_numpy(np.concatenate([bond_target, bond_source])[target_edge.numpy()])
        n_angles = torch.from_numpy(ng)
    else:  # rebuilt from the stored vesin lengths: the same short bonds, the same order
        angle_atom, target_edge, source_edge = line_graph(
            torch.from_numpy(bond_target), torch.from_numpy(bond_source), torch.from_numpy(a["bond_length"]),
            three_body_cutoff, int(na.sum()))
        n_angles = torch.bincount(atom_batch[angle_atom], minlength=s)

    def t(x: np.ndarray, dt: torch.dtype | None = None) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(x))
        return x if dt is None else x.to(dt)

    graph = GraphBatch(
        atomic_numbers=t(a["atomic_numbers"], torch.int64),
        positions=t(a["positions"], dtype).reshape(-1, 3),
        cell=t(a["cell"], dtype).reshape(-1, 3, 3),
        pbc=t(a["pbc"]).reshape(-1, 3),
        atom_batch=atom_batch,
        n_atoms=torch.from_numpy(na),
        bond_target=t(bond_target),
        bond_source=t(bond_source),
        bond_image=t(a["bond_image"], dtype).reshape(-1, 3),
        n_bonds=torch.from_numpy(nb),
        angle_atom=angle_atom,
        angle_target_edge=target_edge,
        angle_source_edge=source_edge,
        n_angles=n_angles,
    )
    targets = Targets(energy=t(a["energy"], dtype), forces=t(a["forces"], dtype).reshape(-1, 3),
                      stress=t(a["stress"], dtype).reshape(-1, 3, 3), magmoms=t(a["magmoms"], dtype))
    return graph, targets


def _check_indices(indices: Sequence[int], n: int) -> np.ndarray:
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size == 0:
        raise MatRISInputError("collate got no structure indices; a batch needs at least one structure.")
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        raise IndexError(f"structure index {int(idx[bad][0])} out of range for a dataset of {n} structures.")
    return idx


class PackedDataset:
    """The packed graphs of ``S`` structures in a cache directory, memory-mapped on first use.

    Picklable and safe with DataLoader workers: pickling keeps only the directory; each
    process opens its own memory maps lazily. Use :func:`build_or_load` or
    :meth:`from_samples` to make one.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"{str(self.directory)!r} is not a MatRIS graph cache (no meta.json); make one with "
                "matris.data.build_or_load or PackedDataset.from_samples."
            )
        self.meta: dict = json.loads(meta_path.read_text())
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise MatRISInputError(
                f"{self.directory} was written in cache format {self.meta.get('format_version')}, this matris reads "
                f"format {FORMAT_VERSION}; delete it and build it again (build_or_load rebuilds it automatically)."
            )
        self.cutoff = float(self.meta["cutoff"])
        self.three_body_cutoff = float(self.meta["three_body_cutoff"])
        self.store_angles = bool(self.meta.get("store_angles", True))
        self._open()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._arrays: dict[str, np.ndarray] = {}

    def __getstate__(self) -> dict:
        return {"directory": str(self.directory), "meta": self.meta}  # no memory maps, no file handles

    def __setstate__(self, state: dict) -> None:
        self.directory = Path(state["directory"])
        self.meta = state["meta"]
        self.cutoff = float(self.meta["cutoff"])
        self.three_body_cutoff = float(self.meta["three_body_cutoff"])
        self.store_angles = bool(self.meta.get("store_angles", True))
        self._reset()  # maps are opened on first use in the new process

    def __repr__(self) -> str:
        m = self.meta
        return (f"PackedDataset({len(self)} structures, {m['n_atoms_total']} atoms, {m['n_bonds_total']} bonds, "
                f"{m['n_angles_total']} angles, cutoff={self.cutoff}, three_body_cutoff={self.three_body_cutoff}, "
                f"directory={str(self.directory)!r})")

    def _check_build(self) -> None:
        try:
            on_disk = json.loads((self.directory / "meta.json").read_text()).get("build_id")
        except (OSError, ValueError):
            on_disk = None
        if on_disk != self.meta.get("build_id"):
            raise MatRISInputError(
                f"the graph cache {self.directory} was rebuilt or removed (its source changed) while this dataset "
                "was in use; load it again with build_or_load and restart."
            )

    def _open(self) -> None:
        """Map every array of the entry at once, so that one process sees one consistent build."""
        self._reset()
        self._check_build()
        names = _array_names(self.store_angles) + [f"{k}_ptr" for k in _KINDS] + ["material_ids", "names"]
        for name in names:
            path = self.directory / f"{name}.npy"
            # mapped, pointers too: 8 bytes per structure each would be GBs per worker at OMat24 scale
            self._arrays[name] = np.load(path, mmap_mode="r")
        self._check_build()  # not swapped while we were opening

    def _arr(self, name: str) -> np.ndarray:
        if self._pid != os.getpid() or not self._arrays:  # a new process (worker): open our own maps
            self._open()
        return self._arrays[name]

    # -- sizes and labels

    def __len__(self) -> int:
        return int(self.meta["n_structures"])

    @property
    def n_atoms(self) -> np.ndarray:
        """``[S]`` int64 atoms per structure."""
        return np.diff(self._arr("atom_ptr"))

    @property
    def n_bonds(self) -> np.ndarray:
        """``[S]`` int64 bonds (undirected) per structure."""
        return np.diff(self._arr("bond_ptr"))

    @property
    def n_angles(self) -> np.ndarray:
        """``[S]`` int64 angles per structure."""
        return np.diff(self._arr("angle_ptr"))

    @property
    def material_ids(self) -> list[str]:
        """``[S]`` material id of each structure (for splitting by material)."""
        return self._arr("material_ids").tolist()

    @property
    def names(self) -> list[str]:
        return self._arr("names").tolist()

    @property
    def has_labels(self) -> dict[str, bool]:
        """Which labels any structure has: keys energy, forces, stress, magmoms."""
        return dict(self.meta["has_labels"])

    @property
    def n_skipped(self) -> int:
        """Structures of the source left out as invalid (``skip_invalid=True``)."""
        return int(self.meta.get("skipped", {}).get("count", 0))

    @property
    def energies(self) -> np.ndarray:
        """``[S]`` float64 total energies, eV; NaN where missing."""
        return np.array(self._arr("energy"))

    def atomic_numbers_of(self, i: int) -> np.ndarray:
        """``[n_atoms]`` int64 atomic numbers of structure ``i``."""
        ptr = self._arr("atom_ptr")
        i = int(_check_indices([i], len(self))[0])
        return np.asarray(self._arr("atomic_numbers")[ptr[i]: ptr[i + 1]], dtype=np.int64)

    def composition_matrix(self) -> np.ndarray:
        """``[S, 94]`` float64: column z−1 counts the atoms of element Z=z in each structure."""
        z = np.asarray(self._arr("atomic_numbers"), dtype=np.int64)
        structure = np.repeat(np.arange(len(self)), self.n_atoms)
        counts = np.bincount(structure * MAX_Z + (z - 1), minlength=len(self) * MAX_Z)
        return counts.reshape(len(self), MAX_Z).astype(np.float64)

    def system(self, i: int):
        """Structure ``i`` as an :class:`~matris.graph.AtomicSystem`."""
        from ..graph.system import AtomicSystem

        i = int(_check_indices([i], len(self))[0])
        a, b = self._arr("atom_ptr")[i: i + 2]
        return AtomicSystem(self._arr("positions")[a:b], self._arr("cell")[i], self._arr("pbc")[i],
                            self._arr("atomic_numbers")[a:b], str(self._arr("names")[i]))

    # -- batches

    def _gather(self, idx: np.ndarray) -> _Parts:
        counts, rows = {}, {"structure": idx}
        for kind in _KINDS:
            ptr = self._arr(f"{kind}_ptr")
            counts[kind] = ptr[idx + 1] - ptr[idx]
            rows[kind] = _ranges(ptr[idx], counts[kind])
        names = _array_names(self.store_angles)
        return _Parts(counts, {name: np.asarray(self._arr(name)[rows[_LAYOUT[name][0]]]) for name in names})

    def collate(self, indices: Sequence[int], dtype: torch.dtype = torch.float32) -> tuple[GraphBatch, Targets]:
        """The batch of structures ``indices`` (in that order) and their labels.

        The GraphBatch equals ``GraphBatch.from_systems`` of the same structures, field by
        field (floating fields in ``dtype``); Targets hold energy ``[S]`` eV, forces ``[N, 3]``
        eV/Å, stress ``[S, 3, 3]`` GPa and magmoms ``[N]`` μB in ``dtype``, NaN where missing.
        """
        return _assemble(self._gather(_check_indices(indices, len(self))), dtype, self.three_body_cutoff)

    # -- construction

    @staticmethod
    def from_samples(samples: Iterable[Sample | BadRecord], cutoff: float, three_body_cutoff: float,
                     directory: str | os.PathLike, skip_invalid: bool = False, progress: bool = False,
                     overwrite: bool = False, store_angles: bool = True, *, source: str | None = None,
                     first_index: int = 0, allow_empty: bool = False, build_id: str | None = None,
                     counter: Any = None, meta: dict | None = None) -> "PackedDataset":
        """Build the packed graphs of ``samples`` into ``directory`` (written atomically).

        The one way a packed directory is made: :func:`build_or_load` makes each shard of a
        cache entry with it. An existing ``directory`` is an error unless ``overwrite=True``;
        other options as in :func:`build_or_load`. ``samples`` may hold
        :class:`~matris.data.readers.BadRecord` entries (a reader's ``on_error="skip"``):
        skipped with ``skip_invalid``, else an error.

        The keyword-only options are those of a shard: ``source`` names where the samples
        come from in messages and default material ids (default: the directory's name);
        ``first_index`` is the record number of the first sample there; ``allow_empty``
        accepts a directory with no structure and leaves the warning about skipped records
        to the caller; ``build_id`` makes the directory depend on the samples only (same
        samples, same bytes; default a random id and a time stamp); ``counter`` (a
        ``multiprocessing.Value``) is incremented per record; ``meta`` is added to
        ``meta.json`` (default: no source path, no reader options).
        """
        _check_cutoffs(cutoff, three_body_cutoff)
        target = Path(directory).expanduser().resolve()
        if target.exists() and not overwrite:
            raise FileExistsError(f"{str(target)!r} already exists; pass overwrite=True or choose another directory.")
        target.parent.mkdir(parents=True, exist_ok=True)
        if progress and not isinstance(samples, Sized):
            samples = list(samples)  # its length is the progress bar's total
        total = len(samples) if isinstance(samples, Sized) else None
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            _build(samples, total, cutoff, three_body_cutoff, tmp, source or target.name, skip_invalid, progress,
                   store_angles, {"source": {"path": None}, "reader_options": {}} if meta is None else meta,
                   first_index=first_index, allow_empty=allow_empty, build_id=build_id, counter=counter)
            _replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return PackedDataset(target)


class MultiPacked:
    """Several :class:`PackedDataset` (e.g. the shards of several files) as one, with the same API.

    Global index g maps to (dataset d, local g − offset_d) in the order given. All parts must
    share the cutoffs.
    """

    def __init__(self, datasets: Sequence[PackedDataset]):
        # flattened: a cache entry (CachedDataset) contributes its shards
        self.datasets = [shard for d in datasets for shard in (d.datasets if isinstance(d, MultiPacked) else [d])]
        if not self.datasets:
            raise MatRISInputError("MultiPacked needs at least one dataset.")
        cut = {(d.cutoff, d.three_body_cutoff) for d in self.datasets}
        if len(cut) > 1:
            raise MatRISInputError(
                f"the datasets were built with different cutoffs {sorted(cut)}; build them all with the model's "
                "cutoff and three_body_cutoff."
            )
        self.cutoff, self.three_body_cutoff = cut.pop()
        if len({d.store_angles for d in self.datasets}) > 1:
            raise MatRISInputError("some datasets were built with store_angles=True and some with False; build them "
                                   "all the same way to batch them together.")
        self.store_angles = self.datasets[0].store_angles
        self.offsets = np.concatenate([[0], np.cumsum([len(d) for d in self.datasets])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"MultiPacked({len(self)} structures in {len(self.datasets)} datasets)"

    def locate(self, i: int) -> tuple[int, int]:
        """``(dataset number, local index)`` of global index ``i``."""
        i = int(_check_indices([i], len(self))[0])
        d = int(np.searchsorted(self.offsets, i, side="right") - 1)
        return d, i - int(self.offsets[d])

    @property
    def n_atoms(self) -> np.ndarray:
        return np.concatenate([d.n_atoms for d in self.datasets])

    @property
    def n_bonds(self) -> np.ndarray:
        return np.concatenate([d.n_bonds for d in self.datasets])

    @property
    def n_angles(self) -> np.ndarray:
        return np.concatenate([d.n_angles for d in self.datasets])

    @property
    def material_ids(self) -> list[str]:
        return [m for d in self.datasets for m in d.material_ids]

    @property
    def names(self) -> list[str]:
        return [m for d in self.datasets for m in d.names]

    @property
    def has_labels(self) -> dict[str, bool]:
        return {k: any(d.has_labels[k] for d in self.datasets) for k in LABELS}

    @property
    def energies(self) -> np.ndarray:
        return np.concatenate([d.energies for d in self.datasets])

    def atomic_numbers_of(self, i: int) -> np.ndarray:
        d, j = self.locate(i)
        return self.datasets[d].atomic_numbers_of(j)

    def system(self, i: int):
        d, j = self.locate(i)
        return self.datasets[d].system(j)

    def composition_matrix(self) -> np.ndarray:
        return np.concatenate([d.composition_matrix() for d in self.datasets])

    def collate(self, indices: Sequence[int], dtype: torch.dtype = torch.float32) -> tuple[GraphBatch, Targets]:
        """As :meth:`PackedDataset.collate`, over the combined index."""
        idx = _check_indices(indices, len(self))
        which = np.searchsorted(self.offsets, idx, side="right") - 1
        group = np.argsort(which, kind="stable")  # gather each dataset's structures in one go
        parts = [self.datasets[d]._gather(idx[which == d] - self.offsets[d]) for d in np.unique(which)]
        joined = _Parts.concat(parts) if len(parts) > 1 else parts[0]
        if len(parts) > 1:
            joined = joined.take(np.argsort(group))  # back to the requested order
        return _assemble(joined, dtype, self.three_body_cutoff)
