"""Matbench-Discovery's κ metrics and combined score (matris.discovery.kappa_metrics), against
values computed by hand from the benchmark's definitions (matbench-discovery @ 2c7f9fc4,
metrics/phonons.py, phonons/thermal_conductivity.py, site/src/lib/combined-scores.svelte.ts).
The edge cases of those definitions: tests/test_kappa_edge_cases.py."""

import numpy as np
import pytest

from matris.discovery.kappa_metrics import (
    KappaRecord,
    combined_score,
    has_imaginary_modes,
    kappa_average,
    kappa_metrics,
    mode_kappa_total,
    srd,
    srme,
)


def voigt(xx, yy, zz, off=0.0):
    return [xx, yy, zz, off, off, off]


def test_the_average_is_the_mean_of_the_diagonal_only():
    assert kappa_average(voigt(1.0, 2.0, 6.0, off=100.0)) == pytest.approx(3.0, abs=1e-15)
    assert kappa_average([voigt(1, 1, 1), voigt(3, 3, 3)]).tolist() == [1.0, 3.0]
    assert np.isnan(kappa_average(voigt(1.0, np.nan, 1.0))).all()
    assert kappa_average(voigt(1.0, 2.0, 6.0, off=np.nan)) == pytest.approx(3.0, abs=1e-15)


def test_mode_kappa_splits_the_coherence_term_by_heat_capacity():
    p = np.zeros((1, 1, 2, 6))
    p[0, 0, :, 0] = [1.0, 2.0]
    c = np.array([[[1.0, 3.0]]])
    kc = np.zeros((1, 1, 2, 2, 6))
    kc[0, 0, :, :, 0] = [[0.4, 0.8], [0.2, 0.6]]
    out = mode_kappa_total(p, kc, c)
    # the benchmark's calc_mode_kappa_tot: κ_C[b, b'] goes to b' weighted by the partner's C_b,
    # κ(b') = κ_P(b') + Σ_b 2 C_b/(C_b + C_b') κ_C(b, b'):
    # κ(0) = 1 + 2·1/2·0.4 + 2·3/4·0.2 = 1.7;  κ(1) = 2 + 2·1/4·0.8 + 2·3/6·0.6 = 3.0 (total 4.7 either way)
    assert out[0, 0, :, 0] == pytest.approx([1.7, 3.0], abs=1e-15)
    assert (out[..., 1:] == 0).all()
    zero = mode_kappa_total(p, kc, np.zeros_like(c))  # 0/0 heat-capacity shares count as 0
    assert zero[0, 0, :, 0].tolist() == [1.0, 2.0]


def test_imaginary_modes_allow_only_a_little_noise_on_the_acoustic_modes_at_gamma():
    f = np.array([[-0.005, 0.0, 0.001, 5.0, 6.0, 7.0], [1.0, 2.0, 3.0, 5.0, 6.0, 7.0]])
    assert not has_imaginary_modes(f)
    for q, b, value in [(0, 0, -0.02), (0, 3, -1e-6), (1, 0, -1e-6)]:
        g = f.copy()
        g[q, b] = value
        assert has_imaginary_modes(g), (q, b, value)
    assert has_imaginary_modes(np.full_like(f, np.nan))


def test_srd_and_sre():
    assert srd([voigt(3, 3, 3)], [voigt(1, 1, 1)]) == pytest.approx(1.0, abs=1e-15)  # 2·(3−1)/(3+1)
    assert srd(voigt(1, 2, 3), voigt(2, 2, 2)) == 0.0
    assert srd(voigt(np.nan, 1, 1), voigt(2, 2, 2)) == -2.0  # a missing prediction counts as κ = 0


def _record(modes, weights, **kw):
    """A one-temperature record from per-(q, b) isotropic mode κ ``modes`` [q, b] (weighted)."""
    modes = np.asarray(modes, dtype=float)
    w = np.asarray(weights, dtype=float)
    mode_kappa = np.zeros((1, *modes.shape, 6))
    mode_kappa[0, ..., :3] = modes[..., None]
    kappa = mode_kappa.sum(axis=(1, 2)) / w.sum()
    return KappaRecord(kappa=kappa, mode_kappa=mode_kappa, weights=w, **kw)


def test_srme_by_hand_and_its_failure_cases():
    w = [1.0, 3.0]
    true = _record([[2.0, 1.0], [6.0, 3.0]], w)  # κ̄ = 12/4 = 3
    pred = _record([[1.0, 1.0], [9.0, 1.0]], w, spg_initial=227, spg_final=227)  # κ̄ = 12/4 = 3
    # Σ|Δ| = 1 + 0 + 3 + 2 = 6, / Σw = 1.5; SRME = 2·1.5/(3 + 3) = 0.5
    assert srme(pred, true) == pytest.approx(0.5, abs=1e-15)
    assert srme(true, true) == 0.0
    for bad in (dict(has_imaginary=True), dict(spg_initial=227, spg_final=141)):
        assert srme(_record([[1.0, 1.0], [9.0, 1.0]], w, **bad), true) == 2.0
    # without its own initial space group the prediction is compared with the reference's
    assert srme(_record([[1.0, 1.0], [9.0, 1.0]], w, spg_final=141), true, true_spg=227) == 2.0
    nan = _record([[1.0, np.nan], [9.0, 1.0]], w)
    assert srme(nan, true) == 2.0
    assert srme(KappaRecord(kappa=true.kappa), true) == 2.0  # no mode resolution: failed
    with pytest.raises(ValueError, match="reference"):
        srme(pred, _record([[np.nan, 1.0], [1.0, 1.0]], w))
    assert srme(_record([[1.0, 1.0, 1.0]], [4.0]), true) == 2.0  # another q-mesh: the benchmark's 2


def test_model_metrics_average_over_the_reference_and_count_missing_predictions_as_failures():
    w = [1.0, 3.0]
    trues = {"a": _record([[2.0, 1.0], [6.0, 3.0]], w), "b": _record([[1.0, 1.0], [1.0, 1.0]], w)}
    preds = {"a": _record([[1.0, 1.0], [9.0, 1.0]], w)}
    m = kappa_metrics(preds, trues)
    assert m["materials"] == 2
    assert m["per_material"]["a"] == {"SRD": 0.0, "SRE": 0.0, "SRME": pytest.approx(0.5, abs=1e-15)}
    assert m["per_material"]["b"] == {"SRD": -2.0, "SRE": 2.0, "SRME": 2.0}
    assert m["kappa_SRME"] == pytest.approx(1.25, abs=1e-15) and m["kappa_SRE"] == 1.0 and m["kappa_SRD"] == -1.0


def test_combined_score_by_hand():
    # 0.5·F1 + 0.4·(1 − SRME/2) + 0.1·(1 − RMSD/0.15)
    assert combined_score(0.9, 0.2, 0.06) == pytest.approx(0.45 + 0.36 + 0.06, abs=1e-15)
    # the published MatRIS-10M-OAM figures
    assert combined_score(0.921, 0.218, 0.0601) == pytest.approx(0.4605 + 0.4 * 0.891 + 0.1 * (0.0899 / 0.15),
                                                                 abs=1e-12)
    assert combined_score(1.0, 0.0, 0.0) == 1.0 and combined_score(0.0, 2.0, 0.2) == 0.0
    assert combined_score(0.8, 1.9, 0.2) == pytest.approx(0.5 * 0.8 + 0.4 * 0.05, abs=1e-15)  # RMSD part clamped
    assert combined_score(0.8, 3.0, -0.1) is None  # the site's validity rules: test_kappa_edge_cases.py
    assert combined_score(0.9, None, 0.06) is None and combined_score(np.nan, 0.2, 0.06) is None
    # a metric of weight 0 may be missing; the weights are renormalised
    assert combined_score(0.9, None, 0.06, weights={"kappa_SRME": 0.0}) == pytest.approx(
        (0.5 * 0.9 + 0.1 * 0.6) / 0.6, abs=1e-15)


def test_report_rows_and_the_published_reference(tmp_path, capsys):
    import json

    from matris.cli import main as cli_main
    from matris.discovery.report import build, gather, table

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "metrics.json").write_text(json.dumps({"unique_prototypes": {"F1": 0.9}}))
    assert gather(tmp_path / "m") == {"F1": 0.9, "kappa_SRME": None, "RMSD": None}
    (tmp_path / "m" / "geo_opt.json").write_text(json.dumps({"RMSD": 0.06}))
    report = build("mine", gather(tmp_path / "m", {"kappa_SRME": 0.2}))
    mine, *refs = report["rows"]
    by_name = {r["model"]: r for r in refs}
    # the leaderboard at matbench-discovery 2c7f9fc4: its top ten by CPS, then the other MatRIS models
    assert [r["model"] for r in refs[:3]] == ["TECE-OAM-RRA-1.0", "EquFlashV2", "EquiformerV3+DeNS-OAM"]
    assert len(refs) == 12 and refs[9]["model"] == "MatRIS-10M-OAM" and refs[9]["rank_by_CPS"] == 10
    assert by_name["TECE-OAM-RRA-1.0"]["CPS"] == pytest.approx(0.908, abs=5e-4)
    esen = by_name["eSEN-30M-OAM"]
    assert esen["RMSD"] == 0.0608 and esen["CPS"] == pytest.approx(0.888, abs=5e-4)
    matris = by_name["MatRIS-10M-OAM"]
    assert matris["params"] == 10443505 and matris["CPS"] == pytest.approx(0.8768, abs=1e-4)
    assert {"MatRIS-10M-MP", "MatRIS v0.5.0 MPtrj"} <= set(by_name)
    assert mine["CPS"] == pytest.approx(0.45 + 0.36 + 0.06, abs=1e-12)
    assert "| mine | – | 0.900 | 0.200 | 0.0600 | 0.870 |" in table(report) and "2c7f9fc4" in table(report)
    assert "| MatRIS-10M-OAM | 10.4M | 0.921 | 0.218 | 0.0601 | 0.877 |" in table(report)
    # from the command line: the report files; a missing metric leaves the combined score out
    assert cli_main(["discovery", "report", "--metrics", str(tmp_path / "m"), "--name", "mine",
                     "--out", str(tmp_path / "r")]) == 0
    assert json.loads((tmp_path / "r" / "report.json").read_text())["rows"][0]["CPS"] is None
    assert "| mine | – | 0.900 | – | 0.0600 | – |" in capsys.readouterr().out
    assert cli_main(["discovery", "report", "--kappa-pred", str(tmp_path)]) == 2
    assert cli_main(["discovery", "report", "--metrics", str(tmp_path / "nothing")]) == 2


def test_the_benchmarks_dft_table_reads_as_reference_records(tmp_path):
    """The DFT κ file's layout (a pandas JSON table with the benchmark's column names), both mode
    resolutions it may hold, and a clear error for another table."""
    pd = pytest.importorskip("pandas")
    from matris.discovery.kappa_run import read_reference
    from matris.errors import MatRISInputError

    w = [1.0, 3.0]
    full = _record([[2.0, 1.0], [6.0, 3.0]], w)
    frame = pd.DataFrame({"material_id": ["mp-1", "mp-2"],
                          "kappa_tot_rta": [full.kappa.tolist()] * 2,
                          "mode_kappa_tot_rta": [full.mode_kappa.tolist()] * 2,
                          "mode_weights": [w, w], "spg_num": [227, 225]})
    frame.to_json(tmp_path / "dft.json.gz")
    records, spg = read_reference(tmp_path / "dft.json.gz")
    assert spg == {"mp-1": 227, "mp-2": 225}
    assert srme(full, records["mp-1"]) == 0.0 and srd(full.kappa, records["mp-2"].kappa) == 0.0
    averaged = frame.drop(columns="mode_kappa_tot_rta").assign(
        mode_kappa_tot_avg=[kappa_average(full.mode_kappa).tolist()] * 2)
    averaged.to_json(tmp_path / "avg.json")
    assert srme(full, read_reference(tmp_path / "avg.json")[0]["mp-1"]) == 0.0
    frame.drop(columns="mode_weights").to_json(tmp_path / "bad.json")
    with pytest.raises(MatRISInputError, match="lacks mode_weights"):
        read_reference(tmp_path / "bad.json")
