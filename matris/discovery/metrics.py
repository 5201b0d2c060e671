"""Matbench-Discovery metrics: stability classification and regression of hull distances.

The definitions are matbench-discovery 1.3.1's (``metrics.classify_stable``,
``metrics.stable_metrics`` and the leaderboard code in ``preds.py``), with the accuracy fix of
later versions (below); a test checks equality with those functions. No matbench-discovery
import is needed at run time.

Units: hull distances and formation energies in eV/atom. A material is *stable* when its
hull distance is ≤ the threshold (0 eV/atom by default), for DFT ("actual") and model
("predicted") alike.

- TP/FN/FP/TN: actual stable & predicted stable / unstable, actual unstable & predicted
  stable / unstable. A NaN (missing) prediction counts as *predicted unstable*; a NaN DFT
  value counts in no class.
- Precision = TP/(TP+FP); Recall = TPR = TP/(TP+FN); F1 = 2·P·R/(P+R);
  prevalence = (TP+FN)/(TP+FN+FP+TN); DAF = Precision/prevalence; FPR = FP/(FP+TN);
  TNR = TN/(FP+TN); FNR = FN/(TP+FN).
- Accuracy = (TP+TN)/(TP+FN+FP+TN), as in current matbench-discovery. 1.3.1 divided by the
  number of materials whose prediction is known, which exceeds 1 when many predictions are
  missing (missing ones count as TN or FN); both agree when none is missing.
- MAE, RMSE and R² (scikit-learn's ``r2_score``) over materials with both values known.
- A ratio with a zero denominator is NaN.

Test sets (:func:`discovery_metrics`): the full test set; the unique prototypes (rows with
``unique_prototype`` true); and the ``top_k`` = 10,000 unique-prototype materials with the
lowest predicted hull distance (pandas ``nsmallest``: NaN dropped, ties kept in input order).
For both subsets DAF = Precision / the DFT stability rate of the unique prototypes, as in
1.3.1's leaderboard. As there, predictions more than ``max_error`` = 5 eV/atom from the DFT
formation energy count as missing, and every column is rounded to ``decimals`` = 3 before
the predicted hull distance ``each_true + e_form_pred − e_form_dft`` is formed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

STABILITY_THRESHOLD = 0.0  # eV/atom
TOP_K = 10_000
SUBSETS = ("full_test_set", "unique_prototypes", "most_stable_10k")
METRICS = ("F1", "DAF", "Precision", "Recall", "Accuracy", "TPR", "FPR", "TNR", "FNR", "TP", "FP", "TN", "FN",
           "MAE", "RMSE", "R2")
COUNTS = ("TP", "FP", "TN", "FN", "missing_preds", "n_materials")


def _array(values) -> np.ndarray:
    return np.asarray(values, dtype=float).reshape(-1)


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def classify_stable(each_true: Sequence[float], each_pred: Sequence[float], *,
                    stability_threshold: float = STABILITY_THRESHOLD, fillna: bool = True):
    """Boolean masks ``(TP, FN, FP, TN)`` of hull-distance predictions (eV/atom).

    ``fillna``: a NaN prediction counts as predicted unstable (else it is in no class).
    """
    true, pred = _array(each_true), _array(each_pred)
    if true.shape != pred.shape:
        raise ValueError(f"each_true has {true.size} values but each_pred has {pred.size}")
    threshold = float(stability_threshold or 0)
    with np.errstate(invalid="ignore"):
        actual_pos, actual_neg = true <= threshold, true > threshold
        model_pos, model_neg = pred <= threshold, pred > threshold
    if fillna:
        missing = np.isnan(pred)
        model_pos[missing], model_neg[missing] = False, True
    return actual_pos & model_pos, actual_pos & model_neg, actual_neg & model_pos, actual_neg & model_neg


def r2_score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Coefficient of determination as scikit-learn computes it (1.0/0.0 for a constant target)."""
    if y_true.size < 2:
        return float("nan")
    residual = float(((y_true - y_pred) ** 2).sum())
    total = float(((y_true - y_true.mean()) ** 2).sum())
    if total == 0:
        return 1.0 if residual == 0 else 0.0
    return 1 - residual / total


def stable_metrics(each_true: Sequence[float], each_pred: Sequence[float], *,
                   stability_threshold: float = STABILITY_THRESHOLD, fillna: bool = True) -> dict[str, float]:
    """Classification and regression metrics of predicted hull distances (see the module doc).

    Keys: F1, DAF, Precision, Recall, Accuracy, TPR, FPR, TNR, FNR, TP, FP, TN, FN (counts),
    MAE, RMSE (eV/atom), R2.
    """
    tp, fn, fp, tn = (int(m.sum()) for m in classify_stable(
        each_true, each_pred, stability_threshold=stability_threshold, fillna=fillna))
    n_pos, n_neg = tp + fn, tn + fp
    prevalence = _ratio(n_pos, n_pos + n_neg)
    precision = _ratio(tp, tp + fp)
    recall = _ratio(tp, n_pos)
    true, pred = _array(each_true), _array(each_pred)
    known = ~(np.isnan(true) | np.isnan(pred))
    true, pred = true[known], pred[known]
    error = true - pred
    return {
        "F1": _ratio(2 * (precision * recall), precision + recall),
        "DAF": _ratio(precision, prevalence),
        "Precision": precision,
        "Recall": recall,
        "Accuracy": _ratio(tp + tn, n_pos + n_neg),
        "TPR": recall,
        "FPR": _ratio(fp, n_neg),
        "TNR": _ratio(tn, n_neg),
        "FNR": _ratio(fn, n_pos),
        "TP": tp, "FP": fp, "TN": tn, "FN": fn,
        "MAE": float(np.abs(error).mean()) if error.size else float("nan"),
        "RMSE": float((error ** 2).mean() ** 0.5) if error.size else float("nan"),
        "R2": r2_score(true, pred),
    }


@dataclass
class DiscoveryMetrics:
    """Metrics on the three test sets and the values they were computed from.

    metrics: test set → metric → value (see :data:`SUBSETS`, :func:`stable_metrics`), plus
    ``missing_preds`` and ``n_materials`` per test set. Arrays (eV/atom, one value per material,
    in input order, after the max-error filter and rounding): each_true, each_pred, e_form_dft,
    e_form_pred; unique_prototype and in_top_k are masks; material_ids (when known) name them.
    """

    metrics: dict[str, dict[str, float]]
    each_true: np.ndarray = field(repr=False)
    each_pred: np.ndarray = field(repr=False)
    e_form_dft: np.ndarray = field(repr=False)
    e_form_pred: np.ndarray = field(repr=False)
    unique_prototype: np.ndarray = field(repr=False)
    in_top_k: np.ndarray = field(repr=False)
    settings: dict = field(default_factory=dict)
    material_ids: list | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        """JSON-ready: ``{"settings": …, test set: {metric: value}}`` (NaN → None)."""
        def clean(v):
            return None if isinstance(v, float) and v != v else v
        return {"settings": self.settings, **{s: {k: clean(v) for k, v in m.items()} for s, m in self.metrics.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def to_csv(self) -> str:
        """One row per metric, one column per test set."""
        keys = [k for k in (*METRICS, "missing_preds", "n_materials") if any(k in m for m in self.metrics.values())]
        rows = ["metric," + ",".join(self.metrics)]
        for k in keys:
            rows.append(k + "," + ",".join(_fmt(self.metrics[s].get(k), k, csv=True) for s in self.metrics))
        return "\n".join(rows) + "\n"

    def table(self) -> str:
        """The metrics as a fixed-width text table (counts as integers, the rest to 3 decimals)."""
        keys = [k for k in (*METRICS, "missing_preds", "n_materials") if any(k in m for m in self.metrics.values())]
        width = max(len(s) for s in self.metrics) + 2
        lines = [f"{'metric':14s}" + "".join(f"{s:>{width}s}" for s in self.metrics)]
        for k in keys:
            lines.append(f"{k:14s}" + "".join(f"{_fmt(self.metrics[s].get(k), k):>{width}s}" for s in self.metrics))
        return "\n".join(lines)


def _fmt(value, key: str, csv: bool = False) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "" if csv else "nan"
    if key in COUNTS:
        return str(int(value))
    return repr(float(value)) if csv else f"{value:.3f}"


def discovery_metrics(each_true: Sequence[float], e_form_dft: Sequence[float], e_form_pred: Sequence[float],
                      unique_prototype: Sequence[bool], *, each_pred: Sequence[float] | None = None,
                      stability_threshold: float = STABILITY_THRESHOLD, top_k: int = TOP_K,
                      decimals: int | None = 3, max_error: float | None = 5.0) -> DiscoveryMetrics:
    """Matbench-Discovery metrics of formation-energy predictions on the full test set, the
    unique prototypes and the ``top_k`` most stable unique prototypes (see the module doc).

    Args (eV/atom, one value per material; NaN = no prediction):
        each_true: DFT hull distances (WBM summary ``e_above_hull_mp2020_corrected_ppd_mp``).
        e_form_dft: DFT formation energies (``e_form_per_atom_mp2020_corrected``).
        e_form_pred: the model's MP2020-corrected formation energies.
        unique_prototype: whether each material is in the unique-prototype subset.
        each_pred: predicted hull distances measured some other way (e.g. on a hull of given
            entries); None: ``each_true + e_form_pred − e_form_dft`` (matbench-discovery).
        decimals: round the inputs to this many decimals first (None: no rounding).
        max_error: predictions further than this from ``e_form_dft`` count as missing (None: keep all).
    """
    true, dft, pred = _array(each_true), _array(e_form_dft), _array(e_form_pred).copy()
    uniq = np.asarray(unique_prototype, dtype=bool).reshape(-1)
    if not (true.size == dft.size == pred.size == uniq.size):
        raise ValueError("each_true, e_form_dft, e_form_pred and unique_prototype differ in length")
    given = None if each_pred is None else _array(each_pred).copy()
    if given is not None and given.size != true.size:
        raise ValueError("each_pred and each_true differ in length")
    if max_error is not None:
        if max_error < 0:
            raise ValueError("max_error must be a positive number (eV/atom)")
        with np.errstate(invalid="ignore"):
            bad = np.abs(pred - dft) > max_error
        pred[bad] = np.nan
        if given is not None:
            given[bad] = np.nan
    if decimals is not None:
        true, dft, pred = np.round(true, decimals), np.round(dft, decimals), np.round(pred, decimals)
        given = None if given is None else np.round(given, decimals)
    each = true + pred - dft if given is None else given

    metrics = {"full_test_set": stable_metrics(true, each, stability_threshold=stability_threshold)}
    metrics["unique_prototypes"] = stable_metrics(true[uniq], each[uniq], stability_threshold=stability_threshold)
    with np.errstate(invalid="ignore"):
        uniq_prevalence = float(np.mean(true[uniq] <= stability_threshold)) if uniq.any() else float("nan")
    metrics["unique_prototypes"]["DAF"] = _ratio(metrics["unique_prototypes"]["Precision"], uniq_prevalence)

    candidates = np.flatnonzero(uniq & ~np.isnan(each))
    chosen = candidates[np.argsort(each[candidates], kind="stable")[:top_k]]
    in_top = np.zeros(true.size, dtype=bool)
    in_top[chosen] = True
    top = stable_metrics(true[chosen], each[chosen], stability_threshold=stability_threshold)
    top["DAF"] = _ratio(top["Precision"], uniq_prevalence)
    metrics["most_stable_10k" if top_k == TOP_K else f"most_stable_{top_k}"] = top

    masks = {"full_test_set": np.ones(true.size, bool), "unique_prototypes": uniq}
    for name, m in metrics.items():
        mask = masks.get(name, in_top)
        m["missing_preds"] = int(np.isnan(each[mask]).sum())
        m["n_materials"] = int(mask.sum())
    settings = {"stability_threshold": stability_threshold, "top_k": top_k, "decimals": decimals,
                "max_error": max_error, "hull_distance": "each_true + e_form_pred - e_form_dft"
                if given is None else "given"}
    return DiscoveryMetrics(metrics, true, each, dft, pred, uniq, in_top, settings)


__all__ = ["classify_stable", "stable_metrics", "discovery_metrics", "DiscoveryMetrics", "r2_score",
           "STABILITY_THRESHOLD", "TOP_K", "SUBSETS", "METRICS"]
