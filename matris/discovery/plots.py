"""The Matbench-Discovery figure: predicted against DFT hull distance, and the DFT hull
distances of the test set stacked by classification (TP, FN, FP, TN). matplotlib (Agg), no
display needed; written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..extras import require
from .metrics import DiscoveryMetrics, classify_stable

CLASSES = (("TP", "tab:green"), ("FN", "tab:orange"), ("FP", "tab:red"), ("TN", "tab:blue"))


def discovery_figure(result: DiscoveryMetrics, title: str = "", window: float = 0.5):
    """Two panels (eV/atom): parity of predicted vs DFT hull distance on the full test set,
    coloured by classification, and a histogram of the DFT hull distances within ±``window``
    stacked by TP/FN/FP/TN. The full-test-set F1, DAF, MAE and R² are written on the parity panel."""
    matplotlib = require("matplotlib", "discovery", "the discovery figure")
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    threshold = result.settings.get("stability_threshold", 0.0)
    true, pred = result.each_true, result.each_pred
    masks = classify_stable(true, pred, stability_threshold=threshold)
    fig, (ax_parity, ax_hist) = plt.subplots(1, 2, figsize=(11, 4.5))
    known = ~(np.isnan(true) | np.isnan(pred))
    size = 4 if known.sum() > 5000 else 12
    for (name, color), mask in zip(CLASSES, masks):
        sel = mask & known
        ax_parity.scatter(true[sel], pred[sel], s=size, c=color, alpha=0.5, lw=0, label=f"{name} ({int(mask.sum())})")
    if known.any():
        lo, hi = np.nanpercentile(np.concatenate([true[known], pred[known]]), [0.5, 99.5])
        pad = 0.05 * (hi - lo or 1)
        lims = (lo - pad, hi + pad)
        ax_parity.plot(lims, lims, color="0.4", lw=0.8)
        ax_parity.set_xlim(lims)
        ax_parity.set_ylim(lims)
    ax_parity.axvline(threshold, color="0.6", ls="--", lw=0.8)
    ax_parity.axhline(threshold, color="0.6", ls="--", lw=0.8)
    m = result.metrics["full_test_set"]
    ax_parity.text(0.03, 0.97, "\n".join(f"{k} = {m[k]:.3f}" for k in ("F1", "DAF", "MAE", "R2")),
                   transform=ax_parity.transAxes, va="top", fontsize=9)
    ax_parity.set_xlabel("DFT hull distance (eV/atom)")
    ax_parity.set_ylabel("predicted hull distance (eV/atom)")
    ax_parity.legend(loc="lower right", fontsize=8, markerscale=2)

    bins = np.linspace(-window, window, 101)
    stacked = [np.clip(true[mask & ~np.isnan(true)], -window, window) for mask in masks]
    ax_hist.hist(stacked, bins=bins, stacked=True, color=[c for _, c in CLASSES], label=[n for n, _ in CLASSES])
    ax_hist.axvline(threshold, color="0.3", ls="--", lw=0.8)
    ax_hist.set_xlabel("DFT hull distance (eV/atom)")
    ax_hist.set_ylabel("materials")
    ax_hist.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_discovery_figure(result: DiscoveryMetrics, path: str | os.PathLike, title: str = "") -> Path:
    """Draw :func:`discovery_figure` and write it to ``path`` (PNG)."""
    from ..simulate.plots import save_figure

    return save_figure(discovery_figure(result, title), path)


__all__ = ["discovery_figure", "save_discovery_figure"]
