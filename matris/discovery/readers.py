"""Reading the Matbench-Discovery data files: WBM structures, the WBM summary table, WBM
computed structure entries and MP elemental reference energies.

Formats read (compression ``.gz``/``.bz2``/``.xz`` from the name):

- structures: ``*.extxyz.zip`` (one extxyz per material, as matbench-discovery publishes the
  WBM initial atoms), ``*.jsonl`` (one record per line) or ``*.json`` (a pandas-style table or
  a list of records) with a ``material_id`` and a pymatgen Structure (``initial_structure``,
  ``structure``, or a ``computed_structure_entry``'s), or any file ASE reads (ids from
  ``info["material_id"]``, else ``info["name"]``);
- the summary: CSV with ``material_id``, ``e_form_per_atom_mp2020_corrected``,
  ``e_above_hull_mp2020_corrected_ppd_mp`` and ``unique_prototype``;
- entries: JSON/JSONL of ``material_id`` → pymatgen ``ComputedStructureEntry`` dict;
- elemental references: ``{element: ComputedEntry dict}`` (the published MP file) or
  ``{element: eV/atom}``.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..errors import MatRISInputError
from ..extras import require

ID = "material_id"
E_FORM_DFT = "e_form_per_atom_mp2020_corrected"
EACH_TRUE = "e_above_hull_mp2020_corrected_ppd_mp"
UNIQUE_PROTOTYPE = "unique_prototype"
SUMMARY_COLUMNS = (ID, E_FORM_DFT, EACH_TRUE, UNIQUE_PROTOTYPE)
STRUCTURE_KEYS = ("initial_structure", "structure", "init_structure")
ENTRY_KEYS = ("computed_structure_entry", "entry", "cse")


def open_text(path: str | os.PathLike):
    """``path`` opened for reading text, decompressed by its suffix (.gz, .bz2, .xz)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix.lower(), open)
    return opener(path, "rt", encoding="utf-8")


def _stem(path: Path) -> str:
    """The name without compression suffixes: ``a.jsonl.gz`` → ``a.jsonl``."""
    name = path.name.lower()
    for suffix in (".gz", ".bz2", ".xz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def iter_records(path: str | os.PathLike) -> Iterator[dict]:
    """Rows of a JSON-lines file, a JSON list of records, or a pandas-style JSON table
    (``{column: {row: value}}``, as ``DataFrame.to_json()`` writes it)."""
    path = Path(path)
    with open_text(path) as fh:
        if _stem(path).endswith(".jsonl"):
            for number, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as exc:
                        raise MatRISInputError(
                            f"{path}, line {number}: not JSON ({exc}); download the file again") from None
            return
        try:
            data = json.load(fh)
        except ValueError as exc:
            raise MatRISInputError(f"{path} is not valid JSON ({exc}); download the file again") from None
    if isinstance(data, list):
        yield from data
    elif isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()) and ID in data:
        columns = list(data)
        for row in data[ID]:
            yield {c: data[c].get(row) for c in columns}
    elif isinstance(data, dict):  # {material_id: value}
        for key, value in data.items():
            yield {ID: key, "value": value}
    else:
        raise MatRISInputError(f"{path}: expected a list of records or a table with a {ID!r} column")


# ------------------------------------------------------------------------------------- structures
@dataclass
class StructureSource:
    """The structures of one file, indexed cheaply and loaded on demand.

    material_ids / natoms: of every structure, in file order. ``load(positions)`` returns
    ASE Atoms (``info["material_id"]`` set) for the given positions only, so a shard parses
    just its own structures where the format allows it (extxyz zips).
    """

    path: Path
    material_ids: list[str]
    natoms: list[int]
    _load: Callable[[Sequence[int]], list]

    def __len__(self) -> int:
        return len(self.material_ids)

    def load(self, positions: Sequence[int]) -> list:
        atoms = self._load(positions)
        for k, a in zip(positions, atoms):
            a.info[ID] = self.material_ids[k]
            a.info.setdefault("name", self.material_ids[k])
        return atoms


def read_structures(path: str | os.PathLike, limit: int | None = None) -> StructureSource:
    """Index the structures in ``path`` (the first ``limit`` only, if given)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no structures file {path}")
    if limit is not None and limit < 1:
        raise MatRISInputError(f"--limit must be a positive number of structures, got {limit}")
    stem = _stem(path)
    if stem.endswith(".zip"):
        source = _zip_source(path, limit)
    elif stem.endswith((".json", ".jsonl")):
        source = _json_source(path, limit)
    else:
        source = _ase_source(path, limit)
    if not source.material_ids:
        raise MatRISInputError(f"{path} holds no structures")
    seen: set[str] = set()
    dupes = [m for m in source.material_ids if m in seen or seen.add(m)]
    if dupes:
        raise MatRISInputError(f"{path}: material ids must be unique, but {dupes[:3]} occur more than once; "
                               f"give every structure its own info['{ID}']")
    return source


def _zip_source(path: Path, limit: int | None) -> StructureSource:
    from ase.io.extxyz import key_val_str_to_dict

    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if n.lower().endswith((".extxyz", ".xyz"))][:limit]
        ids, natoms = [], []
        for name in names:
            with zf.open(name) as fh:
                head = io.TextIOWrapper(fh, encoding="utf-8")
                count, comment = head.readline(), head.readline()
            try:
                natoms.append(int(count.strip()))
            except ValueError:
                raise MatRISInputError(f"{path}: member {name} is not extxyz (first line {count.strip()!r})") from None
            info = key_val_str_to_dict(comment) if comment.strip() else {}
            ids.append(str(info.get(ID) or Path(name).stem))

    def load(positions):
        from ase.io import read

        out = []
        with zipfile.ZipFile(path) as zf:
            for k in positions:
                text = zf.read(names[k]).decode("utf-8")
                out.append(read(io.StringIO(text), format="extxyz", index=0))
        return out

    return StructureSource(path, ids, natoms, load)


def _structure_dict(record: dict) -> dict | None:
    for key in STRUCTURE_KEYS:
        if isinstance(record.get(key), dict):
            return record[key]
    for key in ENTRY_KEYS:
        if isinstance(record.get(key), dict) and isinstance(record[key].get("structure"), dict):
            return record[key]["structure"]
    return None


def _json_source(path: Path, limit: int | None) -> StructureSource:
    ids, structures = [], []
    for record in iter_records(path):
        structure = _structure_dict(record)
        if structure is None or ID not in record:
            raise MatRISInputError(
                f"{path}: a record has no {ID!r} with a pymatgen structure under {'/'.join(STRUCTURE_KEYS)} "
                f"(keys: {sorted(record)[:8]}); give a WBM initial-structures file or an extxyz file"
            )
        ids.append(str(record[ID]))
        structures.append(structure)
        if limit is not None and len(ids) >= limit:
            break

    def load(positions):
        require("pymatgen", "discovery", "reading WBM structures")
        from pymatgen.core import Structure
        from pymatgen.io.ase import AseAtomsAdaptor

        return [AseAtomsAdaptor.get_atoms(Structure.from_dict(structures[k])) for k in positions]

    return StructureSource(path, ids, [len(s["sites"]) for s in structures], load)


def _ase_source(path: Path, limit: int | None) -> StructureSource:
    from ..structure_files import read_frames

    frames = read_frames(path, ":" if limit is None else f":{limit}")
    ids = [str(a.info.get(ID) or a.info.get("name") or f"structure-{k}") for k, a in enumerate(frames)]
    for a in frames:
        a.calc = None
    return StructureSource(path, ids, [len(a) for a in frames], lambda positions: [frames[k].copy() for k in positions])


# --------------------------------------------------------------------------------------- tables
def read_summary(path: str | os.PathLike):
    """The WBM summary as a pandas DataFrame indexed by material id, with the columns the
    metrics need checked (``unique_prototype`` as bool)."""
    require("pandas", "discovery", "reading the WBM summary")
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no summary file {path}")
    frame = pd.read_csv(path)
    missing = [c for c in SUMMARY_COLUMNS if c not in frame.columns]
    if missing:
        columns = "column" if len(missing) == 1 else "columns"
        raise MatRISInputError(f"{path} lacks the {columns} {', '.join(missing)}; give the WBM summary CSV of "
                               "matbench-discovery (or a CSV with the columns " + ", ".join(SUMMARY_COLUMNS) + ")")
    frame[ID] = frame[ID].astype(str)
    if frame[ID].duplicated().any():
        raise MatRISInputError(f"{path}: material ids repeat ({frame[ID][frame[ID].duplicated()].tolist()[:3]})")
    frame[UNIQUE_PROTOTYPE] = frame[UNIQUE_PROTOTYPE].map(_as_bool)
    frame.index = pd.Index(frame[ID].tolist())
    return frame


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value) if value == value else False  # NaN → False


def read_entries(path: str | os.PathLike, material_ids: set[str] | None = None) -> dict[str, dict]:
    """``material_id`` → ComputedStructureEntry dict (only ``material_ids`` if given)."""
    entries = {}
    for record in iter_records(path):
        mid = str(record.get(ID, ""))
        if material_ids is not None and mid not in material_ids:
            continue
        entry = next((record[k] for k in (*ENTRY_KEYS, "value") if isinstance(record.get(k), dict)), None)
        if entry is None:
            raise MatRISInputError(f"{path}: the record of {mid!r} holds no computed structure entry "
                                   f"(keys: {sorted(record)[:8]}); give the WBM computed-structure-entries file")
        entries[mid] = entry
    return entries


def read_elemental_refs(path: str | os.PathLike) -> dict[str, float]:
    """Element → reference energy, eV/atom.

    From the published MP elemental reference entries (``{element: ComputedEntry dict}``) this
    is ``round(entry.energy_per_atom, 4)``, matbench-discovery's ``mp_elemental_ref_energies``;
    plain numbers are taken as they are.
    """
    with open_text(path) as fh:
        try:
            data = json.load(fh)
        except ValueError as exc:
            raise MatRISInputError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise MatRISInputError(f"{path}: expected {{element: entry or eV/atom}}")
    refs = {}
    for element, value in data.items():
        if isinstance(value, (int, float)):
            refs[str(element)] = float(value)
        elif isinstance(value, dict):
            require("pymatgen", "discovery", "reading elemental reference entries")
            from pymatgen.entries.computed_entries import ComputedEntry

            refs[str(element)] = round(ComputedEntry.from_dict(value).energy_per_atom, 4)
        else:
            raise MatRISInputError(f"{path}: the reference of {element!r} is neither an entry nor a number")
    return refs


def read_hull_entries(path: str | os.PathLike) -> list:
    """Entries of a convex hull: a JSON list (or ``{id: entry}``) of pymatgen entry dicts
    (ComputedEntry, ComputedStructureEntry, PDEntry) whose energies are already corrected."""
    require("pymatgen", "discovery", "reading hull entries")
    from monty.json import MontyDecoder

    entries = []
    for record in iter_records(path):
        data = record.get("value", record) if set(record) <= {ID, "value"} else record
        entry = MontyDecoder().process_decoded(data)
        if not hasattr(entry, "composition") or not hasattr(entry, "energy"):
            raise MatRISInputError(f"{path}: {str(data)[:80]}… is not a pymatgen entry (needs @module/@class)")
        entries.append(entry)
    return entries


__all__ = ["StructureSource", "read_structures", "read_summary", "read_entries", "read_elemental_refs",
           "read_hull_entries", "iter_records", "open_text", "ID", "E_FORM_DFT", "EACH_TRUE", "UNIQUE_PROTOTYPE"]
