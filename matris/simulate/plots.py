"""Figures of simulation results (matplotlib, no display needed), written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..atomic import atomic_path


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Save ``fig`` to ``path`` through a temporary file in the same folder, then close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path, suffix=Path(path).suffix or ".png") as tmp:
            fig.savefig(tmp, dpi=150, bbox_inches="tight")
    finally:
        plt.close(fig)
    return Path(path)


def eos_figure(result):
    """Energy per atom against volume per atom: the computed points and the fitted curve."""
    fig, ax = _figure(1, (5, 4))
    n = result.natoms
    v = np.linspace(result.volumes.min(), result.volumes.max(), 200)
    ax.plot(result.volumes / n, result.energies / n, "o", label="MatRIS")
    ax.plot(v / n, result.fit_energies(v) / n, "-",
            label=f"{result.eos}: V₀ = {result.v0 / n:.3f} Å³/atom, B = {result.bulk_modulus:.1f} GPa")
    ax.set_xlabel("volume (Å³/atom)")
    ax.set_ylabel("energy (eV/atom)")
    ax.set_title(result.name)
    ax.legend(fontsize=8)
    return fig


def phonon_figure(result):
    """Band structure along the high-symmetry path (THz) with the total DOS beside it."""
    fig, (ax_band, ax_dos) = _figure(2, (8, 4), gridspec_kw={"width_ratios": [3, 1]}, sharey=True)
    x = result.band["distances"]
    ax_band.plot(x, result.band["frequencies"], color="C0", lw=1)
    for pos in result.band["label_positions"]:
        ax_band.axvline(pos, color="0.7", lw=0.6)
    ax_band.axhline(0, color="0.4", lw=0.6)
    ax_band.set_xticks(result.band["label_positions"])
    ax_band.set_xticklabels([label.replace("G", "Γ") for label in result.band["labels"]])
    ax_band.set_xlim(x[0], x[-1])
    ax_band.set_ylabel("frequency (THz)")
    ax_band.set_title(result.name)
    ax_dos.plot(result.dos["total_dos"], result.dos["frequencies"], color="C1", lw=1)
    ax_dos.set_xlabel("DOS (states/THz)")
    ax_dos.set_xlim(left=0)
    return fig


def _figure(ncols, size, **kwargs):
    from ..extras import require

    matplotlib = require("matplotlib", "plot", "plotting")
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=size, **kwargs)
