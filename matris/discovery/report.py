"""``matris discovery report``: F1, κ_SRME, RMSD and the combined performance score of a model in
one table (Markdown and JSON), next to reference rows from ``matris/assets/leaderboard.json``
(the published MatRIS figures, with their source), and the κ figures: κ predicted vs DFT
(log-log) and the per-material SRME distribution."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import MatRISInputError
from .kappa_metrics import combined_score


def reference_rows() -> dict:
    """The committed reference rows and their source."""
    return json.loads(resources.files("matris.assets").joinpath("leaderboard.json").read_text())


def gather(metrics_dir: str | Path | None = None, kappa: dict | None = None) -> dict:
    """This model's metrics: F1 of the unique prototypes (``metrics.json`` of ``matris discovery
    metrics``), RMSD (its ``geo_opt.json``, where it was run with ``--dft-relaxed``) and κ_SRME
    (``kappa``: the result of :func:`matris.discovery.kappa_run.compare`); None where missing."""
    out = {"F1": None, "kappa_SRME": None, "RMSD": None}
    if metrics_dir is not None:
        folder = Path(metrics_dir)
        path = folder / "metrics.json"
        if not path.is_file():
            raise MatRISInputError(f"{folder} has no metrics.json: give the output folder of 'matris discovery "
                                   "metrics'")
        out["F1"] = json.loads(path.read_text())["unique_prototypes"]["F1"]
        geo = folder / "geo_opt.json"
        if geo.is_file():
            out["RMSD"] = json.loads(geo.read_text())["RMSD"]
    if kappa is not None:
        out["kappa_SRME"] = kappa["kappa_SRME"]
    return out


def build(name: str, metrics: dict) -> dict:
    """The report: this model's row, then the reference rows, each with its combined score."""
    refs = reference_rows()
    rows = [{"model": name, **metrics}] + [dict(r) for r in refs["rows"]]
    for r in rows:
        r["CPS"] = combined_score(r.get("F1"), r.get("kappa_SRME"), r.get("RMSD"))
    return {"rows": rows, "reference_source": refs["source"],
            "cps": "0.5·F1 + 0.4·(1 − κ_SRME/2) + 0.1·(1 − RMSD/0.15 Å), clamped; None where a metric is missing "
                   "or invalid (the leaderboard's calculate_cps)"}


def table(report: dict) -> str:
    """The report as a Markdown table."""
    def fmt(v, digits=3):
        return "–" if v is None else f"{v:.{digits}f}"

    def params(v):
        return "–" if not v else f"{v / 1e6:.1f}M"

    lines = ["| model | params | F1 | κ_SRME | RMSD | CPS |", "|---|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        lines.append(f"| {r['model']} | {params(r.get('params'))} | {fmt(r.get('F1'))} | {fmt(r.get('kappa_SRME'))} | "
                     f"{fmt(r.get('RMSD'), 4)} | {fmt(r.get('CPS'))} |")
    notes = "".join(f" {r['model']}: {r['note']}." for r in report["rows"] if r.get("note"))
    return "\n".join(lines) + f"\n\nReference rows: {report['reference_source']}.{notes}"


def kappa_figure(pred: dict, true: dict, per_material: dict, path: str | Path, title: str = "") -> Path:
    """κ̄ predicted vs reference on log-log axes, and the histogram of per-material SRME (``pred``,
    ``true``: material id → :class:`matris.discovery.kappa_metrics.KappaRecord`; failed
    predictions absent)."""
    from ..extras import require

    require("matplotlib", "plot", "the κ figures")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = [k for k in true if k in pred]
    k_true = np.array([np.mean(np.asarray(true[k].kappa)[0, :3]) for k in ids])
    k_pred = np.array([np.mean(np.asarray(pred[k].kappa)[0, :3]) for k in ids])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 4))
    if ids:
        ax.loglog(k_true, k_pred, "o", ms=5)
        lo, hi = min(k_true.min(), k_pred.min()) / 2, max(k_true.max(), k_pred.max()) * 2
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set(xlabel="κ reference (W/m/K)", ylabel="κ predicted (W/m/K)", title=title or "κ at 300 K")
    bx.hist([v["SRME"] for v in per_material.values()], bins=np.linspace(0, 2, 21))
    bx.set(xlabel="SRME per material", ylabel="materials", title="SRME distribution")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path
