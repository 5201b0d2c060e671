"""Matbench-Discovery's geometry-optimisation metrics: RMSD of ML-relaxed structures against the
DFT-relaxed ones, and how often the relaxation kept, lowered or raised the symmetry.

The definitions are the benchmark's, ported from janosh/matbench-discovery at commit
2c7f9fc42d018711dc2f5df573d225ea6d2d17b2 (``matbench_discovery/metrics/geo_opt.py``
``calc_geo_opt_metrics``, ``matbench_discovery/structure/symmetry.py``
``get_sym_info_from_structs``):

- RMSD of one material: pymatgen's ``StructureMatcher(stol=1.0, scale=False).get_rms_dist(ML,
  DFT)[0]``: the root-mean-square displacement between matched sites after the best lattice
  mapping and translation, divided by the free length per atom ``(V/N)^(1/3)``; a pair the
  matcher cannot map at all scores 1.0, the benchmark's penalty. A model's RMSD is the mean.
- symmetry (moyopy's ``MoyoDataset`` at ``symprec``, 1e-2 for the leaderboard, 1e-5 also
  reported, ``angle_tolerance`` None, as the benchmark): the space group number and the number
  of symmetry operations (``operations.num_operations``) of both structures; *match*: same space
  group; *decrease*/*increase*: another space group with fewer/more operations than DFT's;
  ``n_sym_ops_mae``: the mean |ops(ML) − ops(DFT)|. Fractions over the materials whose symmetry
  was found for both (the benchmark's ``valid_sym_mask``); RMSD over all.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..extras import require

UNMATCHED_RMSD = 1.0  # the benchmark's penalty for a pair StructureMatcher cannot map
SYMPRECS = (1e-2, 1e-5)  # the symmetry tolerances the leaderboard reports (symprec=1e-2 ranks)


def _structure(obj):
    """A pymatgen Structure from a Structure or ASE Atoms."""
    core = require("pymatgen.core", "discovery", "geometry metrics", package="pymatgen")
    if isinstance(obj, core.Structure):
        return obj
    from pymatgen.io.ase import AseAtomsAdaptor

    return AseAtomsAdaptor.get_structure(obj)


def structure_rmsd(pred, ref) -> float:
    """The normalised RMSD between an ML-relaxed and a DFT-relaxed structure (module docstring)."""
    from pymatgen.analysis.structure_matcher import StructureMatcher

    found = StructureMatcher(stol=1.0, scale=False).get_rms_dist(_structure(pred), _structure(ref))
    return UNMATCHED_RMSD if found is None else float(found[0])


def symmetry(obj, symprec: float = 1e-2) -> tuple[int | None, int | None]:
    """(space group number, number of symmetry operations) of a structure, by moyopy as the
    benchmark's ``get_sym_info_from_structs``; (None, None) where moyopy finds none."""
    moyopy = require("moyopy", "discovery", "symmetry analysis")
    from moyopy.interface import MoyoAdapter

    try:
        data = moyopy.MoyoDataset(MoyoAdapter.from_py_obj(_structure(obj)), symprec=symprec, angle_tolerance=None)
    except Exception:  # noqa: BLE001  moyopy raises where it finds no symmetry at this tolerance
        return None, None
    return int(data.number), int(data.operations.num_operations)


def geo_opt_metrics(preds: Mapping[str, object], refs: Mapping[str, object], symprec: float = 1e-2) -> dict:
    """RMSD and symmetry metrics of ML-relaxed structures ``preds`` against DFT-relaxed ``refs``
    (material id → pymatgen Structure or ASE Atoms), over the ids in both; per material too."""
    ids = [k for k in refs if k in preds]
    rows = {}
    for key in ids:
        spg_p, ops_p = symmetry(preds[key], symprec)
        spg_r, ops_r = symmetry(refs[key], symprec)
        rows[key] = {"rmsd": structure_rmsd(preds[key], refs[key]), "spg_pred": spg_p, "spg_dft": spg_r,
                     "n_sym_ops_diff": None if ops_p is None or ops_r is None else ops_p - ops_r}
    valid = [r for r in rows.values() if r["spg_pred"] is not None and r["spg_dft"] is not None]
    n = len(valid)
    if not rows:
        return {"RMSD": float("nan"), "n_sym_ops_mae": float("nan"), "symmetry_match": float("nan"),
                "symmetry_decrease": float("nan"), "symmetry_increase": float("nan"), "n_structures": 0,
                "symprec": symprec, "per_material": {}}
    rmsd = float(np.mean([r["rmsd"] for r in rows.values()]))
    if not n:
        return {"RMSD": rmsd, "n_sym_ops_mae": float("nan"), "symmetry_match": float("nan"),
                "symmetry_decrease": float("nan"), "symmetry_increase": float("nan"), "n_structures": 0,
                "symprec": symprec, "per_material": rows}
    changed = np.array([r["spg_pred"] != r["spg_dft"] for r in valid])
    diff = np.array([r["n_sym_ops_diff"] for r in valid])
    return {"RMSD": rmsd,
            "n_sym_ops_mae": float(np.abs(diff).mean()),
            "symmetry_match": float((~changed).sum() / n),
            "symmetry_decrease": float((changed & (diff < 0)).sum() / n),
            "symmetry_increase": float((changed & (diff > 0)).sum() / n),
            "n_structures": n, "symprec": symprec, "per_material": rows}
