"""What every reader shares: :class:`Sample` and :class:`BadRecord`, units, argument checks,
label extraction and the one checked construction of a sample (:func:`_make_sample`)."""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import MatRISInputError
from ...graph.system import AtomicSystem

EV_PER_A3_TO_GPA = 160.21766208  # 1 eV/Å³ in GPa
KBAR_TO_GPA = 0.1

# stress_unit → factor to GPa (all with the ASE sign, positive = tensile)
STRESS_UNITS = {"eV/A3": EV_PER_A3_TO_GPA, "GPa": 1.0, "kbar": KBAR_TO_GPA}

# MPtrj energy keys that are per atom; they are multiplied by n_atoms to give totals
_PER_ATOM_SUFFIX = "_per_atom"

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


_LABEL_KEYS = ("energy_key", "forces_key", "stress_key", "magmoms_key", "material_id_key")


def _label_options(p: Path, options: dict[str, Any], kind: str = "ASE file",
                   extra: frozenset = frozenset()) -> tuple[dict[str, str | None], float, _KeyTracker]:
    """(label keys, stress factor to GPa, key tracker) from the keyword options of an ASE reader."""
    _only(options, set(_LABEL_KEYS) | {"stress_unit"} | set(extra), p, kind)
    keys = {k: options.get(k) for k in _LABEL_KEYS}
    return keys, _stress_unit_factor(options.get("stress_unit", "eV/A3")), _KeyTracker(dict(keys))


def _only(options: dict, allowed: set, p: Path, kind: str) -> None:
    extra = set(options) - allowed
    if extra:
        raise MatRISInputError(f"{p} is an {kind}; options {sorted(extra)} do not apply (allowed: {sorted(allowed)}).")
