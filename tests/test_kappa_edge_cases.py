"""The κ metrics' and the combined score's edge cases as Matbench Discovery's current code has them
(janosh/matbench-discovery @ 2c7f9fc42d018711dc2f5df573d225ea6d2d17b2: metrics/phonons.py
``_symmetric_relative_difference``, ``calc_kappa_srme``, ``_calc_kappa_srme_dataframes``;
site/src/lib/combined-scores.svelte.ts ``calculate_cps``). Each expected value is the benchmark's,
worked out by hand from those definitions (the comment says how)."""

import numpy as np
import pytest

from matris.discovery.kappa_metrics import KAPPA_ERROR_MAX, KappaRecord, combined_score, kappa_metrics, srd, srme


def rec(modes, weights=(1.0, 1.0), kappa=None, **kw):
    """One-temperature record from isotropic per-(q, b) mode κ ``modes`` [q, b]; κ̄ from the
    modes unless given."""
    modes = np.asarray(modes, dtype=float)
    w = np.asarray(weights, dtype=float)
    mode = np.zeros((1, *modes.shape, 6))
    mode[0, ..., :3] = modes[..., None]
    total = mode.sum(axis=(1, 2)) / w.sum() if kappa is None else np.array([[kappa] * 3 + [0.0] * 3])
    return KappaRecord(kappa=total, mode_kappa=mode, weights=w, **kw)


TRUE = rec([[1.0], [1.0]])  # κ̄ = 2/2 = 1


def test_negative_prediction():
    # _single_kappa rejects a negative κ̄: SRD −2 (not 2·(−1 − 1)/(−1 + 1)); calc_kappa_srme's
    # predicted totals must be non-negative: SRME 2
    pred = rec([[-1.0], [-1.0]])
    assert srd(pred.kappa, TRUE.kappa) == -2.0
    assert srme(pred, TRUE) == 2.0


def test_zero_weights():
    # mode_weights.sum() <= 0: failure, SRME 2 (not a division by zero)
    assert srme(rec([[1.0], [1.0]], weights=(0.0, 0.0), kappa=1.0), TRUE) == 2.0
    assert srme(rec([[1.0], [1.0]], weights=(-1.0, 1.0), kappa=1.0), TRUE) == 2.0  # negative weight


def test_error_above_the_cap():
    # κ̄ both 1; Σ|Δ| = |10 − 1| + |−8 − 1| = 18, / Σw = 9; 2·9/(1 + 1) = 9 > KAPPA_ERROR_MAX: 2
    pred = rec([[10.0], [-8.0]])
    assert srd(pred.kappa, TRUE.kappa) == 0.0
    assert srme(pred, TRUE) == KAPPA_ERROR_MAX == 2.0


def test_both_zero():
    # SRD: denominator 0 → 0; SRME: denominator 0 and microscopic error 0 → 0
    zero = rec([[0.0], [0.0]])
    assert srd(zero.kappa, zero.kappa) == 0.0
    assert srme(zero, zero) == 0.0
    # denominator 0 but a mode error left: 2
    assert srme(rec([[1.0], [-1.0]]), zero) == 2.0


def test_nan_off_diagonal_is_ignored_and_nan_diagonal_fails():
    # calculate_kappa_avg averages xx, yy, zz only: a NaN yz changes nothing
    pred = rec([[2.0], [1.0]])  # κ̄ 1.5, Σ|Δ| = 1, /2 = 0.5; SRD 2·0.5/2.5 = 0.4; SRME 2·0.5/2.5 = 0.4
    pred.kappa[0, 3] = np.nan
    pred.mode_kappa[0, 0, 0, 4] = np.nan
    assert srd(pred.kappa, TRUE.kappa) == pytest.approx(0.4, abs=1e-15)
    assert srme(pred, TRUE) == pytest.approx(0.4, abs=1e-15)
    # NaN on the diagonal: SRD −2 and SRME 2
    pred.kappa[0, 0] = np.nan
    assert srd(pred.kappa, TRUE.kappa) == -2.0 and srme(pred, TRUE) == 2.0
    bad_mode = rec([[2.0], [1.0]])
    bad_mode.mode_kappa[0, 1, 0, 2] = np.nan
    assert srme(bad_mode, TRUE) == 2.0


def test_another_q_mesh():
    # predicted_mode_kappa.shape != true_mode_kappa.shape: SRME 2 (no ValueError)
    assert srme(rec([[1.0], [1.0], [1.0]], weights=(1.0, 1.0, 1.0)), TRUE) == 2.0


def test_not_computed_censored_and_missing():
    # κ not computed (imaginary modes / broken symmetry in the pipeline): NaN κ, no modes
    nan = KappaRecord(kappa=np.full((1, 6), np.nan), has_imaginary=True, spg_initial=225, spg_final=225)
    assert srd(nan.kappa, TRUE.kappa) == -2.0 and srme(nan, TRUE) == 2.0
    # a perfect κ with a changed space group: censored, 2
    assert srme(rec([[1.0], [1.0]], spg_initial=225, spg_final=123), TRUE) == 2.0
    # spg_final 0/None is not checked (the benchmark's `if relaxed_spg` test)
    assert srme(rec([[1.0], [1.0]], spg_initial=225, spg_final=None), TRUE, true_spg=1) == 0.0
    # two temperatures: not one κ̄ → SRD −2 (the benchmark's protocol has one temperature)
    two = KappaRecord(kappa=np.ones((2, 6)), mode_kappa=TRUE.mode_kappa, weights=TRUE.weights)
    assert srd(two.kappa, TRUE.kappa) == -2.0 and srme(two, TRUE) == 2.0
    # a missing prediction scores as a failed one
    m = kappa_metrics({}, {"a": TRUE})
    assert m["per_material"]["a"] == {"SRD": -2.0, "SRE": 2.0, "SRME": 2.0}


def test_invalid_references_raise():
    # InvalidKappaReferenceError (a ValueError) for a reference that cannot be scored against
    for bad in (rec([[1.0], [1.0]], kappa=np.nan), rec([[1.0], [1.0]], kappa=-1.0), rec([[np.nan], [1.0]], kappa=1.0)):
        with pytest.raises(ValueError, match="reference"):
            srme(rec([[1.0], [1.0]]), bad)
    with pytest.raises(ValueError, match="reference"):
        srd(TRUE.kappa, np.full(6, np.nan))
    with pytest.raises(ValueError, match="reference"):  # checked before the prediction's censoring
        kappa_metrics({"a": KappaRecord(kappa=TRUE.kappa, has_imaginary=True)},
                      {"a": rec([[1.0], [1.0]], kappa=np.inf)})


def test_synthetic_set_mean():
    # the cases above as one model: SRME 2 (negative), 2 (zero weights), 2 (cap), 0 (0/0),
    # 0.4 (NaN off-diagonal), 2 (q-mesh), 2 (not computed), 0 (perfect): mean 10.4/8 = 1.3
    zero = rec([[0.0], [0.0]])
    nan_off = rec([[2.0], [1.0]])
    nan_off.kappa[0, 3] = np.nan
    preds = {"neg": rec([[-1.0], [-1.0]]), "w0": rec([[1.0], [1.0]], weights=(0.0, 0.0), kappa=1.0),
             "cap": rec([[10.0], [-8.0]]), "zero": zero, "nanoff": nan_off,
             "mesh": rec([[1.0], [1.0], [1.0]], weights=(1.0, 1.0, 1.0)),
             "imag": KappaRecord(kappa=np.full((1, 6), np.nan), has_imaginary=True), "ok": rec([[1.0], [1.0]])}
    trues = {k: (zero if k == "zero" else TRUE) for k in preds}
    m = kappa_metrics(preds, trues)
    assert m["kappa_SRME"] == pytest.approx(10.4 / 8, abs=1e-15)
    # SRD: −2, 0 (w0: κ̄ 1 = 1), 0 (cap), 0 (0/0), 0.4, 0 (mesh: κ̄ 1), −2, 0: mean −3.6/8
    assert m["kappa_SRD"] == pytest.approx(-3.6 / 8, abs=1e-15)
    assert m["kappa_SRE"] == pytest.approx(4.4 / 8, abs=1e-15)


def test_combined_score_validity():
    # calculate_cps returns null for: κ_SRME outside [0, 2], F1 outside [0, 1], RMSD negative or
    # not finite, a missing metric of non-zero weight, all weights 0
    assert combined_score(0.9, 2.1, 0.06) is None and combined_score(0.9, -0.1, 0.06) is None
    assert combined_score(1.1, 0.2, 0.06) is None and combined_score(-0.1, 0.2, 0.06) is None
    assert combined_score(0.9, 0.2, -0.01) is None and combined_score(0.9, 0.2, np.inf) is None
    assert combined_score(0.9, 0.2, None) is None
    assert combined_score(0.9, 0.2, 0.06, weights={"F1": 0, "kappa_SRME": 0, "RMSD": 0}) is None
    # the edges are valid: κ_SRME 2 scores 0, F1 1, RMSD above the 0.15 baseline clamps to 0
    assert combined_score(1.0, 2.0, 0.3) == pytest.approx(0.5, abs=1e-15)
    # a zero-weight metric may be invalid: it contributes 0 and the weights renormalise
    assert combined_score(0.9, 5.0, 0.06, weights={"kappa_SRME": 0.0}) == pytest.approx(
        (0.5 * 0.9 + 0.1 * 0.6) / 0.6, abs=1e-15)
