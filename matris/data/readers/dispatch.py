"""The one entry to every format: :func:`iter_samples` picks the reader of a file by its
suffix (and a JSON file by its first frame); :func:`read_samples` and :func:`count_samples`
go through the same choice; :func:`expand_data_paths` turns entries into data files."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import MatRISInputError
from .ase_db import _db_count, _iter_lmdb, _iter_sqlite
from .ase_files import _iter_ase_frames, _traj_count
from .common import (
    _LABEL_KEYS,
    BadRecord,
    Sample,
    _check_file,
    _check_on_error,
    _check_range,
    _is_json,
    _label_options,
    _only,
)
from .extxyz import _extxyz_frames, _iter_extxyz
from .json_streams import _json_kind
from .matpes import _iter_matpes
from .mptrj import _iter_mptrj

# file name endings that directories and globs are searched for (lower case)
DATA_SUFFIXES = (".extxyz", ".xyz", ".traj", ".db", ".aselmdb", ".lmdb", ".json", ".json.gz")


def _format(p: Path) -> str:
    """The reader of ``p``: "extxyz", "db", "lmdb", "mptrj", "matpes", "json-ase" or "ase"."""
    name = p.name.lower()
    if name.endswith((".extxyz", ".xyz")):
        return "extxyz"
    if name.endswith(".db"):
        return "db"
    if name.endswith((".aselmdb", ".lmdb")):
        return "lmdb"
    if _is_json(p):
        kind = _json_kind(p)
        return {"mptrj": "mptrj", "matpes": "matpes"}.get(kind, "json-ase")
    return "ase"


def _split_options(p: Path, fmt: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options that apply to format ``fmt``.

    ``mptrj_energy_key`` marks ``options`` as settings for every format at once (the trainer's
    data config): an MPtrj file then uses only that key, a MatPES file none of them (its
    labels have fixed names), other files all but it.
    """
    options = dict(options)
    mixed = "mptrj_energy_key" in options
    mptrj_key = options.pop("mptrj_energy_key", None)
    if fmt == "mptrj":
        if mixed:
            options = {} if mptrj_key is None else {"energy_key": mptrj_key}
        _only(options, {"energy_key"}, p, "MPtrj JSON")
    elif fmt == "matpes":
        if mixed:
            options = {}
        _only(options, {"energy_key"}, p, "MatPES JSON")
    elif fmt in ("db", "lmdb"):
        _only(options, set(_LABEL_KEYS) | {"stress_unit", "selection"}, p,
              "ASE database" if fmt == "db" else "ASE-LMDB database")
    else:
        _only(options, set(_LABEL_KEYS) | {"stress_unit", "index"}, p, "ASE file")
    return options


def iter_samples(path: str | os.PathLike, start: int = 0, stop: int | None = None, on_error: str = "raise",
                 **options: Any) -> tuple[Iterator[Sample | BadRecord], int | None]:
    """``(samples, count)``: records ``[start, stop)`` of any supported file, in file order.

    count is the number of records the iterator yields (None when unknown before reading:
    the JSON streams and most ASE formats). Each format reads as little as it allows:
    ``.db``/``.aselmdb``/``.lmdb`` by offset and limit (LMDB rows by id), ``.extxyz``/``.xyz``
    by seeking to frame ``start`` through a byte-offset index of the frames, other ASE formats
    through ``ase.io.iread`` with a slice, MPtrj and MatPES JSON (``.json``/``.json.gz``,
    told apart by their first character: ``{`` or ``[``) by streaming and skipping records
    before ``start``. ``stop`` past the end is the end. With ``on_error="skip"`` a record
    that cannot be read is yielded as a :class:`BadRecord` (index in file order and the
    message) and reading goes on.

    ``options`` are the reader's keyword options (label keys, ``stress_unit``, ``selection``
    for databases, ``energy_key`` for MPtrj/MatPES). ``mptrj_energy_key`` marks them as
    settings for every format at once (the trainer's data config): an MPtrj file then uses
    only that key, a MatPES file none, other files the rest.
    """
    p = _check_file(path)
    start, stop = _check_range(p, start, stop)
    _check_on_error(on_error)
    fmt = _format(p)
    options = _split_options(p, fmt, options)

    def clip(total: int) -> int:
        return max(0, (total if stop is None else min(stop, total)) - start)

    if fmt == "extxyz":
        frames = _extxyz_frames(p, options.pop("index", ":"))[start:stop]
        return _iter_extxyz(p, frames, start, on_error, options), len(frames)
    if fmt == "db":
        selection = options.pop("selection", None)
        return _iter_sqlite(p, selection, start, stop, on_error, options), clip(_db_count(p, selection, False))
    if fmt == "lmdb":
        selection = options.pop("selection", None)
        count = clip(_db_count(p, selection, True))
        keys, factor, tracker = _label_options(p, options, "ASE-LMDB database")
        return _iter_lmdb(p, selection, start, stop, on_error, keys, factor, tracker), count
    if fmt == "mptrj":
        return _iter_mptrj(p, options.get("energy_key", "corrected_total_energy"), start, stop, on_error), None
    if fmt == "matpes":
        return _iter_matpes(p, start, stop, on_error, options.get("energy_key", "energy")), None
    index = options.pop("index", ":")
    return _iter_ase_frames(p, index, start, stop, on_error, options), None


def count_samples(path: str | os.PathLike, **options: Any) -> int | None:
    """The number of records of a file, where that is cheap; None where it is not.

    ``.db``/``.aselmdb``/``.lmdb``: ``db.count(selection)``; ``.extxyz``/``.xyz``: the frames
    of the byte-offset index (one line-scanning pass, kept for :func:`iter_samples`; a broken
    last frame counts as one record); ``.traj``: its length; MPtrj/MatPES JSON and other ASE
    formats: None (counting means parsing everything). ``options`` as for :func:`iter_samples`.
    """
    p = _check_file(path)
    options = dict(options)
    options.pop("on_error", None)
    fmt = _format(p)
    options = _split_options(p, fmt, options)
    if fmt == "extxyz":
        return len(_extxyz_frames(p, options.get("index", ":")))
    if fmt in ("db", "lmdb"):
        return _db_count(p, options.get("selection"), fmt == "lmdb")
    if p.name.lower().endswith(".traj"):
        return _traj_count(p, options.get("index", ":"))
    return None


def read_samples(path: str | os.PathLike, **options: Any) -> list[Sample]:
    """Labelled structures from any supported file, by its type.

    ``.json``/``.json.gz`` in the MPtrj layout → :func:`read_mptrj`, a MatPES list →
    :func:`read_matpes`; ``.db`` → :func:`read_ase_db`; ``.aselmdb``/``.lmdb`` →
    :func:`read_ase_lmdb`; anything else → :func:`read_ase`. ``options`` are passed to that
    reader (and ``start``, ``stop``, ``on_error`` as in :func:`iter_samples`).
    Raises FileNotFoundError for a missing file and MatRISInputError for an unreadable one.
    """
    samples, _ = iter_samples(path, **options)
    return list(samples)


def _is_data_file(p: Path) -> bool:
    return p.is_file() and not p.name.startswith(".") and p.name.lower().endswith(DATA_SUFFIXES)


def expand_data_paths(entries: str | os.PathLike | list | tuple) -> list[Path]:
    """The data files of one dataset given as files, directories and glob patterns.

    Each entry is a file (kept as is, any format), a directory (its files ending in one of
    :data:`DATA_SUFFIXES` — .extxyz .xyz .traj .db .aselmdb .lmdb .json .json.gz — sorted by
    name, not recursive, hidden files left out) or a glob pattern (``*``, ``?``, ``[...]``;
    ``**`` recurses; the matching data files, sorted). Order is kept across entries and a file
    named twice is kept once. A missing file raises FileNotFoundError; a pattern that matches
    no data file, or a directory without one, raises MatRISInputError naming it.
    """
    if isinstance(entries, (str, os.PathLike)):
        entries = [entries]
    out: list[Path] = []
    seen: set[Path] = set()
    for entry in entries:
        text = os.path.expanduser(os.fspath(entry))
        if glob.has_magic(text):
            found = [Path(m) for m in sorted(glob.glob(text, recursive=True)) if _is_data_file(Path(m))]
            if not found:
                raise MatRISInputError(
                    f"the pattern {text!r} matches no data file (files ending in {', '.join(DATA_SUFFIXES)}); "
                    "check the pattern, or name the files."
                )
        else:
            path = Path(text)
            if path.is_dir():
                found = sorted((q for q in path.iterdir() if _is_data_file(q)), key=lambda q: q.name)
                if not found:
                    raise MatRISInputError(
                        f"the directory {text!r} holds no data file (files ending in {', '.join(DATA_SUFFIXES)}; "
                        "subdirectories are not searched: use a pattern like 'dir/**/*.extxyz')."
                    )
            elif path.exists():
                found = [path]
            else:
                raise FileNotFoundError(f"data file {text!r} does not exist; check the path.")
        for q in found:
            key = q.resolve()
            if key not in seen:
                seen.add(key)
                out.append(q)
    return out
