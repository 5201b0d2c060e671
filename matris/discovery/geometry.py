"""Matbench-Discovery's geometry-optimisation metrics: RMSD of ML-relaxed structures against the
DFT-relaxed ones, and how often the relaxation kept, lowered or raised the symmetry.

The definitions are the benchmark's, ported from janosh/matbench-discovery
(``matbench_discovery/metrics/geo_opt.py`` at 084e8fdf, ``matbench_discovery/structure/symmetry.py``):

- RMSD of one material: pymatgen's ``StructureMatcher(stol=1.0, scale=False).get_rms_dist(ML,
  DFT)[0]``: the root-mean-square displacement between matched sites after the best lattice
  mapping and translation, divided by the free length per atom ``(V/N)^(1/3)``; a pair the
  matcher cannot map at all scores 1.0, the benchmark's penalty. A model's RMSD is the mean.
- symmetry (spglib at ``symprec``, 1e-2 for the leaderboard; 1e-5 also reported): the space
  group number and the number of symmetry operations of both structures; *match*: same space
  group; *decrease*/*increase*: another space group with fewer/more operations than DFT's;
  ``n_sym_ops_mae``: the mean |ops(ML) − ops(DFT)|. Fractions over the materials compared.
"""

from __future__ import annotations

import warnings
from typing import Mapping

import numpy as np

from ..extras import require

UNMATCHED_RMSD = 1.0  # the benchmark's penalty for a pair StructureMatcher cannot map


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


def symmetry_dataset(cell: tuple, symprec: float):
    """spglib's symmetry dataset of ``(lattice, fractional coordinates, numbers)``, or None where
    spglib finds none (without spglib's deprecation warning about its error handling)."""
    spglib = require("spglib", "discovery", "symmetry analysis")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return spglib.get_symmetry_dataset(cell, symprec=symprec)
        except Exception:  # noqa: BLE001  spglib.error.SpglibError (newer error handling): no symmetry found
            return None


def symmetry(obj, symprec: float = 1e-2) -> tuple[int, int]:
    """(space group number, number of symmetry operations) of a structure (spglib); P1 with one
    operation where spglib finds none."""
    s = _structure(obj)
    data = symmetry_dataset((s.lattice.matrix, s.frac_coords, s.atomic_numbers), symprec)
    if data is None:
        return 1, 1
    return int(data.number), int(len(data.rotations))


def geo_opt_metrics(preds: Mapping[str, object], refs: Mapping[str, object], symprec: float = 1e-2) -> dict:
    """RMSD and symmetry metrics of ML-relaxed structures ``preds`` against DFT-relaxed ``refs``
    (material id → pymatgen Structure or ASE Atoms), over the ids in both; per material too."""
    ids = [k for k in refs if k in preds]
    rows = {}
    for key in ids:
        spg_p, ops_p = symmetry(preds[key], symprec)
        spg_r, ops_r = symmetry(refs[key], symprec)
        rows[key] = {"rmsd": structure_rmsd(preds[key], refs[key]), "spg_pred": spg_p, "spg_dft": spg_r,
                     "n_sym_ops_diff": ops_p - ops_r}
    n = len(rows)
    if not n:
        return {"RMSD": float("nan"), "n_sym_ops_mae": float("nan"), "symmetry_match": float("nan"),
                "symmetry_decrease": float("nan"), "symmetry_increase": float("nan"), "n_structures": 0,
                "symprec": symprec, "per_material": {}}
    changed = np.array([r["spg_pred"] != r["spg_dft"] for r in rows.values()])
    diff = np.array([r["n_sym_ops_diff"] for r in rows.values()])
    return {"RMSD": float(np.mean([r["rmsd"] for r in rows.values()])),
            "n_sym_ops_mae": float(np.abs(diff).mean()),
            "symmetry_match": float((~changed).sum() / n),
            "symmetry_decrease": float((changed & (diff < 0)).sum() / n),
            "symmetry_increase": float((changed & (diff > 0)).sum() / n),
            "n_structures": n, "symprec": symprec, "per_material": rows}
