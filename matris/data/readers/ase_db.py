"""ASE databases: sqlite (``.db``, ``ase.db``) and ASE-LMDB (``.aselmdb``/``.lmdb``: OMat24,
sAlex, OMol25, through ase-db-backends), read by offset or row id."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import MatRISInputError
from ...extras import require
from .common import (
    _LABEL_KEYS,
    BadRecord,
    Sample,
    _broken,
    _check_file,
    _check_on_error,
    _check_range,
    _first_line,
    _first_present,
    _KeyTracker,
    _label_options,
    _make_sample,
    _record,
)


def read_ase_db(
    path: str | os.PathLike,
    selection: Any = None,
    energy_key: str | None = None,
    forces_key: str | None = None,
    stress_key: str | None = None,
    magmoms_key: str | None = None,
    material_id_key: str | None = None,
    stress_unit: str = "eV/A3",
) -> list[Sample]:
    """Labelled structures from an ASE sqlite database (``.db``).

    ``selection`` is passed to ``db.select`` (e.g. ``"natoms<10"`` or ``"Cu"``). Labels come
    from the row's stored calculator results (energy eV, forces eV/Å, stress eV/Å³ Voigt,
    magmoms μB) unless a key is given, which is looked up in ``row.key_value_pairs``, then
    ``row.data``, then the row itself. ``stress_unit`` as in :func:`read_ase`. Material id:
    ``row.key_value_pairs[material_id_key]``, else ``"<file stem>:<row id>"``. A row without
    an energy gets NaN (unlabelled).
    """
    return list(iter_ase_db(path, selection, energy_key=energy_key, forces_key=forces_key, stress_key=stress_key,
                            magmoms_key=magmoms_key, material_id_key=material_id_key, stress_unit=stress_unit))


def iter_ase_db(path: str | os.PathLike, selection: Any = None, start: int = 0, stop: int | None = None,
                on_error: str = "raise", **options: Any) -> Iterator[Sample | BadRecord]:
    """:func:`read_ase_db`, one row at a time; same keyword options.

    ``start``/``stop``: the selected rows ``[start, stop)`` in the database's order, read with
    ``db.select(offset=start, limit=stop - start)``. ``on_error="skip"`` yields a
    :class:`BadRecord` for a row that cannot be used.
    """
    p = _check_file(path)  # ase.db.connect would silently create a missing database
    start, stop = _check_range(p, start, stop)
    _check_on_error(on_error)
    return _iter_sqlite(p, selection, start, stop, on_error, options)


def _iter_sqlite(p: Path, selection: Any, start: int, stop: int | None, on_error: str,
                 options: dict[str, Any]) -> Iterator[Sample | BadRecord]:
    import ase.db

    keys, factor, tracker = _label_options(p, options, "ASE database")
    n = 0
    try:
        db = ase.db.connect(str(p), type="db")
        if stop is not None and stop == start:
            return
        rows = db.select(selection, offset=start, limit=None if stop is None else stop - start)
        for row in rows:
            yield _record(start + n, on_error, _sample_from_row, row, p, start + n, factor, tracker, keys, False)
            n += 1
    except MatRISInputError:
        raise
    except Exception as e:
        raise MatRISInputError(
            f"{p}: cannot read it as an ASE sqlite database ({type(e).__name__}: {e}). Give a .db written by ase.db."
        ) from e
    tracker.check(p, n)


def _sample_from_row(row, p: Path, k: int, factor: float, tracker: _KeyTracker, keys: dict[str, str | None],
                     lmdb: bool) -> Sample:
    """The Sample of one ASE database row (sqlite or LMDB); ``k`` is its index in file order."""
    from ...structures import to_system

    energy_key, forces_key, stress_key, magmoms_key, material_id_key = (keys[k] for k in _LABEL_KEYS)
    kvp, data = dict(row.key_value_pairs), dict(row.get("data", {}) or {})
    tracker.available.update(kvp)
    tracker.available.update(data)

    def get(label, key, default):
        if key is None:
            return row.get(default)
        value = _first_present((kvp, key), (data, key))
        if value is None:
            value = row.get(key)
        if value is not None:
            tracker.found[label] = True
        return value

    if material_id_key:
        mid = get("material_id_key", material_id_key, "__none__")
    else:  # OMat24/sAlex rows carry the structure id as 'sid'
        mid = _first_present((kvp, "sid"), (data, "sid")) if lmdb else None
    who = f"{p} record {k} (row id {row.id}" + (f", {mid}" if mid is not None else "") + ")"
    system = to_system(row.toatoms())
    return _make_sample(
        who, system,
        get("energy_key", energy_key, "energy"),
        get("forces_key", forces_key, "forces"),
        get("stress_key", stress_key, "stress"),
        get("magmoms_key", magmoms_key, "magmoms"),
        factor,
        str(mid) if mid is not None else f"{p.stem}:{row.id}",
        str(kvp.get("name", "")) or system.name,
        require_energy=lmdb,
    )


def read_ase_lmdb(path: str | os.PathLike, selection: Any = None, **options: Any) -> list[Sample]:
    """All samples of an ASE-LMDB database; see :func:`iter_ase_lmdb`."""
    return list(iter_ase_lmdb(path, selection, **options))


def iter_ase_lmdb(path: str | os.PathLike, selection: Any = None, start: int = 0, stop: int | None = None,
                  on_error: str = "raise", **options: Any) -> Iterator[Sample | BadRecord]:
    """Labelled structures from an ASE-LMDB database (``.aselmdb``, also ``.lmdb``), one row at a time.

    This is how OMat24, sAlex and OMol25 are distributed (fairchem's ``AseDBDataset`` reads
    them); it is opened read-only with ``ase.db.connect(path, type="aselmdb")`` (package
    ``ase-db-backends``), without a lock file, so many workers can read one file.

    Labels: the row's stored calculator results: ``row.energy`` (total, eV; a row without it
    is an error, the format always carries it), ``row.forces`` ``[n, 3]`` eV/Å,
    ``row.stress`` (Voigt 6-vector, eV/Å³, ASE sign → GPa ×160.21766208; OMol25 has none →
    None), ``row.magmoms`` μB when present. The label keys (``energy_key`` ...,
    ``stress_unit``) work as in :func:`read_ase_db`: a named key is looked up in
    ``key_value_pairs``, then ``data``. Material id: ``material_id_key`` if given, else the
    row's ``sid`` (key_value_pairs or data, as OMat24/sAlex store it), else
    ``"<file stem>:<row id>"``.

    ``start``/``stop``: rows ``[start, stop)`` in file order. Without a ``selection`` each
    row is fetched by id, so a worker reads only its own rows; with one, ``db.select(selection,
    offset=start, limit=stop - start)`` filters. A corrupt or non-LMDB file raises
    MatRISInputError naming it; a row that cannot be decoded is a bad record
    (``on_error="skip"``: a :class:`BadRecord`).
    """
    p = _check_file(path)
    start, stop = _check_range(p, start, stop)
    _check_on_error(on_error)
    keys, factor, tracker = _label_options(p, options, "ASE-LMDB database")
    return _iter_lmdb(p, selection, start, stop, on_error, keys, factor, tracker)


def _connect_lmdb(p: Path):
    """The read-only ASE-LMDB database of ``p``, or MatRISInputError naming the file."""
    feature = f"reading {p} (ASE-LMDB)"
    LMDBDatabase = require("ase_db_backends.aselmdb", "data", feature, package="ase-db-backends").LMDBDatabase
    lmdb = require("lmdb", "data", feature)
    fix = ("the file is corrupt, truncated or not an LMDB file. Re-download it, or give an .aselmdb written by "
           "ase.db.connect(path, type='aselmdb').")
    try:  # check first: a failed LMDBDatabase.__init__ would also fail again in its __del__
        env = lmdb.open(str(p), subdir=False, readonly=True, lock=False)
        entries = env.stat()["entries"]
        env.close()
    except Exception as e:
        raise MatRISInputError(f"{p}: cannot open it as an LMDB database ({type(e).__name__}: {_first_line(e)}); "
                               f"{fix}") from e
    try:
        db = LMDBDatabase(str(p), readonly=True, use_lock_file=False)
    except Exception as e:
        raise MatRISInputError(f"{p}: cannot read it as an ASE-LMDB database ({type(e).__name__}: "
                               f"{_first_line(e)}); {fix}") from e
    if not db.ids and entries:
        db.close()
        raise MatRISInputError(
            f"{p}: an LMDB file with {entries} entries but no ASE rows (no ASE 'nextid' index); it is not an "
            "ASE-LMDB database (perhaps fairchem's older LmdbDataset format). Convert it to .aselmdb with fairchem, "
            "or give the dataset's .aselmdb files."
        )
    return db


def _iter_lmdb(p: Path, selection: Any, start: int, stop: int | None, on_error: str, keys: dict,
               factor: float, tracker: _KeyTracker) -> Iterator[Sample | BadRecord]:
    db = _connect_lmdb(p)
    n = 0
    try:
        if stop is not None and stop == start:
            return
        if selection is None:
            for k, row_id in enumerate(db.ids[start:stop], start=start):
                yield _record(k, on_error, _lmdb_row_sample, db, row_id, p, k, factor, tracker, keys)
                n += 1
        else:
            rows = db.select(selection, offset=start, limit=None if stop is None else stop - start)
            while True:
                try:
                    row = next(rows)
                except StopIteration:
                    break
                except Exception as e:  # noqa: BLE001 - reported as a broken record
                    yield _broken(start + n, on_error, MatRISInputError(
                        f"{p} record {start + n} (of selection {selection!r}): cannot read the row "
                        f"({type(e).__name__}: {_first_line(e)}); the file is corrupt. Re-download it."))
                    return
                yield _record(start + n, on_error, _sample_from_row, row, p, start + n, factor, tracker, keys, True)
                n += 1
    finally:
        db.close()
    tracker.check(p, n)


def _lmdb_row_sample(db, row_id: int, p: Path, k: int, factor: float, tracker: _KeyTracker, keys: dict) -> Sample:
    try:
        row = db.get(id=row_id)
    except Exception as e:
        raise MatRISInputError(f"{p} record {k} (row id {row_id}): cannot decode the row ({type(e).__name__}: "
                               f"{_first_line(e)}); the file is corrupt. Re-download it.") from e
    return _sample_from_row(row, p, k, factor, tracker, keys, True)


def _db_count(p: Path, selection: Any, lmdb: bool) -> int:
    if lmdb:
        db = _connect_lmdb(p)
        try:
            return int(db.count(selection))
        finally:
            db.close()
    import ase.db

    try:
        return int(ase.db.connect(str(p), type="db").count(selection))
    except Exception as e:
        raise MatRISInputError(
            f"{p}: cannot read it as an ASE sqlite database ({type(e).__name__}: {e}). Give a .db written by ase.db."
        ) from e
