"""The MatPES JSON releases (``[record, ...]``, PBE and r2SCAN), streamed one record at a time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import MatRISInputError
from .common import (
    _PER_ATOM_SUFFIX,
    KBAR_TO_GPA,
    BadRecord,
    Sample,
    _broken,
    _check_file,
    _check_on_error,
    _check_range,
    _make_sample,
    _open_binary,
    _record,
)
from .json_streams import _ijson, _json_error, _json_kind, _stream_errors, _system_from_structure_dict


def read_matpes(path: str | os.PathLike, **options: Any) -> list[Sample]:
    """All samples of a MatPES JSON file; see :func:`iter_matpes`."""
    return list(iter_matpes(path, **options))


def iter_matpes(path: str | os.PathLike, start: int = 0, stop: int | None = None, on_error: str = "raise",
                energy_key: str = "energy") -> Iterator[Sample | BadRecord]:
    """Labelled structures from a MatPES release (``MatPES-PBE-2025.1.json.gz``, r2SCAN alike).

    The file (``.json`` or ``.json.gz``) is one JSON list of records, streamed with
    ``ijson.items(f, "item")``: one record in memory at a time; records before ``start`` are
    parsed and skipped without building samples, reading stops at ``stop``.

    Record layout, from the dataset page of the MatPES repository
    (github.com/materialsvirtuallab/matpes, ``pages/dataset.py``, "Example document"):
    ``structure`` (pymatgen ``Structure.as_dict()``), ``energy`` ("DFT energy in eV": the
    total energy of the cell), ``forces`` ``[n, 3]`` eV/Å, ``stress`` (6 values, "kilobar"),
    ``matpes_id`` (e.g. ``"matpes-20240214_999484_73"``) and ``provenance.original_mp_id``
    (the Materials Project material the MD snapshot came from), plus metadata.

    Stress: VASP kBar with the VASP sign (positive = compressive), as in MPtrj, in ASE's
    Voigt order (xx yy zz yz xz xy): the MatPES training tutorial
    (``assets/Training a MatPES model.md`` in the same repository, fitting with matgl) turns
    it into its labels with ``voigt_6_to_full_3x3_stress(np.array(d["stress"])) * -0.1``.
    Here too: GPa_ase = −0.1 × kBar, so a compressed cell has negative stress.

    energy_key: default ``"energy"`` (total, eV); keys ending in ``_per_atom`` (e.g.
    ``"cohesive_energy_per_atom"``) are multiplied by the number of atoms. A record without
    it is an error (the release always carries it). magmoms (μB): the record's ``magmoms`` if
    present, else the structure's per-site ``magmom`` properties when every site has one,
    else None. material_id: ``provenance.original_mp_id`` (so a train/validation split by
    material keeps all snapshots of one material together, as the MatPES models were split),
    else ``matpes_id``, else ``"<stem>:<k>"``; name: ``matpes_id``.
    """
    p = _check_file(path)
    start, stop = _check_range(p, start, stop)
    _check_on_error(on_error)
    if _json_kind(p) != "matpes":
        raise MatRISInputError(f"{p}: not a MatPES JSON list ([{{'structure': ..., 'energy': ...}}, ...]); for "
                               "an MPtrj dict use read_mptrj.")
    return _iter_matpes(p, start, stop, on_error, energy_key)


def _iter_matpes(p: Path, start: int, stop: int | None, on_error: str,
                 energy_key: str) -> Iterator[Sample | BadRecord]:
    ijson = _ijson()
    errors = _stream_errors()
    per_atom = energy_key.endswith(_PER_ATOM_SUFFIX)
    k = 0
    last = None
    with _open_binary(p) as f:
        records = ijson.items(f, "item", use_float=True)
        while stop is None or k < stop:
            try:
                rec = next(records)
            except StopIteration:
                break
            except errors as e:
                yield _broken(k, on_error, _json_error(p, k, last, e))
                return
            if k >= start:
                yield _record(k, on_error, _matpes_sample, rec, p, k, energy_key, per_atom)
            last = f"{rec.get('matpes_id')!r}" if isinstance(rec, dict) and rec.get("matpes_id") else None
            k += 1


def _matpes_sample(rec: Any, p: Path, k: int, energy_key: str, per_atom: bool) -> Sample:
    rid = rec.get("matpes_id") if isinstance(rec, dict) else None
    who = f"{p} record {k}" + (f" ({rid})" if rid else "")
    if not isinstance(rec, dict) or "structure" not in rec:
        raise MatRISInputError(f"{who}: the record has no 'structure'; a MatPES record is a dict with 'structure', "
                               "'energy', 'forces', 'stress' and 'matpes_id'. Fix the file.")
    system = _system_from_structure_dict(rec["structure"], who, str(rid or ""))
    magmoms = rec.get("magmoms")
    if magmoms is None:
        site_props = [(s.get("properties") or {}).get("magmom") for s in rec["structure"]["sites"]]
        magmoms = site_props if site_props and all(m is not None for m in site_props) else None
    provenance = rec.get("provenance") if isinstance(rec.get("provenance"), dict) else {}
    mid = provenance.get("original_mp_id") or rid or f"{p.stem}:{k}"
    return _make_sample(who, system, rec.get(energy_key), rec.get("forces"), rec.get("stress"), magmoms,
                        -KBAR_TO_GPA, str(mid), str(rid or system.name), require_energy=True,
                        energy_per_atom=per_atom)
