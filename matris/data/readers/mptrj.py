"""The MPtrj JSON release (``{material_id: {frame_id: frame}}``), streamed one material at a time."""

from __future__ import annotations

import math
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


def read_mptrj(path: str | os.PathLike, energy_key: str = "corrected_total_energy") -> list[Sample]:
    """Labelled structures from the MPtrj JSON (``{material_id: {frame_id: frame}}``).

    Each frame holds ``structure`` (pymatgen ``Structure.as_dict()``), energies
    (``uncorrected_total_energy``, ``corrected_total_energy`` in eV; ``energy_per_atom``,
    ``ef_per_atom`` in eV/atom), ``force`` (eV/Å), ``stress`` and ``magmom`` (μB, may be null).

    energy_key: which energy to use. Keys ending in ``_per_atom`` are multiplied by the
    number of atoms, so ``Sample.energy`` is always a total in eV.

    Stress: MPtrj stores kBar with the VASP sign convention (positive = compressive), the
    opposite sign to ASE, so the stress returned is GPa_ase = −0.1 × kBar_mptrj.

    material_id = the top-level key; name = the frame id. Missing/null labels become NaN
    (energy) or None. The file (``.json`` or ``.json.gz``) is streamed (:func:`iter_mptrj`):
    one material's frames are in memory at a time, not the whole file.
    """
    return list(iter_mptrj(path, energy_key))


def iter_mptrj(path: str | os.PathLike, energy_key: str = "corrected_total_energy", start: int = 0,
               stop: int | None = None, on_error: str = "raise") -> Iterator[Sample | BadRecord]:
    """:func:`read_mptrj`, streamed: records (frames) ``[start, stop)`` in file order.

    The file (``.json`` or ``.json.gz``) is parsed with ``ijson.kvitems(f, "")``, one
    material's frames at a time, so memory does not grow with the file; frames before
    ``start`` are parsed and skipped without building samples, and reading stops at ``stop``.
    A truncated or corrupt stream raises MatRISInputError naming the record where it breaks
    (``on_error="skip"``: one :class:`BadRecord`, then the end).
    """
    p = _check_file(path)
    start, stop = _check_range(p, start, stop)
    _check_on_error(on_error)
    if _json_kind(p) != "mptrj":
        raise _not_mptrj(p)
    return _iter_mptrj(p, energy_key, start, stop, on_error)


def _not_mptrj(p: Path) -> MatRISInputError:
    return MatRISInputError(
        f"{p}: not in the MPtrj layout {{material_id: {{frame_id: {{'structure': ..., ...}}}}}}; "
        "convert it to extxyz or an ASE .db and read it with read_ase / read_ase_db."
    )


def _iter_mptrj(p: Path, energy_key: str, start: int, stop: int | None,
                on_error: str) -> Iterator[Sample | BadRecord]:
    ijson = _ijson()
    errors = _stream_errors()
    per_atom = energy_key.endswith(_PER_ATOM_SUFFIX)
    found_energy = False
    k = n_read = 0
    last = None
    with _open_binary(p) as f:
        materials = ijson.kvitems(f, "", use_float=True)
        while stop is None or k < stop:
            try:
                material_id, frames = next(materials)
            except StopIteration:
                break
            except errors as e:
                yield _broken(k, on_error, _json_error(p, k, f"material {last!r}" if last else None, e))
                return
            last = material_id
            if not isinstance(frames, dict):
                if k >= start:
                    yield _broken(k, on_error, MatRISInputError(
                        f"{p} record {k} (material {material_id!r}): the material is a {type(frames).__name__}, not "
                        "a {frame_id: frame} dict; fix the file."))
                k += 1
                continue
            for frame_id, frame in frames.items():
                if stop is not None and k >= stop:
                    break
                if k >= start:
                    sample = _record(k, on_error, _mptrj_sample, frame, p, k, material_id, frame_id, energy_key,
                                     per_atom)
                    found_energy |= isinstance(sample, Sample) and not math.isnan(sample.energy)
                    n_read += 1
                    yield sample
                k += 1
    if n_read and not found_energy:
        raise _energy_key_error(p, energy_key, n_read)


def _energy_key_error(p: Path, energy_key: str, n: int) -> MatRISInputError:
    return MatRISInputError(
        f"{p}: energy_key={energy_key!r} is in none of the {n} frames; use e.g. 'corrected_total_energy', "
        "'uncorrected_total_energy' or 'energy_per_atom'."
    )


def _mptrj_sample(frame: Any, p: Path, k: int, material_id: str, frame_id: str, energy_key: str,
                  per_atom: bool) -> Sample:
    who = f"{p} record {k} ({material_id}/{frame_id})"
    if not isinstance(frame, dict) or "structure" not in frame:
        raise MatRISInputError(f"{who}: the frame has no 'structure'; every frame needs one.")
    system = _system_from_structure_dict(frame["structure"], who, str(frame_id))
    # VASP kBar, positive = compressive → ASE sign, GPa
    return _make_sample(who, system, frame.get(energy_key), frame.get("force"), frame.get("stress"),
                        frame.get("magmom"), -KBAR_TO_GPA, str(material_id), str(frame_id), energy_per_atom=per_atom)
