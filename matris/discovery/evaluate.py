"""The metrics step end to end: relaxation results + WBM data files → predictions file,
metrics table and figure.

:func:`evaluate` joins predictions with the WBM summary (the DFT truth) and computes
:func:`matris.discovery.metrics.discovery_metrics`; :func:`run_metrics` also reads the shard
files and data files and writes every output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import write_text
from ..errors import MatRISInputError, counted
from .energy import HullReference
from .metrics import STABILITY_THRESHOLD, TOP_K, DiscoveryMetrics, discovery_metrics
from .plots import save_discovery_figure
from .predictions import Predictions, predict
from .readers import (
    E_FORM_DFT,
    EACH_TRUE,
    UNIQUE_PROTOTYPE,
    read_elemental_refs,
    read_entries,
    read_hull_entries,
    read_summary,
)
from .store import MergedResults, merge_results


def evaluate(summary, predictions: Predictions, *, only_predicted: bool = False,
             stability_threshold: float = STABILITY_THRESHOLD, top_k: int = TOP_K, decimals: int | None = 3,
             max_error: float | None = 5.0) -> DiscoveryMetrics:
    """Metrics of ``predictions`` against the WBM ``summary`` (DataFrame from :func:`read_summary`).

    The test set is every material of the summary; materials without a prediction count as
    missing (predicted unstable), as on the Matbench-Discovery leaderboard. ``only_predicted``
    restricts it to the materials with a prediction (for partial runs, e.g. ``--limit``).
    Hull distances measured on a given hull (``e_above_hull_KEY``) are used when present.
    """
    frame = predictions.frame
    unknown = [m for m in frame.index if m not in summary.index]
    if unknown:
        verb = "is" if len(unknown) == 1 else "are"
        raise MatRISInputError(f"{counted(len(unknown), 'predicted material')} {verb} not in the WBM summary "
                               f"({unknown[:3]}…); "
                               "the structures and the summary belong to different data sets")
    ids = [m for m in summary.index if m in frame.index] if only_predicted else list(summary.index)
    if not ids:
        raise MatRISInputError("no material to evaluate: the summary is empty or nothing was predicted")
    rows = summary.loc[ids]
    each_pred = frame[predictions.each_column].reindex(ids).to_numpy(float) \
        if predictions.each_column in frame else None
    result = discovery_metrics(rows[EACH_TRUE].to_numpy(float), rows[E_FORM_DFT].to_numpy(float),
                               frame[predictions.e_form_column].reindex(ids).to_numpy(float),
                               rows[UNIQUE_PROTOTYPE].to_numpy(bool), each_pred=each_pred,
                               stability_threshold=stability_threshold, top_k=top_k, decimals=decimals,
                               max_error=max_error)
    result.material_ids = list(ids)
    result.settings["test_set"] = "predicted materials only" if only_predicted else "whole summary"
    return result


@dataclass
class MetricsRun:
    """What :func:`run_metrics` produced: the metrics, the predictions, the merged
    relaxation results and the files written (name → path)."""

    metrics: DiscoveryMetrics
    predictions: Predictions
    results: MergedResults
    files: dict[str, Path] = field(default_factory=dict)
    geometry: dict | None = None  # geo_opt metrics (RMSD, symmetry) where DFT-relaxed structures were given


def run_metrics(relaxed: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
                summary: str | os.PathLike, entries: str | os.PathLike | None = None,
                elemental_refs: str | os.PathLike | None = None, hull_entries: str | os.PathLike | None = None,
                key: str = "matris", only_predicted: bool = False, stability_threshold: float = STABILITY_THRESHOLD,
                top_k: int = TOP_K, decimals: int | None = 3, max_error: float | None = 5.0,
                progress: bool = False, dft_relaxed: str | os.PathLike | None = None,
                symprec: float = 1e-2) -> MetricsRun:
    """Read the shards in ``relaxed``, predict, evaluate, and write to ``out_dir`` (default
    ``relaxed``): the submission files, ``metrics.json``, ``metrics.csv`` and ``discovery.png``.

    ``entries`` (WBM computed structure entries) switch the MP2020 corrections on;
    ``elemental_refs`` give the formation-energy references; ``hull_entries`` measure
    formation energies and hull distances on that hull instead. ``dft_relaxed`` (the WBM
    DFT-relaxed structures) adds the geometry metrics over the unique prototypes that were
    relaxed (:func:`matris.discovery.geometry.geo_opt_metrics`, moyopy at ``symprec``):
    ``geo_opt.json``.
    """
    results = merge_results(relaxed)
    if not results.records:
        raise MatRISInputError(f"{relaxed} holds no relaxation results yet; run 'matris discovery relax' first")
    table = read_summary(summary)
    dft_entries = None if entries is None else read_entries(entries, set(results.records))
    refs = None if elemental_refs is None else read_elemental_refs(elemental_refs)
    hull = None if hull_entries is None else HullReference(read_hull_entries(hull_entries))
    predictions = predict(results, key=key, entries=dft_entries, references=refs, hull=hull, progress=progress)
    metrics = evaluate(table, predictions, only_predicted=only_predicted, stability_threshold=stability_threshold,
                       top_k=top_k, decimals=decimals, max_error=max_error)
    metrics.settings.update(model=results.manifest.get("model"), corrections="MP2020" if entries else "none",
                            hull="given entries" if hull is not None else "MP (WBM summary)",
                            relaxed=len(results), failed=len(results.failed), not_relaxed=len(results.missing),
                            mp2020_rejected=len(predictions.rejected))
    out = Path(out_dir) if out_dir is not None else Path(relaxed)
    csv_path, structures_path = predictions.write(out)
    files = {"predictions": csv_path, "structures": structures_path,
             "metrics_json": write_text(out / "metrics.json", metrics.to_json() + "\n"),
             "metrics_csv": write_text(out / "metrics.csv", metrics.to_csv())}
    files["figure"] = save_discovery_figure(metrics, out / "discovery.png",
                                            title=f"{results.manifest.get('model', key)} on WBM")
    geometry = None
    if dft_relaxed is not None:
        geometry = relaxed_geometry(results, table, dft_relaxed, symprec)
        from ..atomic import write_json

        files["geo_opt"] = write_json(out / "geo_opt.json", geometry)
    return MetricsRun(metrics=metrics, predictions=predictions, results=results, files=files, geometry=geometry)


def relaxed_geometry(results: MergedResults, summary, dft_relaxed: str | os.PathLike, symprec: float = 1e-2) -> dict:
    """RMSD and symmetry metrics of the relaxed unique prototypes against their DFT-relaxed
    structures in ``dft_relaxed`` (any file :func:`.readers.read_structures` reads)."""
    from .geometry import geo_opt_metrics
    from .readers import read_structures

    source = read_structures(dft_relaxed)
    unique = set(summary.index[summary[UNIQUE_PROTOTYPE].astype(bool)])
    ids = [m for m, r in results.records.items() if r.ok and m in unique]
    where = {m: k for k, m in enumerate(source.material_ids)}
    missing = [m for m in ids if m not in where]
    if missing:
        raise MatRISInputError(f"{dft_relaxed} lacks {counted(len(missing), 'relaxed material')} ({missing[:3]}): "
                               "give the WBM DFT-relaxed structures of the same data set")
    refs = dict(zip(ids, source.load([where[m] for m in ids])))
    out = geo_opt_metrics({m: results.records[m].structure() for m in ids}, refs, symprec)
    out["subset"] = "unique prototypes relaxed"
    return out


__all__ = ["evaluate", "run_metrics", "MetricsRun"]
