"""Any file ASE reads (extxyz, traj, ...), through ``ase.io``: labels from the calculator
results or named ``info``/``arrays`` keys. Extxyz files are read by byte offset instead
(:mod:`.extxyz`), with the same per-frame conversion (:func:`_sample_from_atoms`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import MatRISInputError
from .common import (
    _LABEL_KEYS,
    BadRecord,
    Sample,
    _broken,
    _check_file,
    _first_line,
    _first_present,
    _KeyTracker,
    _label_options,
    _make_sample,
    _record,
)


def read_ase(
    path: str | os.PathLike,
    index: str | int = ":",
    energy_key: str | None = None,
    forces_key: str | None = None,
    stress_key: str | None = None,
    magmoms_key: str | None = None,
    material_id_key: str | None = None,
    stress_unit: str = "eV/A3",
) -> list[Sample]:
    """Labelled structures from any ASE-readable file (extxyz, traj, ...).

    With a key None, the label comes from the attached calculator's results (ASE units:
    energy eV, forces eV/Å, stress eV/Å³ as a Voigt 6-vector or 3×3, magmoms μB). With a key
    given, it comes from ``atoms.info[key]`` (energy, stress, material id) or
    ``atoms.arrays[key]`` (forces, magmoms); ASE's extxyz reader moves keys named
    energy/forces/stress/magmoms into a SinglePointCalculator, so the calculator results are
    searched for the key too. ``stress_unit`` ("eV/A3", "GPa" or "kbar", all with the ASE
    sign: positive = tensile) is the unit of the stored stress wherever it was read from;
    it is converted to GPa. A named key found in no structure is an error (likely a typo).

    Material id: ``info[material_id_key]``, else ``"<file stem>:<k>"`` with k the position
    among the frames read.
    """
    return list(iter_ase(path, index, energy_key=energy_key, forces_key=forces_key, stress_key=stress_key,
                         magmoms_key=magmoms_key, material_id_key=material_id_key, stress_unit=stress_unit))


def _unreadable(p: Path, e: Exception, frame: int | None = None) -> MatRISInputError:
    where = f"frame {frame} (counting from 0) of " if frame is not None else ""
    return MatRISInputError(
        f"{where}{p}: ASE cannot read it ({type(e).__name__}: {_first_line(e)}); the file may be truncated or in "
        "another format. Give a format ASE reads (extxyz, traj, ...), an ASE .db or .aselmdb database, or an MPtrj "
        "or MatPES .json."
    )


def iter_ase(path: str | os.PathLike, index: str | int = ":", **options: Any) -> Iterator[Sample]:
    """:func:`read_ase`, one structure at a time (streams large files); same keyword options."""
    p = _check_file(path)
    return _iter_ase_frames(p, index, 0, None, "raise", options)


def _iter_ase_frames(p: Path, index: str | int, start: int, stop: int | None, on_error: str,
                     options: dict[str, Any]) -> Iterator[Sample | BadRecord]:
    """Records ``[start, stop)`` of the frames ``index`` of ``p``, through ``ase.io.iread``.

    A record's number k is its position among the frames ``index`` selects (material id
    ``"<stem>:<k>"``). With ``index=":"`` the range is handed to ASE as a slice (random access
    in .traj); otherwise frames before ``start`` are read and skipped.
    """
    import ase.io

    keys, factor, tracker = _label_options(p, options)
    first = 0
    if index == ":" and (start or stop is not None):
        index, first = f"{start}:{'' if stop is None else stop}", start
    try:  # ase raises many exception types for unreadable files
        frames = ase.io.iread(str(p), index=index) if isinstance(index, str) else iter([ase.io.read(str(p), index)])
    except Exception as e:
        raise _unreadable(p, e) from e
    k, n = first, 0
    while stop is None or k < stop:
        try:
            atoms = next(frames)
        except StopIteration:
            break
        except Exception as e:  # noqa: BLE001 - the reader cannot go on after a broken frame
            yield _broken(k, on_error, _unreadable(p, e, k))
            return
        if k >= start:
            yield _record(k, on_error, _sample_from_atoms, atoms, p, k, factor, tracker, keys)
            n += 1
        k += 1
    tracker.check(p, n)


def _calc_results(atoms: Any) -> dict:
    calc = getattr(atoms, "calc", None)
    return dict(getattr(calc, "results", None) or {})


def _sample_from_atoms(atoms, p: Path, k: int, factor: float, tracker: _KeyTracker,
                       keys: dict[str, str | None]) -> Sample:
    from ...structures import to_system

    energy_key, forces_key, stress_key, magmoms_key, material_id_key = (keys[k] for k in _LABEL_KEYS)
    results = _calc_results(atoms)
    info, arrays = atoms.info, atoms.arrays
    tracker.available.update(info)
    tracker.available.update(a for a in arrays if a not in ("numbers", "positions"))
    tracker.available.update(results)

    def get(label: str, key: str | None, default_keys: tuple[str, ...], per_atom: bool):
        if key is None:
            return _first_present(*[(results, d) for d in default_keys])
        place = (arrays, key) if per_atom else (info, key)
        value = _first_present(place, (results, key), (info if per_atom else arrays, key))
        if value is not None:
            tracker.found[label] = True
        return value

    system = to_system(atoms)
    name = str(info.get("name", "")) or system.name
    who = f"{p} frame {k}" + (f" ({name})" if name else "")
    energy = get("energy_key", energy_key, ("energy", "free_energy"), False)
    forces = get("forces_key", forces_key, ("forces",), True)
    stress = get("stress_key", stress_key, ("stress",), False)
    magmoms = get("magmoms_key", magmoms_key, ("magmoms",), True)
    mid = get("material_id_key", material_id_key, (), False) if material_id_key else None
    return _make_sample(who, system, energy, forces, stress, magmoms, factor,
                        str(mid) if mid is not None else f"{p.stem}:{k}", name)


def _traj_count(p: Path, index: str | int) -> int:
    """The number of frames ``index`` selects of the ASE trajectory ``p`` (its length, no frames read)."""
    from ase.io.formats import string2index
    from ase.io.trajectory import Trajectory

    try:
        with Trajectory(str(p)) as traj:
            frames = range(len(traj))
    except Exception as e:
        raise _unreadable(p, e) from e
    sel = string2index(index) if isinstance(index, str) else index
    return len(frames[sel]) if isinstance(sel, slice) else 1
