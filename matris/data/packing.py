"""The on-disk format of packed graphs, and writing it (read by :mod:`matris.data.cache`).

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
structure. Bonds come from :func:`~matris.graph.half_neighbor_list` and angles from
:func:`~matris.graph.line_graph` exactly as :meth:`GraphBatch.from_systems` builds them, so
:meth:`~matris.data.cache.PackedDataset.collate` returns the same batch, field by field and
in the same order. With ``store_angles=False`` the angle arrays are left out (they dominate
the size) and each batch's line graph is rebuilt from the stored vesin bond lengths at
collate time, again identically; the angle counts (``angle_ptr``) are kept for batching by
budget.

A packed directory is written in one way: :meth:`~matris.data.cache.PackedDataset.from_samples`
(:func:`_build` into a temporary directory, then a rename), which
:func:`~matris.data.build_or_load` calls for every shard.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from ..errors import MatRISInputError, counted
from ..graph.batch import line_graph
from ..graph.neighbors import half_neighbor_list
from ..graph.system import MIN_DISTANCE, overlap_error
from .readers import BadRecord, Sample

FORMAT_VERSION = 1  # of one packed directory (a shard)
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


# ----------------------------------------------------------------------------- building


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
