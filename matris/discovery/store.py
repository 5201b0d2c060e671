"""Where relaxation results live: one append-only JSON-lines file per shard, and the run manifest.

``DIR/shard-I-of-N.jsonl`` gets one line per structure, written and fsynced as soon as the
structure is done, so a killed shard loses at most the structures it was working on. On
restart the file is read back, a last line cut short by the kill is dropped (and cut from the
file), and the structures already there are skipped. ``DIR/manifest.json`` records the
protocol (model, fmax, steps, …), the shard count and every material id of the run; a shard
started with different settings in the same folder is refused, and :func:`merge_results`
uses the ids to report what is missing.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Sequence

import numpy as np

from ..atomic import write_json
from ..errors import MatRISInputError
from ..extras import require
from .shards import Shard

MANIFEST = "manifest.json"
# manifest keys that must agree between shards of one run (the rest are informational)
PROTOCOL_KEYS = ("model", "dtype", "fmax", "steps", "optimizer", "cell_filter", "shards", "structures", "limit",
                 "n_structures", "protocol")

try:  # POSIX; elsewhere a second process on the same shard is not detected
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


@dataclass
class RelaxRecord:
    """The relaxation of one structure.

    energy: final total energy, eV (uncorrected model energy; None if it failed).
    cell: ``[3, 3]`` lattice vectors as rows, Å. positions: ``[N, 3]`` Cartesian, Å.
    numbers: atomic numbers. fmax: largest atomic/cell force at the end, eV/Å. steps: optimizer
    steps (None for the batched engine). error: why it failed (None if it did not).
    engine: "ase" or "torch-sim". seconds: wall time spent on it (a batch's time is shared out
    by atom count).
    """

    KIND: ClassVar[str] = "relaxation"
    material_id: str
    energy: float | None
    cell: list
    positions: list
    numbers: list
    fmax: float | None = None
    steps: int | None = None
    converged: bool | None = None
    error: str | None = None
    engine: str = ""
    seconds: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def natoms(self) -> int:
        return len(self.numbers)

    @property
    def ok(self) -> bool:
        return self.error is None and self.energy is not None and math.isfinite(self.energy)

    @property
    def energy_per_atom(self) -> float:
        return float("nan") if not self.ok else self.energy / self.natoms

    def to_json(self) -> str:
        data = asdict(self)
        if not data["extra"]:
            data.pop("extra")
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict) -> "RelaxRecord":
        return cls(**{k: data[k] for k in data if k in cls.__dataclass_fields__})

    @classmethod
    def from_atoms(cls, material_id: str, atoms, energy: float | None, **kwargs) -> "RelaxRecord":
        """A record of ``atoms`` (its cell, positions and numbers)."""
        return cls(material_id=str(material_id), energy=None if energy is None else float(energy),
                   cell=np.round(np.asarray(atoms.cell[:], float), 10).tolist(),
                   positions=np.round(atoms.get_positions(), 10).tolist(),
                   numbers=[int(z) for z in atoms.get_atomic_numbers()], **kwargs)

    def atoms(self):
        """The final structure as ASE Atoms (periodic)."""
        from ase import Atoms

        return Atoms(numbers=self.numbers, positions=self.positions, cell=self.cell, pbc=True,
                     info={"material_id": self.material_id})

    def structure(self):
        """The final structure as a pymatgen Structure."""
        require("pymatgen", "discovery", "relaxed structures as pymatgen Structures")
        from pymatgen.core import Lattice, Structure

        return Structure(Lattice(self.cell), self.numbers, self.positions, coords_are_cartesian=True)


# ------------------------------------------------------------------------------------ one shard
def shard_path(out_dir: str | os.PathLike, shard: Shard) -> Path:
    return Path(out_dir) / f"{shard.name}.jsonl"


def read_records(path: str | os.PathLike, repair: bool = False, record_type: type = RelaxRecord) -> list:
    """Every complete record (``record_type``: :class:`RelaxRecord`, or another with ``from_dict``,
    ``to_json``, ``material_id`` and ``ok``) of a shard file ([] if it does not exist).

    A last line without its newline (the process was killed while writing it) is ignored, and
    with ``repair`` cut from the file so that later appends start on a fresh line. A damaged
    line anywhere else is an error naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    records = []
    complete = data.rfind(b"\n") + 1  # bytes up to the last newline
    for number, line in enumerate(data[:complete].splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(record_type.from_dict(json.loads(line)))
        except (ValueError, TypeError) as exc:
            raise MatRISInputError(
                f"{path}, line {number}, is not a {getattr(record_type, 'KIND', 'result')} record ({exc}); the file "
                "was edited or damaged. Delete that line (its structure is then computed again on the next run) "
                "and rerun."
            ) from None
    if repair and complete < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(complete)
            os.fsync(fh.fileno())
    return records


class ShardLog:
    """The append-only result file of one shard, locked against a second process on the same shard.

    Use as a context manager: on entry the file is locked, repaired and read (:attr:`records`,
    :attr:`done`); :meth:`append` writes one record and fsyncs it.
    """

    def __init__(self, out_dir: str | os.PathLike, shard: Shard, retry_failed: bool = False,
                 record_type: type = RelaxRecord):
        self.path = shard_path(out_dir, shard)
        self.shard = shard
        self.retry_failed = retry_failed
        self.record_type = record_type
        self.records: list = []
        self._fh = None
        self._lock = None

    def __enter__(self) -> "ShardLog":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.path.with_name(self.path.name + ".lock"), "a")
        if fcntl is not None:
            try:
                fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._lock.close()
                raise MatRISInputError(
                    f"shard {self.shard} is already running in another process (it holds {self._lock.name}); "
                    "run each --shard I/N once at a time, or wait for the other process to finish"
                ) from None
        try:
            self.records = read_records(self.path, repair=True, record_type=self.record_type)
            self._fh = open(self.path, "a", encoding="utf-8")
        except BaseException:
            self._lock.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            self._fh.close()
        if self._lock is not None:
            self._lock.close()  # releases the flock

    @property
    def done(self) -> set[str]:
        """Material ids that need no relaxation: all recorded ones (successful ones only with ``retry_failed``)."""
        return {r.material_id for r in self.records if r.ok or not self.retry_failed}

    def append(self, record) -> None:
        self._fh.write(record.to_json() + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.records.append(record)


# ------------------------------------------------------------------------------------- manifest
def check_manifest(out_dir: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Write ``DIR/manifest.json``, or check that the one there describes the same run."""
    path = Path(out_dir) / MANIFEST
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            raise MatRISInputError(f"{path} is not valid JSON; delete it (results are kept) and rerun") from None
        changed = [k for k in PROTOCOL_KEYS if old.get(k) != manifest.get(k)]
        if changed:
            diff = ", ".join(f"{k}: {old.get(k)!r} there, {manifest.get(k)!r} now" for k in changed)
            raise MatRISInputError(
                f"{out_dir} holds a run with other settings ({diff}); rerun with the same settings to resume it, "
                "or give another --out folder"
            )
        if old.get("material_ids") != manifest.get("material_ids"):
            raise MatRISInputError(
                f"{out_dir} holds a run over other structures (the material ids differ); use the same --structures "
                "file to resume it, or give another --out folder"
            )
        return path
    return write_json(path, manifest, indent=None)


def read_manifest(out_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{out_dir} has no {MANIFEST}: it is not the --out folder of 'matris discovery relax'")
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------- merge
@dataclass
class MergedResults:
    """All shards of a run together.

    records: one record per material id (a successful one when there is any), in manifest order.
    missing: ids of the run with no record. failed: ids whose relaxation failed.
    duplicates: records dropped because their id was already there (e.g. the same shard
    relaxed again after ``--retry-failed``, or shard files of two shard counts).
    """

    records: dict[str, RelaxRecord]
    missing: list[str]
    failed: list[str]
    duplicates: int
    manifest: dict[str, Any]

    def __iter__(self) -> Iterator[RelaxRecord]:
        return iter(self.records.values())

    def __len__(self) -> int:
        return len(self.records)


def merge_results(out_dir: str | os.PathLike) -> MergedResults:
    """Read every shard file of the run in ``out_dir``, deduplicate by material id and find what is missing."""
    out_dir = Path(out_dir)
    manifest = read_manifest(out_dir)
    count = int(manifest.get("shards", 1))
    files = sorted(out_dir.glob("shard-*-of-*.jsonl"))
    stray = [f.name for f in files if not f.name.endswith(f"-of-{count}.jsonl")]
    if stray:
        raise MatRISInputError(
            f"{out_dir} has shard files of another shard count ({', '.join(stray[:3])}) besides this run's "
            f"{count}; move them away (or merge them into the right folder) and rerun"
        )
    merged: dict[str, RelaxRecord] = {}
    duplicates = 0
    for path in files:
        for record in read_records(path):
            old = merged.get(record.material_id)
            if old is not None:
                duplicates += 1
                if old.ok or not record.ok:
                    continue
            merged[record.material_id] = record
    ids: Sequence[str] = manifest.get("material_ids") or list(merged)
    known = set(ids)
    unknown = [m for m in merged if m not in known]
    if unknown:
        raise MatRISInputError(f"{out_dir}: shard files hold material ids that are not in the run ({unknown[:3]}…); "
                               "the folder mixes two runs: give each run its own --out folder")
    records = {m: merged[m] for m in ids if m in merged}
    return MergedResults(records=records, missing=[m for m in ids if m not in merged],
                         failed=[m for m, r in records.items() if not r.ok], duplicates=duplicates, manifest=manifest)


__all__ = ["RelaxRecord", "ShardLog", "read_records", "shard_path", "check_manifest", "read_manifest",
           "MergedResults", "merge_results", "MANIFEST"]
