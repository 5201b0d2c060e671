"""Matbench-Discovery's thermal-conductivity metrics (κ_SRME, SRE, SRD) and its combined score.

The definitions are the benchmark's, ported (not imported: its PyPI release 1.3.1 predates the
phonon module) from janosh/matbench-discovery at commit 2c7f9fc42d018711dc2f5df573d225ea6d2d17b2
(after its #376, July 2026): ``matbench_discovery/metrics/phonons.py`` (SRD, SRE, SRME and their
edge cases), ``matbench_discovery/phonons/thermal_conductivity.py`` (``calc_mode_kappa_tot``, the
mode-resolved total κ), ``matbench_discovery/phonons/__init__.py`` (``check_imaginary_freqs``)
and the leaderboard's ``site/src/lib/combined-scores.svelte.ts`` (``calculate_cps``). They
follow Póta, Ahlawat, Csányi and Simoncelli, arXiv:2408.00755 (the k_SRME benchmark).

Units: κ in W/(m·K). Arrays as phono3py writes them (Voigt order xx, yy, zz, yz, xz, xy):

- ``kappa``: ``[T, 6]`` (or ``[6]``) total conductivity per temperature;
- ``mode_kappa``: ``[T, q, b, 6]`` (or its diagonal ``[T, q, b, 3]``) per irreducible q-point and
  band, weighted by the q-point's multiplicity, so that ``mode_kappa.sum((1, 2)) / weights.sum()
  == kappa``;
- ``weights``: ``[q]``, the multiplicities of the irreducible q-points.

Definitions (per material; the benchmark has one temperature, 300 K):

- κ̄ = (κ_xx + κ_yy + κ_zz) / 3, the mean of the diagonal (:func:`kappa_average`; a NaN in an
  off-diagonal component does not matter);
- SRD = 2 (κ̄_ML − κ̄_DFT) / (κ̄_ML + κ̄_DFT); 0 where both are 0; −2 where the prediction is
  missing, NaN, infinite, negative or not one value; SRE = |SRD|;
- SRME = 2 Σ_{q,b} |κ̄_ML(q,b) − κ̄_DFT(q,b)| / Σ_q w_q / (κ̄_ML + κ̄_DFT); 0/0 (both κ̄ 0, no
  mode error) gives 0, x/0 gives 2; and 2 (``KAPPA_ERROR_MAX``, "censored") for a material with
  imaginary modes, whose relaxation changed the space group, whose mode κ is missing or not
  finite, whose κ̄ is not finite and non-negative, whose weights are not finite and
  non-negative or sum to 0, whose mode κ has another shape than the reference's (another
  q-mesh), or whose SRME falls outside [0, 2];
- a reference κ̄ or mode κ that is not finite (and non-negative) is an error (ValueError);
- κ_SRME, κ_SRE, κ_SRD of a model: the means over the materials;
- the combined performance score (:func:`combined_score`): Σ w_i s_i / Σ w_i with F1 (w = 0.5),
  1 − κ_SRME/2 (w = 0.4) and clamp(1 − RMSD/0.15 Å, 0, 1) (w = 0.1); None where a metric of
  non-zero weight is missing or invalid (F1 outside [0, 1], κ_SRME outside [0, 2], RMSD
  negative or infinite) or all weights are 0.
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
# the worst SRME and |SRD| (metrics/phonons.py KAPPA_ERROR_MAX)
KAPPA_ERROR_MAX = 2.0


def kappa_average(kappa) -> np.ndarray:
    """``[..., 6]`` (Voigt) or ``[..., 3]`` (the diagonal) → ``[...]``: the mean of the diagonal
    components xx, yy, zz (the benchmark's ``calculate_kappa_avg``: NaN in the off-diagonal
    components does not matter); ``[nan]`` for what is not such an array."""
    try:
        k = np.asarray(kappa, dtype=float)
    except (TypeError, ValueError):
        return np.array([np.nan])
    if k.ndim == 0 or k.shape[-1] not in (3, 6):
        return np.array([np.nan])
    return k[..., :3].mean(axis=-1)


def _finite(value, nonnegative: bool = False) -> np.ndarray | None:
    """``value`` as a float array where it is non-empty and finite (and non-negative), else None
    (the benchmark's ``_finite_array``)."""
    try:
        v = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        return None
    if v.size == 0 or not np.isfinite(v).all() or (nonnegative and (v < 0).any()):
        return None
    return v


def mode_kappa_total(mode_kappa_p: np.ndarray, mode_kappa_c: np.ndarray, heat_capacity: np.ndarray) -> np.ndarray:
    """Each mode's total (particle-like plus wave-like) conductivity ``[T, q, b, 6]``, as the
    benchmark's ``calc_mode_kappa_tot``: the coherence term ``κ_C[b, b']`` ``[T, q, b, b, 6]`` goes
    to mode ``b'`` weighted by its partner's heat capacity ``C`` ``[T, q, b]``,
    ``κ(b') = κ_P(b') + Σ_b 2 C_b / (C_b + C_b') κ_C(b, b')`` (0/0 gives 0)."""
    c = np.asarray(heat_capacity, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        coherent = 2 * ((np.asarray(mode_kappa_c, dtype=float) * c[:, :, :, None, None])
                        / (c[:, :, :, None, None] + c[:, :, None, :, None])).sum(axis=2)
    coherent[np.isnan(coherent)] = 0
    return coherent + np.asarray(mode_kappa_p, dtype=float)


def has_imaginary_modes(frequencies, threshold: float = IMAGINARY_THRESHOLD) -> bool:
    """Whether phonon ``frequencies`` ``[q, b]`` (THz, the Γ point first, bands in ascending
    order) have imaginary modes: any negative frequency, except the three acoustic modes at Γ,
    which may be down to ``threshold``; all NaN (nothing computed) counts as imaginary."""
    f = np.asarray(frequencies, dtype=float)
    if np.isnan(f).all():
        return True
    return bool((f[0, 3:] < 0).any() or (f[0, :3] < threshold).any() or (f[1:] < 0).any())


def _single_kappa(kappa, reference: bool = False) -> float | None:
    """κ̄ of ``kappa`` where it is one finite non-negative value; else None (a prediction) or a
    ValueError (a reference), as the benchmark's ``_single_kappa``."""
    v = _finite(kappa_average(kappa), nonnegative=True)
    if v is None or v.size != 1:
        if reference:
            raise ValueError(f"the reference κ must be one finite non-negative value, got {kappa!r}")
        return None
    return float(v.ravel()[0])


def srd(kappa_pred, kappa_true) -> float:
    """The symmetric relative difference of the average conductivities (module docstring): −2
    where the prediction is not one finite non-negative κ̄, 0 where both are 0."""
    t = _single_kappa(kappa_true, reference=True)
    p = _single_kappa(kappa_pred)
    if p is None:
        return -KAPPA_ERROR_MAX
    return 0.0 if p + t == 0 else KAPPA_ERROR_MAX * (p - t) / (p + t)


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
    """The symmetric relative mean error of one material (module docstring), as the benchmark's
    ``_calc_kappa_srme_dataframes`` and ``calc_kappa_srme``. ``true_spg``: the reference's space
    group, compared with the final one where the prediction does not record its initial space
    group."""
    true_total = _finite(np.atleast_1d(kappa_average(true.kappa)), nonnegative=True)
    if true_total is None:
        raise ValueError("the reference κ must be finite and non-negative: it cannot be scored against")
    true_mode = None if true.mode_kappa is None else _finite(kappa_average(true.mode_kappa))
    if true_mode is None:
        raise ValueError("the reference's mode κ is missing or not finite: it cannot be scored against")
    if pred.has_imaginary:
        return KAPPA_ERROR_MAX
    if pred.spg_final:
        initial = pred.spg_initial if pred.spg_initial is not None else true_spg
        if initial is not None and pred.spg_final != initial:
            return KAPPA_ERROR_MAX
    pred_mode = None if pred.mode_kappa is None else _finite(kappa_average(pred.mode_kappa))
    pred_total = _finite(np.atleast_1d(kappa_average(pred.kappa)), nonnegative=True)
    weights = None if pred.weights is None else _finite(pred.weights, nonnegative=True)
    if (pred_mode is None or pred_total is None or pred_total.shape != true_total.shape or weights is None
            or weights.sum() <= 0 or pred_mode.shape != true_mode.shape):
        return KAPPA_ERROR_MAX
    error = np.atleast_1d(np.abs(pred_mode - true_mode).sum(axis=tuple(range(1, pred_mode.ndim))) / weights.sum())
    if error.shape != true_total.shape or error.size != 1:
        return KAPPA_ERROR_MAX
    denominator = pred_total + true_total
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(denominator == 0, np.where(error == 0, 0.0, KAPPA_ERROR_MAX),
                         KAPPA_ERROR_MAX * error / denominator)
    value = float(score[0])
    return value if np.isfinite(value) and 0 <= value <= KAPPA_ERROR_MAX else KAPPA_ERROR_MAX


def kappa_metrics(preds: dict[str, KappaRecord], trues: dict[str, KappaRecord],
                  true_spg: dict[str, int] | None = None) -> dict:
    """κ_SRME, κ_SRE and the mean SRD over the reference's materials, with each material's values.
    A material of the reference without a prediction (failed, not run) scores SRME = 2 and
    SRD = −2, as a failed calculation does."""
    rows = {}
    for key, true in trues.items():
        pred = preds.get(key)
        if pred is None:  # scored as a failed calculation (NaN κ), the reference still checked
            pred = KappaRecord(kappa=np.full(6, np.nan))
        d = srd(pred.kappa, true.kappa)
        rows[key] = {"SRD": d, "SRE": abs(d), "SRME": srme(pred, true, (true_spg or {}).get(key))}
    mean = (lambda k: float(np.mean([r[k] for r in rows.values()]))) if rows else (lambda k: float("nan"))
    return {"kappa_SRME": mean("SRME"), "kappa_SRE": mean("SRE"), "kappa_SRD": mean("SRD"),
            "materials": len(rows), "per_material": rows}


def _valid_score(value, top: float = np.inf) -> bool:
    """The site's ``is_valid_score``: a finite number in [0, top]."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return False
    return np.isfinite(v) and 0 <= v <= top


def combined_score(f1: float | None, kappa_srme: float | None, rmsd: float | None,
                   weights: dict[str, float] | None = None) -> float | None:
    """The leaderboard's combined performance score, as the site's ``calculate_cps`` (module
    docstring): None where a metric of non-zero weight is missing or invalid, or all weights
    are 0."""
    w = dict(CPS_WEIGHTS, **(weights or {}))
    if ((w["F1"] > 0 and not _valid_score(f1, 1)) or (w["RMSD"] > 0 and not _valid_score(rmsd))
            or (w["kappa_SRME"] > 0 and not _valid_score(kappa_srme, 2))):
        return None
    total = w["F1"] + w["RMSD"] + w["kappa_SRME"]
    if total == 0:
        return None
    s_f1 = float(f1) if _valid_score(f1, 1) else 0.0
    s_rmsd = max(0.0, min(1.0, 1 - float(rmsd) / RMSD_BASELINE)) if _valid_score(rmsd) else 0.0
    s_kappa = 1 - float(kappa_srme) / 2 if _valid_score(kappa_srme, 2) else 0.0
    return float((s_f1 * w["F1"] + s_rmsd * w["RMSD"] + s_kappa * w["kappa_SRME"]) / total)
