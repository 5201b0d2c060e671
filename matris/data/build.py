"""Building the graph cache of a data file: sharded, parallel, resumable, atomic.

A cache entry (``<cache_dir>/<stem>-<hash>/``) holds the graphs of one source file as
shards, each a :class:`~matris.data.cache.PackedDataset` directory of memory-mapped arrays::

    meta.json           totals, labels, skipped records, the source's size/mtime/sha256
    manifest.json       the finished shards (written after each one, atomically)
    shard-00000/ ...    records [0, shard_size) of the source, in file order
    shard-00001/ ...    records [shard_size, 2·shard_size) ...

Shard k always holds records ``[k·shard_size, (k+1)·shard_size)`` of the source, whatever
the number of workers, and its files depend only on those records: an interrupted build
(even by SIGKILL) that is restarted keeps its finished shards, redoes the unfinished ones and
ends byte-identical to an uninterrupted build. While building, the entry lives in
``.<name>.partial/`` beside its final place and is renamed into place when complete; a lock
file serialises builders of one entry (DDP ranks, several jobs), so all but the first load
the finished entry.

Workers: with ``workers > 1`` shards are built by a pool of processes. Formats with random
access (extxyz, ASE .db and .aselmdb) are read by the workers themselves, each its own
records; JSON streams (MPtrj, MatPES) are parsed once by the main process, which hands the
records of each shard to a worker. Each worker uses one thread.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import json
import logging
import math
import multiprocessing
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..atomic import write_json
from ..errors import MatRISInputError, counted
from ..settings import cache_home
from .cache import MultiPacked, PackedDataset
from .packing import LABELS, PROGRESS_THRESHOLD, _check_cutoffs, _replace_dir
from .readers import count_samples, iter_samples

ENTRY_FORMAT = 2  # of a cache entry: shards + manifest
DEFAULT_SHARD_SIZE = 50_000  # structures; ~15 memory maps per shard (Linux allows 65,530 per process)

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- the entry: place, name, lock


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


# ----------------------------------------------------------------------------- the dataset


class CachedDataset(MultiPacked):
    """The shards of one cache entry as one dataset (the API of :class:`PackedDataset`).

    Attributes: ``directory`` (the entry), ``meta`` (its ``meta.json``), ``cutoff``,
    ``three_body_cutoff``, ``store_angles``; :attr:`n_skipped` counts the records of the
    source left out (``skip_invalid``). Picklable: shards reopen their memory maps lazily in
    each process (DataLoader workers, DDP ranks).
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{str(self.directory)!r} is not a MatRIS graph cache entry (no meta.json); "
                                    "make one with matris.data.build_or_load or 'matris data build'.")
        self.meta: dict = json.loads(meta_path.read_text())
        if self.meta.get("format_version") != ENTRY_FORMAT:
            raise MatRISInputError(
                f"{self.directory} was written in cache entry format {self.meta.get('format_version')}, this matris "
                f"reads format {ENTRY_FORMAT}; delete it and build it again (build_or_load rebuilds it automatically).")
        shards = [PackedDataset(self.directory / name) for name in self.meta["shards"]]
        if shards:
            super().__init__(shards)
        else:  # every record was skipped: an empty dataset with the entry's settings
            self.datasets, self.offsets = [], np.zeros(1, dtype=np.int64)
            self.cutoff, self.three_body_cutoff = float(self.meta["cutoff"]), float(self.meta["three_body_cutoff"])
            self.store_angles = bool(self.meta["store_angles"])

    def __repr__(self) -> str:
        m = self.meta
        return (f"CachedDataset({counted(len(self), 'structure')} in {counted(len(self.datasets), 'shard')}, "
                f"{m['n_atoms_total']} atoms, "
                f"{m['n_bonds_total']} bonds, {m['n_angles_total']} angles, cutoff={self.cutoff}, "
                f"three_body_cutoff={self.three_body_cutoff}, directory={str(self.directory)!r})")

    @property
    def has_labels(self) -> dict[str, bool]:
        return dict(self.meta["has_labels"])

    @property
    def n_skipped(self) -> int:
        """Records of the source left out as invalid (``skip_invalid=True``)."""
        return int(self.meta["skipped"]["count"])


# ----------------------------------------------------------------------------- shard jobs


@dataclass
class _ShardJob:
    """Build shard ``index`` (records ``[start, stop)`` of ``source``) into ``directory``.

    ``samples`` is set when the main process read the records (JSON streams); otherwise the
    worker reads them itself.
    """

    index: int
    start: int
    stop: int | None
    directory: str
    source: str
    reader_options: dict
    cutoff: float
    three_body_cutoff: float
    skip_invalid: bool
    store_angles: bool
    build_id: str
    samples: list | None = field(default=None, repr=False)


_COUNTER: Any = None  # per worker process: the shared count of records processed


def _worker_init(counter: Any) -> None:
    global _COUNTER
    import torch

    torch.set_num_threads(1)  # one process per core; threads would oversubscribe
    _COUNTER = counter


def _run_shard(job: _ShardJob, counter: Any = None) -> dict:
    """Build one shard (:meth:`PackedDataset.from_samples`: atomically); its summary for the manifest."""
    counter = counter if counter is not None else _COUNTER
    if job.samples is not None:
        records: Any = job.samples
    else:
        on_error = "skip" if job.skip_invalid else "raise"
        records, _ = iter_samples(job.source, start=job.start, stop=job.stop, on_error=on_error,
                                  **job.reader_options)
    n_records = _Counted(records)
    meta = PackedDataset.from_samples(
        n_records, job.cutoff, job.three_body_cutoff, job.directory, job.skip_invalid, overwrite=True,
        store_angles=job.store_angles, source=Path(job.source).name, first_index=job.start, allow_empty=True,
        build_id=f"{job.build_id}-{job.index:05d}", counter=counter,
        meta={"shard": job.index, "first_record": job.start}).meta
    return {"index": job.index, "records": n_records.n, "n_structures": meta["n_structures"],
            "n_atoms": meta["n_atoms_total"], "n_bonds": meta["n_bonds_total"], "n_angles": meta["n_angles_total"],
            "has_labels": meta["has_labels"], "skipped": meta["skipped"]}


class _Counted:
    """An iterable that counts what it yields (records read, valid or not)."""

    def __init__(self, items: Any):
        self.items, self.n = items, 0

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            self.n += 1
            yield item


class _LocalCounter:
    """``multiprocessing.Value`` stand-in for a build without workers."""

    def __init__(self) -> None:
        self.value = 0

    def get_lock(self):
        return contextlib.nullcontext()


# ----------------------------------------------------------------------------- building


@dataclass
class BuildReport:
    """What :func:`build_or_load` did: ``built`` shards this call, ``reused`` from an interrupted
    build, ``records`` read and ``seconds`` spent (0 shards built: the entry was fresh)."""

    entry: Path
    built: int = 0
    reused: int = 0
    records: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        """Records per second of this call."""
        return self.records / self.seconds if self.seconds > 0 else math.nan


def _entry_is_fresh(entry: Path, src: Path) -> bool:
    """True when ``entry`` was built, in this format, from the current content of ``src``.

    Size and mtime unchanged → fresh without reading the source; otherwise the sha256 of
    the source decides (a touched but unchanged file is not rebuilt; its new stat is stored).
    """
    meta_path = entry / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
        source = meta["source"]
    except (OSError, ValueError, KeyError):
        return False
    if meta.get("format_version") != ENTRY_FORMAT:
        return False
    st = src.stat()
    if source.get("size") == st.st_size and source.get("mtime_ns") == st.st_mtime_ns:
        return True
    if source.get("size") != st.st_size or _sha256(src) != source.get("sha256"):
        return False
    meta["source"].update(size=st.st_size, mtime_ns=st.st_mtime_ns)
    write_json(meta_path, meta)
    return True


def build_or_load(
    source_path: str | os.PathLike,
    cutoff: float,
    three_body_cutoff: float,
    cache_dir: str | os.PathLike | None = None,
    reader_options: dict | None = None,
    progress: bool = True,
    skip_invalid: bool = False,
    store_angles: bool = True,
    workers: int = 1,
    shard_size: int | None = None,
    report: list | None = None,
) -> CachedDataset:
    """The packed graphs of a data file, built on first use and reused afterwards.

    source_path: any file :func:`~matris.data.read_samples` reads (extxyz, traj, ASE .db,
    .aselmdb, MPtrj or MatPES .json/.json.gz); reader_options are passed to it (e.g.
    ``{"energy_key": "REF_energy"}``).
    cutoff, three_body_cutoff: the model's r_c and r_3, Å.
    cache_dir: default :func:`default_cache_dir`. The entry is named by a hash of the
    absolute source path, cutoffs, reader options and format version; it stores the source's
    size, mtime_ns and sha256 and is rebuilt when the content changes.
    skip_invalid: leave out records that fail reading or validation (counted, with a warning
    giving the count and the first errors) instead of raising an error that names the file
    and the record.
    store_angles: keep the line graph on disk (graphs built once; default). Angles
    outnumber bonds ~10:1 and dominate the size; with False only bond lengths are stored
    and each batch's angles are rebuilt at collate time, identically, in ~1/4 of the space.
    workers: processes building shards in parallel (1: in this process).
    shard_size: records per shard (default 50,000); the unit of parallel work and of
    resumption. An interrupted build resumes with the shard size it started with.
    report: if a list is given, a :class:`BuildReport` is appended to it.

    A killed build leaves ``.<entry>.partial/``; the next call with the same source and
    settings keeps its finished shards and builds only the rest (module docstring).
    """
    src = Path(source_path).expanduser()
    if not src.exists():
        raise FileNotFoundError(f"data file {str(src)!r} does not exist; check the path.")
    src = src.resolve()
    _check_cutoffs(cutoff, three_body_cutoff)
    if int(workers) != workers or workers < 1:
        raise MatRISInputError(f"workers must be a positive integer, got {workers!r}.")
    if shard_size is not None and (int(shard_size) != shard_size or shard_size < 1):
        raise MatRISInputError(f"shard_size must be a positive integer, got {shard_size!r}.")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"cannot create the graph cache directory {str(root)!r} ({e}); pass cache_dir= or set "
                      "MATRIS_CACHE to a writable directory.") from e
    name = cache_entry_name(src, cutoff, three_body_cutoff, reader_options, skip_invalid, store_angles)
    entry = root / name
    rep = BuildReport(entry)
    with _file_lock(root / f"{name}.lock"):
        if not _entry_is_fresh(entry, src):
            _build_entry(src, entry, cutoff, three_body_cutoff, reader_options or {}, skip_invalid, store_angles,
                         int(workers), shard_size, progress, rep)
    if report is not None:
        report.append(rep)
    return CachedDataset(entry)


def _build_entry(src: Path, entry: Path, cutoff: float, three_body_cutoff: float, reader_options: dict,
                 skip_invalid: bool, store_angles: bool, workers: int, shard_size: int | None, progress: bool,
                 rep: BuildReport) -> None:
    t0 = time.perf_counter()
    partial = entry.with_name(f".{entry.name}.partial")
    st = src.stat()  # before reading: a change during the build then shows up next time
    source_meta = {"path": str(src), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(src)}
    manifest = _resume_manifest(partial, source_meta)
    if manifest is None:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        size = int(shard_size or DEFAULT_SHARD_SIZE)
        manifest = {"format_version": ENTRY_FORMAT, "source": source_meta, "shard_size": size, "n_shards": None,
                    "shards": {}}
        write_json(partial / "manifest.json", manifest)
    else:
        # hidden entries are temporaries of the killed build: shards of workers killed mid-shard
        # (".shard-*") and files whose atomic write was cut off (".manifest.json.<random>.json")
        for stale in partial.glob(".*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        rep.reused = len(manifest["shards"])
        log.info("resuming the graph cache build of %s: %s already done", src, counted(rep.reused, "shard"))
        if shard_size is not None and shard_size != manifest["shard_size"]:
            log.info("resuming with the interrupted build's shard_size=%d (asked: %d)", manifest["shard_size"],
                     shard_size)
    build_key = f"{entry.name}:{source_meta['sha256']}:{manifest['shard_size']}"
    build_id = hashlib.sha256(build_key.encode()).hexdigest()[:32]

    def job(k: int, start: int, stop: int | None, samples: list | None = None) -> _ShardJob:
        return _ShardJob(k, start, stop, str(partial / f"shard-{k:05d}"), str(src), reader_options, cutoff,
                         three_body_cutoff, skip_invalid, store_angles, build_id, samples)

    try:
        _run_jobs(src, manifest, partial, job, workers, progress, reader_options, skip_invalid, rep)
    except MatRISInputError:
        shutil.rmtree(partial, ignore_errors=True)  # bad data: a rerun needs a fixed file or other settings
        raise
    meta = _entry_meta(manifest, cutoff, three_body_cutoff, store_angles, reader_options, build_id)
    if meta["n_structures"] == 0:
        shutil.rmtree(partial, ignore_errors=True)
        skipped = meta["skipped"]
        extra = (f" ({skipped['count']} were invalid and skipped; first: record {skipped['first'][0]['index']}: "
                 f"{skipped['first'][0]['error']})" if skipped["count"] else "")
        raise MatRISInputError(f"{src}: no structures to build graphs of{extra}; check the file.")
    write_json(partial / "meta.json", meta)
    _replace_dir(partial, entry)
    rep.seconds = time.perf_counter() - t0
    if meta["skipped"]["count"]:
        first = meta["skipped"]["first"][0]
        warnings.warn(f"{src.name}: skipped {counted(meta['skipped']['count'], 'invalid record')} of "
                      f"{meta['skipped']['count'] + meta['n_structures']} (skip_invalid=True); first: record "
                      f"{first['index']}: {first['error']}", stacklevel=4)


def _resume_manifest(partial: Path, source_meta: dict) -> dict | None:
    """The manifest of an interrupted build of the same source content, else None."""
    try:
        manifest = json.loads((partial / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if (manifest.get("format_version") != ENTRY_FORMAT
            or manifest.get("source", {}).get("sha256") != source_meta["sha256"]):
        return None
    manifest["source"] = source_meta
    # a shard listed in the manifest was renamed into place before it was listed
    manifest["shards"] = {k: v for k, v in manifest["shards"].items() if (partial / f"shard-{int(k):05d}").is_dir()}
    return manifest


def _run_jobs(src: Path, manifest: dict, partial: Path, job: Any, workers: int, progress: bool,
              reader_options: dict, skip_invalid: bool, rep: BuildReport) -> None:
    size = int(manifest["shard_size"])
    done = {int(k) for k in manifest["shards"]}
    total = count_samples(src, **reader_options)
    records_done = sum(v["records"] for v in manifest["shards"].values())
    counter = _LocalCounter() if workers == 1 else multiprocessing.get_context("spawn").Value("q", 0)
    bar = _Progress(progress, total, records_done, src.name)

    def finished(summary: dict) -> None:
        manifest["shards"][str(summary["index"])] = summary
        manifest["shards"] = dict(sorted(manifest["shards"].items(), key=lambda kv: int(kv[0])))
        write_json(partial / "manifest.json", manifest)
        rep.built += 1
        rep.records += summary["records"]

    if total is not None:  # random access: each job reads its own records
        n_shards = max(1, math.ceil(total / size))
        jobs = (job(k, k * size, min(total, (k + 1) * size)) for k in range(n_shards) if k not in done)
    else:  # a stream: read here, hand records to the workers
        jobs = _stream_jobs(src, size, done, job, reader_options, skip_invalid, manifest)
    try:
        if workers == 1:
            for j in jobs:
                finished(_run_shard(j, counter))
                bar.show(counter.value)
        else:
            ctx = multiprocessing.get_context("spawn")
            with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init,
                                        initargs=(counter,)) as pool:
                pending: set = set()
                for j in jobs:
                    pending.add(pool.submit(_run_shard, j))
                    while len(pending) >= 2 * workers:  # bounded: a stream's records are in the jobs
                        pending = _collect(pending, finished, bar, counter)
                while pending:
                    pending = _collect(pending, finished, bar, counter)
    finally:
        bar.close()
    if total is not None:
        manifest["n_shards"] = n_shards
    write_json(partial / "manifest.json", manifest)
    missing = [k for k in range(manifest["n_shards"]) if str(k) not in manifest["shards"]]
    if missing:  # cannot happen unless shards vanished under us
        raise RuntimeError(f"graph cache build of {src}: shards {missing[:5]} are missing; run the build again.")


def _collect(pending: set, finished: Any, bar: "_Progress", counter: Any) -> set:
    done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
    for fut in done:
        finished(fut.result())  # a worker's MatRISInputError is raised here
    bar.show(counter.value)
    return pending


def _stream_jobs(src: Path, size: int, done: set, job: Any, reader_options: dict, skip_invalid: bool,
                 manifest: dict) -> Iterator[_ShardJob]:
    """Shard jobs of a stream, carrying their records; records of finished shards are skipped
    by the reader without being built."""
    first = 0
    while first in done:
        first += 1
    samples, _ = iter_samples(src, start=first * size, on_error="skip" if skip_invalid else "raise",
                              **reader_options)
    k, chunk = first, []
    for record in samples:
        chunk.append(record)
        if len(chunk) == size:
            if k not in done:
                yield job(k, k * size, (k + 1) * size, chunk)
            k, chunk = k + 1, []
    if chunk or k == 0:
        if k not in done:
            yield job(k, k * size, k * size + len(chunk), chunk)
        k += 1
    manifest["n_shards"] = k


class _Progress:
    """A tqdm bar of records (rate and ETA) for builds of more than PROGRESS_THRESHOLD records."""

    def __init__(self, enabled: bool, total: int | None, initial: int, label: str):
        self.bar = None
        self.enabled, self.total, self.initial, self.label = enabled, total, initial, label
        if enabled and total is not None and total >= PROGRESS_THRESHOLD:
            self._open()

    def _open(self) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, initial=self.initial, desc=f"building graphs of {self.label}",
                        unit=" structures", dynamic_ncols=True)

    def show(self, value: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if value < PROGRESS_THRESHOLD:
                return
            self._open()
        self.bar.update(self.initial + value - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _entry_meta(manifest: dict, cutoff: float, three_body_cutoff: float, store_angles: bool, reader_options: dict,
                build_id: str) -> dict:
    """The entry's meta.json: from the manifest only, so that it is the same however the build ran."""
    shards = [manifest["shards"][str(k)] for k in range(manifest["n_shards"])]
    skipped = [s for shard in shards for s in shard["skipped"]["first"]]
    return {
        "format_version": ENTRY_FORMAT,
        "cutoff": float(cutoff),
        "three_body_cutoff": float(three_body_cutoff),
        "n_structures": sum(s["n_structures"] for s in shards),
        "n_records": sum(s["records"] for s in shards),
        "n_atoms_total": sum(s["n_atoms"] for s in shards),
        "n_bonds_total": sum(s["n_bonds"] for s in shards),
        "n_angles_total": sum(s["n_angles"] for s in shards),
        "store_angles": bool(store_angles),
        "has_labels": {k: any(s["has_labels"][k] for s in shards) for k in LABELS},
        "skipped": {"count": sum(s["skipped"]["count"] for s in shards), "first": skipped[:20]},
        "units": {"energy": "eV (total)", "forces": "eV/Å", "stress": "GPa, ASE sign (positive = tensile)",
                  "magmoms": "μB", "positions": "Å"},
        "shard_size": manifest["shard_size"],
        "shards": [f"shard-{s['index']:05d}" for s in shards if s["n_structures"]],
        "build_id": build_id,
        "source": manifest["source"],
        "reader_options": reader_options,
    }


__all__ = ["CachedDataset", "BuildReport", "build_or_load", "DEFAULT_SHARD_SIZE"]
