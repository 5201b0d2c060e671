"""Matbench-Discovery's thermal-conductivity metrics (κ_SRME, SRE, SRD) and its combined score.

The definitions are the benchmark's, ported (not imported: its PyPI release 1.3.1 predates the
phonon module) from janosh/matbench-discovery at commit 023dca9a:
``matbench_discovery/metrics/phonons.py`` (SRD, SRE, SRME),
``matbench_discovery/phonons/thermal_conductivity.py`` (the mode-resolved total κ),
``matbench_discovery/phonons/__init__.py`` (imaginary modes) and the leaderboard's
``site/src/lib/combined_perf_score.ts`` (the combined performance score). They follow
Póta, Ahlawat, Csányi and Simoncelli, arXiv:2408.00755 (the k_SRME benchmark).

Units: κ in W/(m·K). Arrays as phono3py writes them (Voigt order xx, yy, zz, yz, xz, xy):

- ``kappa``: ``[T, 6]`` (or ``[6]``) total conductivity per temperature;
- ``mode_kappa``: ``[T, q, b, 6]`` per irreducible q-point and band, weighted by the q-point's
  multiplicity, so that ``mode_kappa.sum((1, 2)) / weights.sum() == kappa``;
- ``weights``: ``[q]``, the multiplicities of the irreducible q-points.

Definitions (per material, at the first temperature, 300 K in the benchmark):

- κ̄ = (κ_xx + κ_yy + κ_zz) / 3, the directional average (:func:`kappa_average`);
- SRD = 2 (κ̄_ML − κ̄_DFT) / (κ̄_ML + κ̄_DFT); a missing (NaN) prediction counts as κ = 0, SRD = −2;
  SRE = |SRD|;
- SRME = 2 Σ_{q,b} |κ̄_ML(q,b) − κ̄_DFT(q,b)| / Σ_q w_q / (κ̄_ML + κ̄_DFT), 2 (the worst) for a
  material with imaginary modes, whose symmetry the relaxation broke (final space group ≠
  initial), or with any NaN in the prediction;
- κ_SRME and κ_SRE of a model: the means over the materials;
- the combined performance score: Σ w_i s_i / Σ w_i with F1 (w = 0.5), 1 − κ_SRME/2 (w = 0.4,
  clamped at 0) and 1 − RMSD/0.15 Å (w = 0.1, clamped to [0, 1]); missing metrics with non-zero
  weight make it undefined (None).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# a Γ-point acoustic frequency above this (THz) is numerical noise, not an imaginary mode
IMAGINARY_THRESHOLD = -0.01
# the combined performance score's default weights and its RMSD baseline (Å): an RMSD at or
# above it scores 0
CPS_WEIGHTS = {"F1": 0.5, "kappa_SRME": 0.4, "RMSD": 0.1}
RMSD_BASELINE = 0.15


def kappa_average(kappa) -> np.ndarray:
    """``[..., 6]`` (Voigt) → ``[...]``: the mean of the diagonal components xx, yy, zz. Any NaN
    makes the whole result NaN (``[nan]``), as the benchmark has it."""
    kappa = np.asarray(kappa, dtype=float)
    if np.isnan(kappa).any():
        return np.array([np.nan])
    return kappa[..., :3].mean(axis=-1)


def mode_kappa_total(mode_kappa_p: np.ndarray, mode_kappa_c: np.ndarray, heat_capacity: np.ndarray) -> np.ndarray:
    """Each mode's total (particle-like plus wave-like) conductivity ``[T, q, b, 6]``: the
    coherence term ``κ_C[b, b']`` ``[T, q, b, b, 6]`` is split between the two modes in proportion
    to their heat capacities ``C`` ``[T, q, b]``, ``κ(b) = κ_P(b) + Σ_b' 2 C_b / (C_b + C_b') κ_C(b, b')``
    (a pair of zero heat capacities gives 0)."""
    c = np.asarray(heat_capacity, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = 2 * c[:, :, :, None, None] / (c[:, :, :, None, None] + c[:, :, None, :, None])
        coherent = (share * np.asarray(mode_kappa_c, dtype=float)).sum(axis=3)
    return np.asarray(mode_kappa_p, dtype=float) + np.nan_to_num(coherent, nan=0.0, posinf=0.0, neginf=0.0)


def has_imaginary_modes(frequencies, threshold: float = IMAGINARY_THRESHOLD) -> bool:
    """Whether phonon ``frequencies`` ``[q, b]`` (THz, the Γ point first, bands in ascending
    order) have imaginary modes: any negative frequency, except the three acoustic modes at Γ,
    which may be down to ``threshold``; all NaN (nothing computed) counts as imaginary."""
    f = np.asarray(frequencies, dtype=float)
    if np.isnan(f).all():
        return True
    return bool((f[0, 3:] < 0).any() or (f[0, :3] < threshold).any() or (f[1:] < 0).any())


def srd(kappa_pred, kappa_true) -> float:
    """The symmetric relative difference of the average conductivities at the first temperature
    (−2 where the prediction is missing)."""
    p, t = np.atleast_1d(kappa_average(kappa_pred))[0], np.atleast_1d(kappa_average(kappa_true))[0]
    value = 2 * (p - t) / (p + t)
    return -2.0 if np.isnan(value) else float(value)


@dataclass
class KappaRecord:
    """One material's conductivity, as the κ task records it (prediction or DFT reference).

    kappa: ``[T, 6]`` total κ (RTA, particle + coherence); mode_kappa: ``[T, q, b, 6]`` its mode
    resolution (:func:`mode_kappa_total`); weights: ``[q]``; has_imaginary: imaginary modes
    (:func:`has_imaginary_modes`); spg_initial, spg_final: space group numbers before and after
    the relaxation (None where not relaxed: the reference)."""

    kappa: np.ndarray
    mode_kappa: np.ndarray | None = None
    weights: np.ndarray | None = None
    has_imaginary: bool = False
    spg_initial: int | None = None
    spg_final: int | None = None


def srme(pred: KappaRecord, true: KappaRecord, true_spg: int | None = None) -> float:
    """The symmetric relative mean error of one material (first temperature): see the module
    docstring. ``true_spg``: the reference's space group, compared with the final one where the
    prediction does not record its initial space group."""
    if np.isnan(np.asarray(true.kappa, dtype=float)).any():
        raise ValueError("the DFT reference has NaN conductivities: it cannot be scored against")
    if pred.has_imaginary:
        return 2.0
    if pred.spg_final is not None:
        initial = pred.spg_initial if pred.spg_initial is not None else true_spg
        if initial is not None and pred.spg_final != initial:
            return 2.0
    if (pred.mode_kappa is None or pred.weights is None or np.isnan(np.asarray(pred.kappa, dtype=float)).any()
            or np.isnan(np.asarray(pred.mode_kappa, dtype=float)).any()
            or np.isnan(np.asarray(pred.weights, dtype=float)).any()):
        return 2.0
    m_pred, m_true = kappa_average(pred.mode_kappa), kappa_average(true.mode_kappa)
    if m_pred.shape != m_true.shape:
        raise ValueError(f"mode-resolved κ of shapes {m_pred.shape} and {m_true.shape}: the prediction must use "
                         "the reference's q-point mesh")
    per_t = np.abs(m_pred - m_true).reshape(m_pred.shape[0], -1).sum(axis=1) / np.asarray(pred.weights).sum()
    denominator = kappa_average(pred.kappa) + kappa_average(true.kappa)
    return float((2 * per_t / denominator)[0])


def kappa_metrics(preds: dict[str, KappaRecord], trues: dict[str, KappaRecord],
                  true_spg: dict[str, int] | None = None) -> dict:
    """κ_SRME, κ_SRE and the mean SRD over the reference's materials, with each material's values.
    A material of the reference without a prediction (failed, not run) scores SRME = 2 and
    SRD = −2, as a failed calculation does."""
    rows = {}
    for key, true in trues.items():
        pred = preds.get(key)
        if pred is None:
            rows[key] = {"SRD": -2.0, "SRE": 2.0, "SRME": 2.0}
            continue
        d = srd(pred.kappa, true.kappa)
        rows[key] = {"SRD": d, "SRE": abs(d), "SRME": srme(pred, true, (true_spg or {}).get(key))}
    mean = (lambda k: float(np.mean([r[k] for r in rows.values()]))) if rows else (lambda k: float("nan"))
    return {"kappa_SRME": mean("SRME"), "kappa_SRE": mean("SRE"), "kappa_SRD": mean("SRD"),
            "materials": len(rows), "per_material": rows}


def combined_score(f1: float | None, kappa_srme: float | None, rmsd: float | None,
                   weights: dict[str, float] | None = None) -> float | None:
    """The leaderboard's combined performance score (see the module docstring); None where a
    metric of non-zero weight is missing."""
    w = dict(CPS_WEIGHTS, **(weights or {}))
    values = {"F1": f1, "kappa_SRME": kappa_srme, "RMSD": rmsd}
    if any(w[k] > 0 and (v is None or np.isnan(v)) for k, v in values.items()):
        return None
    total = sum(w.values())
    if total == 0:
        return 0.0
    scores = {"F1": f1, "kappa_SRME": max(0.0, 1 - kappa_srme / 2) if kappa_srme is not None else 0.0,
              "RMSD": min(1.0, max(0.0, (RMSD_BASELINE - rmsd) / RMSD_BASELINE)) if rmsd is not None else 0.0}
    return float(sum(scores[k] * w[k] for k in values if w[k] > 0) / total)
