"""Labelled structures from files: ASE-readable files, ASE databases and the MPtrj JSON.

Every reader returns :class:`Sample` objects in MatRIS units and conventions:

- energy: TOTAL energy of the structure, eV (float64); NaN when missing.
- forces: ``[n_atoms, 3]`` eV/Å; ``None`` when missing.
- stress: ``[3, 3]`` GPa with the ASE sign convention (positive = tensile, i.e. a cell that
  wants to shrink). ASE's ``atoms.get_stress()`` is eV/Å³ with this sign, so
  GPa = eV/Å³ × 160.21766208. ``None`` when missing.
- magmoms: ``[n_atoms]`` Bohr magnetons μB; ``None`` when missing.

ase and pymatgen are imported inside the readers, so ``matris.data`` imports without them.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import MatRISInputError
from ..graph.system import AtomicSystem, element_symbol

EV_PER_A3_TO_GPA = 160.21766208  # 1 eV/Å³ in GPa
KBAR_TO_GPA = 0.1

# stress_unit → factor to GPa (all with the ASE sign, positive = tensile)
STRESS_UNITS = {"eV/A3": EV_PER_A3_TO_GPA, "GPa": 1.0, "kbar": KBAR_TO_GPA}

# MPtrj energy keys that are per atom; they are multiplied by n_atoms to give totals
_PER_ATOM_SUFFIX = "_per_atom"


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


# ----------------------------------------------------------------------------- helpers


def _check_file(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"data file {str(p)!r} does not exist; check the path.")
    if p.is_dir():
        raise MatRISInputError(f"{str(p)!r} is a directory; give a data file (extxyz, traj, .db or MPtrj .json).")
    return p


def _stress_unit_factor(stress_unit: str) -> float:
    if stress_unit not in STRESS_UNITS:
        raise MatRISInputError(
            f"unknown stress_unit {stress_unit!r}; use one of {sorted(STRESS_UNITS)} (all with the ASE sign, "
            "positive = tensile). For MPtrj/VASP kBar (positive = compressive) use read_mptrj."
        )
    return STRESS_UNITS[stress_unit]


def _stress_3x3(value: Any, who: str) -> np.ndarray:
    """A 3×3 stress from a 3×3 matrix, a 9-vector or an ASE Voigt 6-vector (xx yy zz yz xz xy)."""
    s = np.asarray(value, dtype=np.float64)
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


def _label_options(p: Path, options: dict[str, Any]) -> tuple[dict[str, str | None], float, "_KeyTracker"]:
    """(label keys, stress factor to GPa, key tracker) from the keyword options of an ASE reader."""
    _only(options, set(_LABEL_KEYS) | {"stress_unit"}, p, "ASE file")
    keys = {k: options.get(k) for k in _LABEL_KEYS}
    return keys, _stress_unit_factor(options.get("stress_unit", "eV/A3")), _KeyTracker(dict(keys))


def iter_ase(path: str | os.PathLike, index: str | int = ":", **options: Any) -> Iterator[Sample]:
    """:func:`read_ase`, one structure at a time (streams large files); same keyword options."""
    import ase.io

    p = _check_file(path)
    keys, factor, tracker = _label_options(p, options)
    energy_key, forces_key, stress_key, magmoms_key, material_id_key = (keys[k] for k in _LABEL_KEYS)

    def unreadable(e: Exception, frame: int | None = None) -> MatRISInputError:
        where = f"frame {frame} (counting from 0) of " if frame is not None else ""
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return MatRISInputError(
            f"{where}{p}: ASE cannot read it ({type(e).__name__}: {first}); the file may be truncated or in another "
            "format. Give a format ASE reads (extxyz, traj, ...), an ASE .db database, or an MPtrj .json."
        )

    try:  # ase raises many exception types for unreadable files
        frames = ase.io.iread(str(p), index=index) if isinstance(index, str) else iter([ase.io.read(str(p), index)])
    except Exception as e:
        raise unreadable(e) from e
    n = 0
    while True:
        try:
            atoms = next(frames)
        except StopIteration:
            break
        except Exception as e:
            raise unreadable(e, n) from e
        yield _sample_from_atoms(atoms, p, n, factor, tracker, energy_key, forces_key, stress_key, magmoms_key,
                                 material_id_key)
        n += 1
    tracker.check(p, n)


def _sample_from_atoms(atoms, p: Path, k: int, factor: float, tracker: _KeyTracker,
                       energy_key, forces_key, stress_key, magmoms_key, material_id_key) -> Sample:
    from ..structures import to_system

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
    who = f"{p} structure {k}"
    energy = get("energy_key", energy_key, ("energy", "free_energy"), False)
    forces = get("forces_key", forces_key, ("forces",), True)
    stress = get("stress_key", stress_key, ("stress",), False)
    magmoms = get("magmoms_key", magmoms_key, ("magmoms",), True)
    mid = get("material_id_key", material_id_key, (), False) if material_id_key else None
    name = str(info.get("name", "")) or system.name
    return Sample(
        system=system,
        energy=math.nan if energy is None else float(np.asarray(energy).reshape(())),
        forces=None if forces is None else np.asarray(forces, dtype=np.float64),
        stress=None if stress is None else _stress_3x3(stress, who) * factor,
        magmoms=None if magmoms is None else np.asarray(magmoms, dtype=np.float64),
        material_id=str(mid) if mid is not None else f"{p.stem}:{k}",
        name=name,
    )


# ----------------------------------------------------------------------------- ASE database


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
    ``row.key_value_pairs[material_id_key]``, else ``"<file stem>:<row id>"``.
    """
    return list(iter_ase_db(path, selection, energy_key=energy_key, forces_key=forces_key, stress_key=stress_key,
                            magmoms_key=magmoms_key, material_id_key=material_id_key, stress_unit=stress_unit))


def iter_ase_db(path: str | os.PathLike, selection: Any = None, **options: Any) -> Iterator[Sample]:
    """:func:`read_ase_db`, one row at a time; same keyword options."""
    import ase.db

    from ..structures import to_system

    p = _check_file(path)  # ase.db.connect would silently create a missing database
    keys, factor, tracker = _label_options(p, options)
    energy_key, forces_key, stress_key, magmoms_key, material_id_key = (keys[k] for k in _LABEL_KEYS)
    try:
        db = ase.db.connect(str(p), type="db")
        rows = db.select(selection)
        n = 0
        for row in rows:
            n += 1
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

            system = to_system(row.toatoms())
            who = f"{p} row {row.id}"
            energy = get("energy_key", energy_key, "energy")
            forces = get("forces_key", forces_key, "forces")
            stress = get("stress_key", stress_key, "stress")
            magmoms = get("magmoms_key", magmoms_key, "magmoms")
            mid = get("material_id_key", material_id_key, "__none__") if material_id_key else None
            yield Sample(
                system=system,
                energy=math.nan if energy is None else float(energy),
                forces=None if forces is None else np.asarray(forces, dtype=np.float64),
                stress=None if stress is None else _stress_3x3(stress, who) * factor,
                magmoms=None if magmoms is None else np.asarray(magmoms, dtype=np.float64),
                material_id=str(mid) if mid is not None else f"{p.stem}:{row.id}",
                name=str(kvp.get("name", "")) or system.name,
            )
    except (MatRISInputError, FileNotFoundError):
        raise
    except Exception as e:
        raise MatRISInputError(
            f"{p}: cannot read it as an ASE sqlite database ({type(e).__name__}: {e}). Give a .db written by ase.db."
        ) from e
    tracker.check(p, n)


# ----------------------------------------------------------------------------- MPtrj

_SYMBOL_TO_Z = {element_symbol(z): z for z in range(1, 119)}


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
    (energy) or None. The whole JSON is loaded into memory (the full MPtrj needs tens of GB).
    """
    p = _check_file(path)
    return list(iter_mptrj_dict(_load_json(p), p, energy_key))


def _load_json(p: Path) -> Any:
    try:
        with open(p, "rb") as f:
            return json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MatRISInputError(f"{p}: not valid JSON ({e}); give an MPtrj-style JSON file.") from e


def looks_like_mptrj(data: Any) -> bool:
    """True when ``data`` is ``{material_id: {frame_id: {"structure": ...}}}``."""
    if not isinstance(data, dict) or not data:
        return False
    frames = next(iter(data.values()))
    if not isinstance(frames, dict) or not frames:
        return False
    frame = next(iter(frames.values()))
    return isinstance(frame, dict) and "structure" in frame


def count_mptrj(data: dict) -> int:
    return sum(len(frames) for frames in data.values())


def iter_mptrj_dict(data: Any, p: Path, energy_key: str = "corrected_total_energy") -> Iterator[Sample]:
    """The samples of an already-loaded MPtrj dict, in file order."""
    if not looks_like_mptrj(data):
        raise MatRISInputError(
            f"{p}: not in the MPtrj layout {{material_id: {{frame_id: {{'structure': ..., ...}}}}}}; "
            "convert it to extxyz or an ASE .db and read it with read_ase / read_ase_db."
        )
    per_atom = energy_key.endswith(_PER_ATOM_SUFFIX)
    found_energy = False
    k = 0
    for material_id, frames in data.items():
        for frame_id, frame in frames.items():
            who = f"{p} structure {k} ({material_id}/{frame_id})"
            if not isinstance(frame, dict) or "structure" not in frame:
                raise MatRISInputError(f"{who}: the frame has no 'structure'; every frame needs one.")
            system = _system_from_structure_dict(frame["structure"], who, str(frame_id))
            n = system.num_atoms
            energy = frame.get(energy_key)
            if energy is not None:
                found_energy = True
                energy = float(energy) * (n if per_atom else 1)
            forces, stress, magmoms = frame.get("force"), frame.get("stress"), frame.get("magmom")
            yield Sample(
                system=system,
                energy=math.nan if energy is None else energy,
                forces=None if forces is None else np.asarray(forces, dtype=np.float64),
                # VASP kBar, positive = compressive → ASE sign, GPa
                stress=None if stress is None else -KBAR_TO_GPA * _stress_3x3(stress, who),
                magmoms=None if magmoms is None else np.asarray(magmoms, dtype=np.float64),
                material_id=str(material_id),
                name=str(frame_id),
            )
            k += 1
    if k and not found_energy:
        raise MatRISInputError(
            f"{p}: energy_key={energy_key!r} is in none of the {k} frames; use e.g. 'corrected_total_energy', "
            "'uncorrected_total_energy' or 'energy_per_atom'."
        )


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
                raise MatRISInputError(f"{who}: site {s} has unknown element {symbol!r}; fix the structure.")
            numbers.append(_SYMBOL_TO_Z[symbol])
            positions.append(site["xyz"] if "xyz" in site else np.asarray(site["abc"], dtype=np.float64) @ lattice)
    except (KeyError, TypeError, IndexError) as e:
        raise MatRISInputError(
            f"{who}: the 'structure' entry is not a pymatgen Structure.as_dict() ({type(e).__name__}: {e})."
        ) from e
    return AtomicSystem(np.asarray(positions, dtype=np.float64).reshape(-1, 3), lattice, pbc, numbers, name)


# ----------------------------------------------------------------------------- dispatch


def iter_samples(path: str | os.PathLike, **options: Any) -> tuple[Iterator[Sample], int | None]:
    """``(samples, count)`` for :func:`read_samples`; count is None when unknown before reading.

    ``mptrj_energy_key`` marks ``options`` as settings for every format at once (the trainer's
    data config): an MPtrj file then uses only that key, other files only the rest.
    """
    p = _check_file(path)
    suffix = p.suffix.lower()
    mixed = "mptrj_energy_key" in options
    mptrj_key = options.pop("mptrj_energy_key", None)
    if suffix == ".json":
        data = _load_json(p)
        if looks_like_mptrj(data):
            if mixed:
                options = {"energy_key": mptrj_key}
            _only(options, {"energy_key"}, p, "MPtrj JSON")
            return iter_mptrj_dict(data, p, **options), count_mptrj(data)
        del data  # not MPtrj: let ASE try (e.g. an ASE JSON database)
    if suffix == ".db":
        return iter_ase_db(p, **options), None
    return iter_ase(p, **options), None


def _only(options: dict, allowed: set, p: Path, kind: str) -> None:
    extra = set(options) - allowed
    if extra:
        raise MatRISInputError(f"{p} is an {kind}; options {sorted(extra)} do not apply (allowed: {sorted(allowed)}).")


def read_samples(path: str | os.PathLike, **options: Any) -> list[Sample]:
    """Labelled structures from any supported file, by its type.

    ``.json`` in the MPtrj layout → :func:`read_mptrj`; ``.db`` → :func:`read_ase_db`;
    anything else → :func:`read_ase`. ``options`` are passed to that reader.
    Raises FileNotFoundError for a missing file and MatRISInputError for an unreadable one.
    """
    samples, _ = iter_samples(path, **options)
    return list(samples)
