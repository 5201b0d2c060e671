"""Labelled structures from files: ASE-readable files, ASE databases (sqlite and LMDB), and the
MPtrj and MatPES JSON releases, streamed at constant memory.

Every reader returns :class:`Sample` objects in MatRIS units and conventions:

- energy: TOTAL energy of the structure, eV (float64); NaN when missing.
- forces: ``[n_atoms, 3]`` eV/Å; ``None`` when missing.
- stress: ``[3, 3]`` GPa with the ASE sign convention (positive = tensile, i.e. a cell that
  wants to shrink). ASE's ``atoms.get_stress()`` is eV/Å³ with this sign, so
  GPa = eV/Å³ × 160.21766208. ``None`` when missing.
- magmoms: ``[n_atoms]`` Bohr magnetons μB; ``None`` when missing.

A label that is present must be finite: NaN or infinite energies, forces, stresses or magmoms
are an error (never read as "missing").

Formats, by suffix: ``.extxyz``/``.xyz`` (and anything else ASE reads), ``.traj``, ``.db``
(ASE sqlite), ``.aselmdb``/``.lmdb`` (ASE-LMDB: OMat24, sAlex, OMol25), ``.json``/``.json.gz``
(MPtrj ``{material: {frame: ...}}``, MatPES ``[record, ...]``, else an ASE JSON database).
:func:`iter_samples` reads records ``[start, stop)`` of any of them in file order, touching as
little of the file as the format allows; :func:`count_samples` counts cheaply where possible;
:func:`expand_data_paths` turns files, directories and globs into one list of data files.

Errors: a problem the user can fix raises :class:`~matris.errors.MatRISInputError` naming the
file, the record (index in file order, counting from 0, and its id where the format has one),
the problem and the fix. With ``on_error="skip"`` a bad record is yielded as a
:class:`BadRecord` instead and reading goes on with the next record (a truncated or corrupt
stream yields one BadRecord and ends).

ase, ijson and ase-db-backends are imported inside the readers, so ``matris.data`` imports
without them; ijson (JSON) and ase-db-backends (ASE-LMDB) come with the ``data`` extra, and a
reader that needs a missing one says so in one line (:func:`matris.extras.require`).
"""

from __future__ import annotations

import glob
import gzip
import io
import math
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MatRISInputError
from ..extras import require
from ..graph.system import AtomicSystem, element_symbol

EV_PER_A3_TO_GPA = 160.21766208  # 1 eV/Å³ in GPa
KBAR_TO_GPA = 0.1

# stress_unit → factor to GPa (all with the ASE sign, positive = tensile)
STRESS_UNITS = {"eV/A3": EV_PER_A3_TO_GPA, "GPa": 1.0, "kbar": KBAR_TO_GPA}

# MPtrj energy keys that are per atom; they are multiplied by n_atoms to give totals
_PER_ATOM_SUFFIX = "_per_atom"

# file name endings that directories and globs are searched for (lower case)
DATA_SUFFIXES = (".extxyz", ".xyz", ".traj", ".db", ".aselmdb", ".lmdb", ".json", ".json.gz")

_ON_ERROR = ("raise", "skip")


@dataclass
class Sample:
    """One labelled structure.

    Attributes:
        system: the structure (positions Å, cell Å, pbc, atomic numbers).
        energy: total energy, eV; NaN when missing.
        forces: ``[n_atoms, 3]`` eV/Å, or None.
        stress: ``[3, 3]`` GPa, ASE sign (positive = tensile), or None.
        magmoms: ``[n_atoms]`` μB, or None.
        material_id: identifier used to split train/validation by material; defaults to
            ``"<file stem>:<index>"`` so that each structure is its own material.
        name: human-readable label (MPtrj frame id, ASE ``info['name']`` or the formula).
    """

    system: AtomicSystem
    energy: float = math.nan
    forces: np.ndarray | None = None
    stress: np.ndarray | None = None
    magmoms: np.ndarray | None = None
    material_id: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        self.energy = math.nan if self.energy is None else float(self.energy)
        if self.forces is not None:
            self.forces = np.asarray(self.forces, dtype=np.float64)
        if self.stress is not None:
            self.stress = _stress_3x3(self.stress, self.name or "sample")
        if self.magmoms is not None:
            self.magmoms = np.asarray(self.magmoms, dtype=np.float64).reshape(-1)


@dataclass
class BadRecord:
    """A record that could not be read, yielded in its place with ``on_error="skip"``.

    Attributes:
        index: position of the record in the file, in file order, counting from 0.
        message: the problem, naming the file, the record and the fix (the text the
            ``on_error="raise"`` error would have had).
    """

    index: int
    message: str


# ----------------------------------------------------------------------------- helpers


def _check_file(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"data file {str(p)!r} does not exist; check the path.")
    if p.is_dir():
        raise MatRISInputError(
            f"{str(p)!r} is a directory; give a data file (extxyz, traj, .db, .aselmdb, MPtrj or MatPES .json), "
            "or expand the directory with expand_data_paths."
        )
    return p


def _check_range(p: Path, start: int, stop: int | None) -> tuple[int, int | None]:
    """``start``/``stop`` as ints, checked: 0 ≤ start, stop None or ≥ start."""
    ok = isinstance(start, (int, np.integer)) and start >= 0
    ok = ok and (stop is None or (isinstance(stop, (int, np.integer)) and stop >= start))
    if not ok:
        raise MatRISInputError(
            f"{p}: records [start={start!r}, stop={stop!r}) is not a valid range; give 0 <= start <= stop "
            "(stop=None for the end of the file)."
        )
    return int(start), None if stop is None else int(stop)


def _check_on_error(on_error: str) -> None:
    if on_error not in _ON_ERROR:
        raise MatRISInputError(f"on_error={on_error!r}; use 'raise' (stop at the first bad record) or 'skip' "
                               "(yield a BadRecord in its place and go on).")


def _record(index: int, on_error: str, build: Callable[..., Sample], *args: Any) -> Sample | BadRecord:
    """``build(*args)``, or its MatRISInputError as a BadRecord when ``on_error == "skip"``."""
    try:
        return build(*args)
    except MatRISInputError as e:
        if on_error == "raise":
            raise
        return BadRecord(index, str(e))


def _broken(index: int, on_error: str, error: MatRISInputError) -> BadRecord:
    """The end of an unreadable stream: raised, or one BadRecord with ``on_error="skip"``."""
    if on_error == "raise":
        raise error
    return BadRecord(index, str(error))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""


def _is_gz(p: Path) -> bool:
    return p.name.lower().endswith(".gz")


def _is_json(p: Path) -> bool:
    name = p.name.lower()
    return name.endswith((".json", ".json.gz"))


def _open_binary(p: Path):
    return gzip.open(p, "rb") if _is_gz(p) else open(p, "rb")


def _stress_unit_factor(stress_unit: str) -> float:
    if stress_unit not in STRESS_UNITS:
        raise MatRISInputError(
            f"unknown stress_unit {stress_unit!r}; use one of {sorted(STRESS_UNITS)} (all with the ASE sign, "
            "positive = tensile). For MPtrj/VASP kBar (positive = compressive) use read_mptrj."
        )
    return STRESS_UNITS[stress_unit]


def _stress_3x3(value: Any, who: str) -> np.ndarray:
    """A 3×3 stress from a 3×3 matrix, a 9-vector or an ASE Voigt 6-vector (xx yy zz yz xz xy)."""
    try:
        s = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise MatRISInputError(f"{who}: the stress is not numeric ({_first_line(e)}); fix or remove the record.") from e
    if s.shape == (3, 3):
        return s
    if s.size == 9:
        return s.reshape(3, 3)
    if s.size == 6:
        xx, yy, zz, yz, xz, xy = s.reshape(6)
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    raise MatRISInputError(
        f"{who}: stress has shape {s.shape}; expected a 3×3 matrix, 9 values or a Voigt 6-vector (xx yy zz yz xz xy)."
    )


def _finite_array(who: str, label: str, value: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """``value`` as a float64 array of ``shape``, all finite; None stays None."""
    if value is None:
        return None
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise MatRISInputError(
            f"{who}: the {label} are not numeric ({_first_line(e)}); fix or remove the record."
        ) from e
    if a.size != int(np.prod(shape)):
        raise MatRISInputError(
            f"{who}: the {label} have shape {a.shape}; expected {list(shape)} for its {shape[0]} atoms. "
            "Fix or remove the record."
        )
    a = a.reshape(shape)
    if not np.isfinite(a).all():
        k = int(np.flatnonzero(~np.isfinite(a.reshape(shape[0], -1)).all(axis=1))[0])
        raise MatRISInputError(
            f"{who}: the {label} of atom {k} are {a[k].tolist()}; labels must be finite (NaN is not read as "
            "'missing'). Fix or remove the record, or read with on_error='skip'."
        )
    return a


def _make_sample(who: str, system: AtomicSystem, energy: Any, forces: Any, stress: Any, magmoms: Any,
                 stress_factor: float, material_id: str, name: str, *, require_energy: bool = False,
                 energy_per_atom: bool = False) -> Sample:
    """A checked :class:`Sample`: labels numeric, finite and of the right shape.

    energy: eV (eV/atom with ``energy_per_atom``, then × n_atoms); stress in any layout
    :func:`_stress_3x3` takes, times ``stress_factor`` (to GPa, ASE sign).
    """
    n = system.num_atoms
    if energy is None:
        if require_energy:
            raise MatRISInputError(
                f"{who}: the record has no energy, which every record of this format carries; the file is "
                "incomplete or was written wrongly. Re-export it, or read with on_error='skip' to leave the record out."
            )
        e = math.nan
    else:
        try:
            e = float(np.asarray(energy, dtype=np.float64).reshape(()))
        except (TypeError, ValueError) as ex:
            raise MatRISInputError(
                f"{who}: the energy {str(energy)[:60]!r} is not one number ({_first_line(ex)}); fix or remove the "
                "record."
            ) from ex
        if not math.isfinite(e):
            raise MatRISInputError(
                f"{who}: the energy is {e}; labels must be finite (NaN is not read as 'missing'). Fix or remove the "
                "record, or read with on_error='skip'."
            )
        e *= n if energy_per_atom else 1
    s = None
    if stress is not None:
        s = _stress_3x3(stress, who) * stress_factor
        if not np.isfinite(s).all():
            raise MatRISInputError(
                f"{who}: the stress is {s.tolist()}; labels must be finite. Fix or remove the record, or read with "
                "on_error='skip'."
            )
    return Sample(
        system=system,
        energy=e,
        forces=_finite_array(who, "forces", forces, (n, 3)),
        stress=s,
        magmoms=_finite_array(who, "magmoms", magmoms, (n,)),
        material_id=material_id,
        name=name,
    )


def _calc_results(atoms: Any) -> dict:
    calc = getattr(atoms, "calc", None)
    return dict(getattr(calc, "results", None) or {})


def _first_present(*sources_and_keys: tuple[dict, str]) -> Any:
    for source, key in sources_and_keys:
        if key in source and source[key] is not None:
            return source[key]
    return None


class _KeyTracker:
    """Remembers whether an explicitly named label key was found in any structure."""

    def __init__(self, keys: dict[str, str | None]):
        self.keys = {k: v for k, v in keys.items() if v is not None}
        self.found = {k: False for k in self.keys}
        self.available: set[str] = set()

    def check(self, path: Path, n: int) -> None:
        missing = [f"{k}={self.keys[k]!r}" for k, ok in self.found.items() if not ok]
        if missing and n:
            raise MatRISInputError(
                f"{path}: {', '.join(missing)} was found in none of the {n} structures; keys present: "
                f"{sorted(self.available)}. Pass the right key, or None to use the stored calculator results."
            )


# ----------------------------------------------------------------------------- ASE files


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


_LABEL_KEYS = ("energy_key", "forces_key", "stress_key", "magmoms_key", "material_id_key")


def _label_options(p: Path, options: dict[str, Any], kind: str = "ASE file",
                   extra: frozenset = frozenset()) -> tuple[dict[str, str | None], float, _KeyTracker]:
    """(label keys, stress factor to GPa, key tracker) from the keyword options of an ASE reader."""
    _only(options, set(_LABEL_KEYS) | {"stress_unit"} | set(extra), p, kind)
    keys = {k: options.get(k) for k in _LABEL_KEYS}
    return keys, _stress_unit_factor(options.get("stress_unit", "eV/A3")), _KeyTracker(dict(keys))


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


def _sample_from_atoms(atoms, p: Path, k: int, factor: float, tracker: _KeyTracker,
                       keys: dict[str, str | None]) -> Sample:
    from ..structures import to_system

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


# ----------------------------------------------------------------------------- extxyz frame index

_OFFSETS: dict[tuple[str, int, int], tuple[np.ndarray, str | None]] = {}  # small per-process memo


def _extxyz_offsets(p: Path) -> tuple[np.ndarray, str | None]:
    """Byte offsets of the frames of an (ext)xyz file, from one line-scanning pass.

    Returns ``(offsets, problem)``: ``offsets[k]`` is where frame k starts and
    ``offsets[-1]`` where the last complete frame ends (``len(offsets) - 1`` frames).
    ``problem`` describes a broken frame right after them (a count line that is not a
    number, or a file that ends inside a frame), else None. Like ASE, a blank line ends the
    frames; legacy ``VEC`` lines after the atoms belong to the frame. Memoised per
    (path, size, mtime), so workers of one process scan a file once.
    """
    st = p.stat()
    memo_key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if memo_key in _OFFSETS:
        return _OFFSETS[memo_key]
    from itertools import islice

    offsets = [0]
    problem = None
    pos = 0
    with open(p, "rb") as f:
        while True:
            line = f.readline()
            head = line.strip()
            if not head:
                break
            try:
                n_atoms = int(head)
                if n_atoms < 0:
                    raise ValueError(n_atoms)
            except ValueError:
                found = head[:60].decode(errors="replace")
                problem = f"expected the atom-count line of a frame at byte {pos}, found {found!r}"
                break
            lengths = list(map(len, islice(f, n_atoms + 1)))  # comment line + atom lines
            if len(lengths) < n_atoms + 1:
                problem = (f"the file ends inside the frame: {n_atoms} atoms announced, "
                           f"{max(len(lengths) - 1, 0)} atom lines found (truncated)")
                break
            pos += len(line) + sum(lengths)
            while f.peek(8)[:8].lstrip().startswith(b"VEC"):
                pos += len(f.readline())
            offsets.append(pos)
    result = (np.asarray(offsets, dtype=np.int64), problem)
    if len(_OFFSETS) >= 8:
        _OFFSETS.pop(next(iter(_OFFSETS)))
    _OFFSETS[memo_key] = result
    return result


def _extxyz_frames(p: Path, index: str | int = ":") -> range:
    """The frame numbers ``index`` selects, a broken frame after the complete ones included."""
    from ase.io.formats import string2index

    offsets, problem = _extxyz_offsets(p)
    frames = range(len(offsets) - 1 + (problem is not None))
    try:
        sel = string2index(index) if isinstance(index, str) else index
        return frames[sel] if isinstance(sel, slice) else range(frames[sel], frames[sel] + 1)
    except (ValueError, IndexError, TypeError) as e:
        raise MatRISInputError(f"{p}: index={index!r} does not select frames of its {len(frames)} ({e}); give an "
                               "int or a slice string like '0:10' or '::2'.") from e


_EXTXYZ_CHUNK = 1 << 22  # bytes of frames parsed per ASE call


def _iter_extxyz(p: Path, frames: range, first: int, on_error: str,
                 options: dict[str, Any]) -> Iterator[Sample | BadRecord]:
    """Records ``first, first + 1, ...`` of an extxyz file: its frames ``frames`` (file frame numbers)."""
    import ase.io

    keys, factor, tracker = _label_options(p, options)
    offsets, problem = _extxyz_offsets(p)
    n_frames = len(offsets) - 1
    if n_frames == 0 and problem is None and first == 0:
        raise MatRISInputError(f"{p}: the file is empty (no frames); give an extxyz file with at least one structure.")
    n_read = 0
    j = 0  # position in frames; record number first + j
    with open(p, "rb") as f:
        while j < len(frames):
            frame = frames[j]
            if frame == n_frames:  # the broken frame after the complete ones
                yield _broken(first + j, on_error, _unreadable(p, EOFError(problem), first + j))
                j += 1
                continue
            last = j + 1  # one chunk: consecutive whole frames, up to _EXTXYZ_CHUNK bytes (at least one)
            while (last < len(frames) and frames[last] == frames[last - 1] + 1 and frames[last] < n_frames
                   and offsets[frames[last] + 1] - offsets[frame] <= _EXTXYZ_CHUNK):
                last += 1
            f.seek(int(offsets[frame]))
            text = f.read(int(offsets[frames[last - 1] + 1] - offsets[frame])).decode("utf-8", errors="replace")
            parsed = ase.io.iread(io.StringIO(text), index=":", format="extxyz")
            while j < last:
                k = first + j
                try:
                    atoms = next(parsed)
                    error = None
                except StopIteration:  # cannot happen with a consistent index; treat as broken
                    atoms, error = None, EOFError("frame missing from its byte slice")
                except Exception as e:  # noqa: BLE001 - the frame's error, reported below
                    atoms, error = None, e
                j += 1
                if error is not None:
                    yield _broken(k, on_error, _unreadable(p, error, k))
                    break  # restart ASE at the next frame
                yield _record(k, on_error, _sample_from_atoms, atoms, p, k, factor, tracker, keys)
                n_read += 1
    tracker.check(p, n_read)


# ----------------------------------------------------------------------------- ASE databases (sqlite, LMDB)


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
    from ..structures import to_system

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


# ----------------------------------------------------------------------------- JSON streams (MPtrj, MatPES)

_SYMBOL_TO_Z = {element_symbol(z): z for z in range(1, 119)}


def _json_first_char(p: Path) -> str:
    """The first non-whitespace character of a (gzipped) JSON file, without reading the rest."""
    try:
        with _open_binary(p) as f:
            while True:
                chunk = f.read(1 << 16)
                if not chunk:
                    return ""
                chunk = chunk.lstrip()
                if chunk:
                    return chr(chunk[0])
    except (OSError, EOFError, zlib.error) as e:
        raise MatRISInputError(
            f"{p}: cannot read it{' as gzip' if _is_gz(p) else ''} ({type(e).__name__}: {_first_line(e)}); the file "
            "is corrupt or truncated. Re-download it."
        ) from e


def _ijson():
    """The ijson module (streamed JSON: MPtrj, MatPES), installed with the data extra."""
    return require("ijson", "data", "reading JSON datasets (MPtrj, MatPES)")


def _stream_errors() -> tuple[type[BaseException], ...]:
    ijson = _ijson()
    return (ijson.JSONError, EOFError, OSError, zlib.error, UnicodeDecodeError)


def _json_error(p: Path, k: int, after: str | None, e: BaseException) -> MatRISInputError:
    """A truncated or corrupt JSON stream, where record ``k`` should have started."""
    where = f" (after {after})" if after else ""
    return MatRISInputError(
        f"{p} record {k}{where}: not valid JSON from here on ({type(e).__name__}: {_first_line(e)}); the file is "
        "truncated or corrupt. Re-download or re-export it (NaN and Infinity are not JSON: write null for a "
        "missing label)."
    )


def _looks_like_mptrj_stream(p: Path) -> bool:
    """True when the stream is ``{material_id: {frame_id: {..., "structure": ...}}}``; reads one frame."""
    ijson = _ijson()
    depth = 0
    try:
        with _open_binary(p) as f:
            for _prefix, event, value in ijson.parse(f, use_float=True):
                if event in ("start_map", "start_array"):
                    depth += 1
                    if event == "start_array" and depth <= 3:
                        return False  # the document, a material or a frame is a list
                elif event in ("end_map", "end_array"):
                    depth -= 1
                    if depth <= 2:
                        return False  # the first frame (or material, or document) ended without a structure
                elif event == "map_key":
                    if depth == 3 and value == "structure":
                        return True
                elif depth <= 2:
                    return False  # a scalar where a material or a frame should be
    except _stream_errors() as e:
        raise MatRISInputError(f"{p}: not valid JSON ({type(e).__name__}: {_first_line(e)}); give an MPtrj-style "
                               "or MatPES JSON file, or re-download a truncated one.") from e
    return False


def _json_kind(p: Path) -> str:
    """"matpes" (a list), "mptrj" (the MPtrj dict) or "other" (another JSON dict: an ASE JSON database)."""
    first = _json_first_char(p)
    if first == "[":
        return "matpes"
    if first == "{":
        return "mptrj" if _looks_like_mptrj_stream(p) else "other"
    what = "the file is empty" if not first else f"it starts with {first!r}"
    raise MatRISInputError(f"{p}: not valid JSON ({what}); give an MPtrj JSON ({{...}}), a MatPES JSON list "
                           "([...]) or an ASE JSON database.")


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


def looks_like_mptrj(data: Any) -> bool:
    """True when ``data`` is ``{material_id: {frame_id: {"structure": ...}}}``."""
    if not isinstance(data, dict) or not data:
        return False
    frames = next(iter(data.values()))
    if not isinstance(frames, dict) or not frames:
        return False
    frame = next(iter(frames.values()))
    return isinstance(frame, dict) and "structure" in frame


def _mptrj_sample(frame: Any, p: Path, k: int, material_id: str, frame_id: str, energy_key: str,
                  per_atom: bool) -> Sample:
    who = f"{p} record {k} ({material_id}/{frame_id})"
    if not isinstance(frame, dict) or "structure" not in frame:
        raise MatRISInputError(f"{who}: the frame has no 'structure'; every frame needs one.")
    system = _system_from_structure_dict(frame["structure"], who, str(frame_id))
    # VASP kBar, positive = compressive → ASE sign, GPa
    return _make_sample(who, system, frame.get(energy_key), frame.get("force"), frame.get("stress"),
                        frame.get("magmom"), -KBAR_TO_GPA, str(material_id), str(frame_id), energy_per_atom=per_atom)


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


def _system_from_structure_dict(d: dict, who: str, name: str) -> AtomicSystem:
    """An AtomicSystem straight from ``Structure.as_dict()`` (as pymatgen would build it, but fast)."""
    try:
        lattice = np.asarray(d["lattice"]["matrix"], dtype=np.float64)
        pbc = d["lattice"].get("pbc", (True, True, True))
        positions, numbers = [], []
        for s, site in enumerate(d["sites"]):
            species = site["species"]
            if len(species) != 1 or abs(float(species[0].get("occu", 1.0)) - 1.0) > 1e-8:
                raise MatRISInputError(
                    f"{who}: site {s} is disordered (partial occupancies); MatRIS needs one element per site. "
                    "Order the structure first."
                )
            symbol = species[0]["element"]
            if symbol not in _SYMBOL_TO_Z:
                raise MatRISInputError(
                    f"{who}: site {s} has unknown element {symbol!r}; MatRIS needs a chemical element (H to Pu) on "
                    "every site. Fix the structure or remove the record."
                )
            numbers.append(_SYMBOL_TO_Z[symbol])
            positions.append(site["xyz"] if "xyz" in site else np.asarray(site["abc"], dtype=np.float64) @ lattice)
        positions = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
    except (KeyError, TypeError, IndexError, ValueError) as e:
        if isinstance(e, MatRISInputError):
            raise
        raise MatRISInputError(
            f"{who}: the 'structure' entry is not a pymatgen Structure.as_dict() ({type(e).__name__}: {e})."
        ) from e
    return AtomicSystem(positions, lattice, pbc, numbers, name)


# ----------------------------------------------------------------------------- dispatch


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
        from ase.io.formats import string2index
        from ase.io.trajectory import Trajectory

        try:
            with Trajectory(str(p)) as traj:
                frames = range(len(traj))
        except Exception as e:
            raise _unreadable(p, e) from e
        index = options.get("index", ":")
        sel = string2index(index) if isinstance(index, str) else index
        return len(frames[sel]) if isinstance(sel, slice) else 1
    return None


def _only(options: dict, allowed: set, p: Path, kind: str) -> None:
    extra = set(options) - allowed
    if extra:
        raise MatRISInputError(f"{p} is an {kind}; options {sorted(extra)} do not apply (allowed: {sorted(allowed)}).")


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
