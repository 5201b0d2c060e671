"""Packed, memory-mapped graphs: the on-disk format and batches read from it.

A cache entry (:mod:`matris.data.build`) is a set of shards; each shard is a directory of
``.npy`` arrays plus ``meta.json``, opened with ``np.load(mmap_mode="r")`` so that a batch
reads only its own pages. ``S`` structures with ``N`` atoms, ``B`` bonds and ``A`` angles in
total; per-structure ranges are given by the ``*_ptr`` arrays ``[S + 1]``:

==================  ==============  =====================================================
array               shape, dtype    meaning
==================  ==============  =====================================================
atomic_numbers      [N] int16
positions           [N, 3] f64      Å
cell                [S, 3, 3] f64   Å, rows are lattice vectors
pbc                 [S, 3] bool
bond_i, bond_j      [B] int32       target/source atom of the forward edge, local to the
                                    structure (as vesin returns them)
bond_image          [B, 3] int16    image numbers n of the forward edge
bond_length         [B] f64         Å, only with ``store_angles=False`` (see below)
angle_target_edge   [A] int32       directed edge d_c, local: e < B_s is forward bond e,
angle_source_edge   [A] int32       B_s <= e < 2 B_s is bond e − B_s reversed (only with
                                    ``store_angles=True``, the default)
atom_ptr, bond_ptr, [S + 1] int64
angle_ptr
energy              [S] f64         total energy, eV (NaN = missing)
forces              [N, 3] f64      eV/Å (NaN = missing)
stress              [S, 3, 3] f64   GPa, ASE sign (positive = tensile) (NaN = missing)
magmoms             [N] f64         μB (NaN = missing)
==================  ==============  =====================================================

``material_ids.npy`` and ``names.npy`` ``[S]`` (fixed-width unicode) hold one string per
structure. Bonds come from
:func:`~matris.graph.half_neighbor_list` and angles from :func:`~matris.graph.line_graph`
exactly as :meth:`GraphBatch.from_systems` builds them, so :meth:`PackedDataset.collate`
returns the same batch, field by field and in the same order. With ``store_angles=False``
the angle arrays are left out (they dominate the size) and each batch's line graph is
rebuilt from the stored vesin bond lengths at collate time, again identically; the angle
counts (``angle_ptr``) are kept for batching by budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import struct
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from ..errors import MatRISInputError, counted
from ..graph.batch import GraphBatch, line_graph
from ..graph.neighbors import half_neighbor_list
from ..graph.system import MAX_Z, MIN_DISTANCE, overlap_error
from ..settings import cache_home
from .labels import Targets
from .readers import BadRecord, Sample

FORMAT_VERSION = 1  # of one packed directory (a shard)
ENTRY_FORMAT = 2  # of a cache entry: shards + manifest (matris.data.build)
PROGRESS_THRESHOLD = 1000  # structures; smaller builds finish quickly without a bar
_IMAGE_MAX = np.iinfo(np.int16).max

# name → (kind, dtype, trailing shape) of the arrays written while building; kind "atom",
# "bond", "angle" rows are ragged (ranges from the *_ptr arrays), "structure" has one row each
_LAYOUT = {
    "atomic_numbers": ("atom", np.int16, ()),
    "positions": ("atom", np.float64, (3,)),
    "forces": ("atom", np.float64, (3,)),
    "magmoms": ("atom", np.float64, ()),
    "bond_i": ("bond", np.int32, ()),
    "bond_j": ("bond", np.int32, ()),
    "bond_image": ("bond", np.int16, (3,)),
    "bond_length": ("bond", np.float64, ()),  # only without stored angles, to rebuild them exactly
    "angle_target_edge": ("angle", np.int32, ()),
    "angle_source_edge": ("angle", np.int32, ()),
    "cell": ("structure", np.float64, (3, 3)),
    "pbc": ("structure", np.bool_, (3,)),
    "energy": ("structure", np.float64, ()),
    "stress": ("structure", np.float64, (3, 3)),
}
_KINDS = ("atom", "bond", "angle")
LABELS = ("energy", "forces", "stress", "magmoms")


def _array_names(store_angles: bool) -> list[str]:
    skip = {"bond_length"} if store_angles else {"angle_target_edge", "angle_source_edge"}
    return [name for name in _LAYOUT if name not in skip]


# ----------------------------------------------------------------------------- cache location


def default_cache_dir() -> Path:
    """``$MATRIS_CACHE/graphs``, else ``$XDG_CACHE_HOME/matris/graphs``, else ``~/.cache/matris/graphs``."""
    return cache_home("graphs")


def cache_entry_name(source_path: str | os.PathLike, cutoff: float, three_body_cutoff: float,
                     reader_options: dict | None = None, skip_invalid: bool = False,
                     store_angles: bool = True) -> str:
    """``<stem>-<hash>``: the hash covers the absolute source path, the cutoffs, the reader
    options and the cache format version, so any of them changing gives a new entry."""
    src = Path(source_path).expanduser().resolve()
    payload = json.dumps(
        {"source": str(src), "cutoff": float(cutoff), "three_body_cutoff": float(three_body_cutoff),
         "reader_options": reader_options or {}, "skip_invalid": bool(skip_invalid),
         "store_angles": bool(store_angles), "format": ENTRY_FORMAT},
        sort_keys=True, default=repr,
    )
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", src.stem)[:60] or "data"
    return f"{stem}-{hashlib.sha256(payload.encode()).hexdigest()[:20]}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (POSIX ``flock``); without fcntl, concurrent builders race
    harmlessly: the loser of the final rename discards its copy."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _replace_dir(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` to ``target``: readers see the old entry or the new one, never half."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)  # open memory maps of the old entry stay valid
    try:
        os.rename(tmp, target)
    except OSError:
        if not target.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another builder won the race; its entry is equivalent
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------- building


class _NpyWriter:
    """Appends rows to a ``.npy`` file whose length is unknown in advance.

    A fixed-size header is reserved and rewritten with the final shape on close, so
    building streams to disk instead of holding the whole dataset in memory.
    """

    HEADER = 128

    def __init__(self, path: Path, dtype: Any, tail: tuple[int, ...] = ()):
        self.dtype, self.tail, self.rows = np.dtype(dtype), tuple(tail), 0
        self.f = open(path, "wb", buffering=1 << 20)
        self.f.write(b"\0" * self.HEADER)

    def append(self, a: Any) -> None:
        a = np.ascontiguousarray(a, dtype=self.dtype).reshape((-1,) + self.tail)
        self.f.write(a.tobytes())
        self.rows += a.shape[0]

    def close(self) -> None:
        d = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
             "shape": (self.rows,) + self.tail}
        text = repr(d).encode("latin1")
        n = self.HEADER - 10  # after magic (6), version (2) and length (2)
        header = b"\x93NUMPY\x01\x00" + struct.pack("<H", n) + text + b" " * (n - len(text) - 1) + b"\n"
        self.f.seek(0)
        self.f.write(header)
        self.f.close()


def _prepare(sample: Sample, k: int, cutoff: float, three_body_cutoff: float) -> dict[str, np.ndarray]:
    """Validated graph and labels of one structure, local indices (spec §2, as GraphBatch.from_systems)."""
    system = sample.system
    system.validate(k)
    n = system.num_atoms
    i, j, image, d = half_neighbor_list(system, cutoff)
    if len(d) and d.min() < MIN_DISTANCE:
        m = int(np.argmin(d))
        raise overlap_error(system.label(k), i[m], j[m], d[m])
    if len(image) and np.abs(image).max() > _IMAGE_MAX:
        raise MatRISInputError(f"{system.label(k)}: bond image numbers exceed {_IMAGE_MAX}; the cell is far too "
                               "thin for the cutoff. Fix the cell.")
    _, te, se = line_graph(torch.from_numpy(i), torch.from_numpy(j), torch.from_numpy(d), three_body_cutoff, n)

    def label(value, shape, name, unit):
        if value is None:
            return np.full(shape, np.nan)
        v = np.asarray(value, dtype=np.float64)
        if v.size != math.prod(shape):
            raise MatRISInputError(f"{system.label(k)}: {name} has shape {v.shape}, expected {shape} ({unit}); "
                                   "fix the labels of this structure.")
        return v.reshape(shape)

    return {
        "atomic_numbers": system.atomic_numbers, "positions": system.positions,
        "cell": system.cell, "pbc": system.pbc,
        "bond_i": i, "bond_j": j, "bond_image": image, "bond_length": d,
        "angle_target_edge": te.numpy(), "angle_source_edge": se.numpy(),
        "energy": np.float64(sample.energy),
        "forces": label(sample.forces, (n, 3), "forces", "eV/Å"),
        "stress": label(sample.stress, (3, 3), "stress", "GPa"),
        "magmoms": label(sample.magmoms, (n,), "magmoms", "μB"),
    }


def _build(samples: Iterable[Sample], total: int | None, cutoff: float, three_body_cutoff: float, out: Path,
           source_label: str, skip_invalid: bool, progress: bool, store_angles: bool, meta_extra: dict, *,
           first_index: int = 0, allow_empty: bool = False, build_id: str | None = None,
           counter: Any = None) -> dict:
    """Write the cache arrays of ``samples`` into the (new, empty) directory ``out``.

    ``first_index`` is the record number of the first sample in its source (for messages);
    ``samples`` may hold :class:`~matris.data.readers.BadRecord` entries (a reader's
    ``on_error="skip"``), counted as skipped. ``build_id`` makes the entry deterministic (a
    shard: same input → same bytes); default a random id and a time stamp. ``counter``: a
    ``multiprocessing.Value`` incremented per record (progress of a parallel build).
    """
    out.mkdir(parents=True)
    writers = {name: _NpyWriter(out / f"{name}.npy", _LAYOUT[name][1], _LAYOUT[name][2])
               for name in _array_names(store_angles)}
    counts: dict[str, list[int]] = {"atom": [], "bond": [], "angle": []}
    material_ids: list[str] = []
    names: list[str] = []
    has = dict.fromkeys(LABELS, False)
    skipped: list[tuple[int, str]] = []
    bar = None
    try:
        for k, sample in enumerate(samples, start=first_index):
            if counter is not None:
                with counter.get_lock():
                    counter.value += 1
            if isinstance(sample, BadRecord):
                if not skip_invalid:
                    raise MatRISInputError(f"{source_label}: record {sample.index}: {sample.message}")
                skipped.append((sample.index, sample.message))
                continue
            if progress and bar is None and k >= PROGRESS_THRESHOLD:
                from tqdm.auto import tqdm

                bar = tqdm(total=total, initial=k, desc=f"building graphs of {source_label}", unit=" structures")
            if bar is not None:
                bar.update(1)
            try:
                arrays = _prepare(sample, k, cutoff, three_body_cutoff)
            except MatRISInputError as e:
                if not skip_invalid:
                    raise MatRISInputError(
                        f"{source_label}: {e} (or build with skip_invalid=True to leave invalid structures out)"
                    ) from None
                skipped.append((k, str(e)))
                continue
            for name, w in writers.items():
                w.append(arrays[name])
            counts["atom"].append(len(arrays["atomic_numbers"]))
            counts["bond"].append(len(arrays["bond_i"]))
            counts["angle"].append(len(arrays["angle_target_edge"]))
            material_ids.append(sample.material_id or f"{source_label}:{k}")
            names.append(sample.name or sample.system.name)
            has["energy"] |= bool(np.isfinite(sample.energy))
            has["forces"] |= sample.forces is not None
            has["stress"] |= sample.stress is not None
            has["magmoms"] |= sample.magmoms is not None
    finally:
        for w in writers.values():
            w.close()
        if bar is not None:
            bar.close()
    n_structures = len(material_ids)
    if n_structures == 0 and not allow_empty:
        extra = f" ({len(skipped)} were invalid and skipped; first: {skipped[0][1]})" if skipped else ""
        raise MatRISInputError(f"{source_label}: no structures to build graphs of{extra}; check the file.")
    if skipped and not allow_empty:  # a shard's skips are reported once, by the whole build
        warnings.warn(
            f"{source_label}: skipped {counted(len(skipped), 'invalid structure')} of {n_structures + len(skipped)} "
            f"(skip_invalid=True); first: {skipped[0][1]}",
            stacklevel=3,
        )
    for kind, c in counts.items():
        np.save(out / f"{kind}_ptr.npy", np.concatenate([[0], np.cumsum(c, dtype=np.int64)]).astype(np.int64))
    np.save(out / "material_ids.npy", np.array(material_ids, dtype=str))
    np.save(out / "names.npy", np.array(names, dtype=str))
    meta = {
        "format_version": FORMAT_VERSION,
        "cutoff": float(cutoff),
        "three_body_cutoff": float(three_body_cutoff),
        "n_structures": n_structures,
        "n_atoms_total": int(sum(counts["atom"])),
        "n_bonds_total": int(sum(counts["bond"])),
        "n_angles_total": int(sum(counts["angle"])),
        "store_angles": bool(store_angles),
        "has_labels": has,
        "skipped": {"count": len(skipped), "first": [{"index": k, "error": e} for k, e in skipped[:20]]},
        "units": {"energy": "eV (total)", "forces": "eV/Å", "stress": "GPa, ASE sign (positive = tensile)",
                  "magmoms": "μB", "positions": "Å"},
        **({"build_id": uuid.uuid4().hex, "built_at": time.time()} if build_id is None else {"build_id": build_id}),
        **meta_extra,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def _check_cutoffs(cutoff: float, three_body_cutoff: float) -> None:
    if not (math.isfinite(cutoff) and math.isfinite(three_body_cutoff) and 0 < three_body_cutoff <= cutoff):
        raise MatRISInputError(
            f"need finite cutoffs with 0 < three_body_cutoff <= cutoff, got cutoff={cutoff} and "
            f"three_body_cutoff={three_body_cutoff} (Å); use the model's pairwise and three-body cutoffs."
        )


# ----------------------------------------------------------------------------- reading


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

    # -- construction from memory

    @staticmethod
    def from_samples(samples: Iterable[Sample], cutoff: float, three_body_cutoff: float,
                     directory: str | os.PathLike, skip_invalid: bool = False, progress: bool = False,
                     overwrite: bool = False, store_angles: bool = True) -> "PackedDataset":
        """Build the packed graphs of in-memory ``samples`` into ``directory`` (written atomically).

        An existing ``directory`` is an error unless ``overwrite=True``; other options as in
        :func:`build_or_load`.
        """
        _check_cutoffs(cutoff, three_body_cutoff)
        target = Path(directory).expanduser().resolve()
        if target.exists() and not overwrite:
            raise FileExistsError(f"{str(target)!r} already exists; pass overwrite=True or choose another directory.")
        target.parent.mkdir(parents=True, exist_ok=True)
        samples = list(samples) if not isinstance(samples, list) else samples
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            _build(samples, len(samples), cutoff, three_body_cutoff, tmp, target.name, skip_invalid, progress,
                   store_angles,
                   {"source": {"path": None}, "reader_options": {}})
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
