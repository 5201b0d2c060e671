"""The model's predictions for the WBM test set, in the layout of Matbench-Discovery submissions.

From the merged relaxation results: MP2020-corrected energies, formation energies and, with a
hull of given entries, hull distances (see :mod:`matris.discovery.energy`). Written as

- ``wbm-IS2RE-FIRE.csv.gz``: ``material_id``, ``formula``, ``e_form_per_atom_KEY`` (eV/atom, the
  column a submission's ``pred_col`` names), ``KEY_energy`` (model total energy, eV),
  ``KEY_energy_corrected`` (eV, after MP2020), ``e_above_hull_KEY`` (eV/atom, only when measured
  on a given hull), and the relaxation's ``converged``/``fmax``/``steps``;
- ``wbm-IS2RE-FIRE.jsonl.gz``: one line per material with ``material_id``, ``KEY_structure``
  (the relaxed pymatgen Structure as a dict, the geometry-optimisation ``struct_col``) and
  ``KEY_energy``.

Prefix the date (``YYYY-MM-DD-``) when submitting them to matbench-discovery.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..atomic import atomic_path
from ..errors import MatRISInputError
from ..extras import require
from .energy import HullReference, formation_energy_per_atom, mp2020_corrected_energies
from .readers import ID
from .store import MergedResults

CSV_NAME = "wbm-IS2RE-FIRE.csv.gz"
STRUCTURES_NAME = "wbm-IS2RE-FIRE.jsonl.gz"


def model_key(name: str) -> str:
    """A column-name-safe model key: lower case, ``[a-z0-9_]``."""
    key = re.sub(r"[^a-z0-9]+", "_", str(name).lower()).strip("_")
    if not key:
        raise MatRISInputError(f"model key {name!r} has no letters or digits; give e.g. --model-key matris")
    return key


@dataclass
class Predictions:
    """Per-material predictions.

    frame: pandas DataFrame indexed by material id (columns as in the module doc).
    structures: material id → relaxed pymatgen Structure. key: the model key of the columns.
    rejected: ids whose entry the MP2020 scheme rejected (their predictions are NaN).
    """

    frame: Any
    structures: dict
    key: str
    rejected: list

    @property
    def e_form_column(self) -> str:
        return f"e_form_per_atom_{self.key}"

    @property
    def each_column(self) -> str:
        return f"e_above_hull_{self.key}"

    def write(self, out_dir: str | os.PathLike) -> tuple[Path, Path]:
        """Write the submission files (atomically); returns (CSV path, structures path)."""
        out_dir = Path(out_dir)
        csv_path = out_dir / CSV_NAME
        with atomic_path(csv_path, suffix=".gz") as tmp:
            self.frame.to_csv(tmp, index=False, compression="gzip", float_format="%.6g")
        structures_path = out_dir / STRUCTURES_NAME
        energy = self.frame[f"{self.key}_energy"]
        with atomic_path(structures_path, suffix=".gz") as tmp:
            with gzip.open(tmp, "wt", encoding="utf-8") as fh:
                for mid, structure in self.structures.items():
                    value = energy.get(mid)
                    fh.write(json.dumps({ID: mid, f"{self.key}_structure": structure.as_dict(),
                                         f"{self.key}_energy": None if value is None or value != value else
                                         float(value)}) + "\n")
        return csv_path, structures_path


def predict(results: MergedResults, *, key: str = "matris", entries: Mapping[str, Any] | None = None,
            references: Mapping[str, float] | None = None, hull: HullReference | None = None,
            progress: bool = False) -> Predictions:
    """Formation energies (and hull distances with ``hull``) of the relaxed structures.

    Args:
        results: merged relaxation results (:func:`matris.discovery.merge_results`).
        entries: material id → WBM DFT ComputedStructureEntry, for the MP2020 corrections
            (None: no corrections, raw model energies; only for models not fitted to
            MP2020-compatible data, or for tests).
        references: element → reference energy, eV/atom (MP elemental references), for the
            formation energies; not needed with ``hull`` (its elemental entries are used).
        hull: measure formation energies and hull distances on this hull instead.
    """
    require("pandas", "discovery", "the discovery predictions table")
    import pandas as pd

    if hull is None and references is None:
        raise MatRISInputError("formation energies need elemental reference energies (--elemental-refs) or a hull "
                               "(--hull-entries)")
    key = model_key(key)
    ok = [r for r in results if r.ok]
    structures = {r.material_id: r.structure() for r in ok}
    raw = {r.material_id: float(r.energy) for r in ok}
    if entries is not None:
        corrected = mp2020_corrected_energies(entries, {m: (raw[m], structures[m]) for m in raw}, progress=progress)
    else:
        corrected = dict(raw)
    rejected = [m for m, e in corrected.items() if not math.isfinite(e)]
    rows = []
    for record in results:
        mid = record.material_id
        structure = structures.get(mid)
        comp = structure.composition if structure is not None else None
        energy = corrected.get(mid, float("nan"))
        formula = comp.formula.replace(" ", "") if comp is not None else record.atoms().get_chemical_formula()
        row = {ID: mid, "formula": formula,
               f"e_form_per_atom_{key}": float("nan"), f"{key}_energy": raw.get(mid, float("nan")),
               f"{key}_energy_corrected": energy}
        if comp is not None:
            if hull is not None:
                row[f"e_form_per_atom_{key}"] = hull.formation_energy(comp, energy)
                row[f"e_above_hull_{key}"] = hull.e_above_hull(comp, energy)
            else:
                row[f"e_form_per_atom_{key}"] = formation_energy_per_atom(energy, comp, references)
        elif hull is not None:
            row[f"e_above_hull_{key}"] = float("nan")
        row.update(converged=record.converged, fmax=record.fmax, steps=record.steps)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(rows[0]) if rows else [ID])
    frame.index = pd.Index(frame[ID].tolist())
    return Predictions(frame=frame, structures=structures, key=key, rejected=rejected)


__all__ = ["Predictions", "predict", "model_key", "CSV_NAME", "STRUCTURES_NAME"]
