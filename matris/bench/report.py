"""A benchmark's results as a text table, JSON, CSV and a log-log plot of time against atoms.

Every file is written atomically (:mod:`matris.atomic`). JSON holds ``meta``, ``models``
and ``rows`` (:meth:`BenchResult.to_dict`); CSV holds one line per row with the same
fields (seconds, GiB); the plot shows each model's time per energy + forces + stress call
(solid) and its graph construction (dashed, where measured) against the number of atoms,
and the time per MD step, both on log-log axes with a line ∝ atoms for reference.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import fields
from pathlib import Path

from ..atomic import atomic_path, write_text
from ..atomic import write_json as _write_json
from .results import OK, BenchResult, BenchRow


def _num(value: float | None, fmt: str, width: int) -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width}{fmt}}"


def _count(n: int | None) -> str:
    if n is None:
        return "? parameters"
    return f"{n / 1e6:.2f}M parameters" if n >= 1e6 else f"{n / 1e3:.1f}k parameters"


def format_table(result: BenchResult) -> str:
    """The human-readable table: a header with the settings and models, then one line per row.

    Times in ms, memory in GiB; "÷MatRIS" is the model's time per call (or per MD step)
    divided by MatRIS's on the same structure.
    """
    m = result.meta
    lines = [
        f"matris bench: {m['device']} ({m['hardware']}, {m['threads']} thread{'' if m['threads'] == 1 else 's'}), "
        f"MatRIS in {m['dtype']}, torch {m['torch']}; median of {m['repeat']} calls after a warm-up; "
        f"MD: {m['md_steps']} velocity-Verlet steps of {m['timestep_fs']:g} fs",
        f"memory: {m['memory']} (GiB); ÷MatRIS: time per call (per MD step) divided by MatRIS's on the same "
        "structure, > 1 means MatRIS is faster",
    ]
    load = m.get("load_average_start")
    if m["device"] == "cpu" and load is not None and m.get("cpus") and load > 0.5 * m["cpus"]:
        lines.append(f"warning: the load average was {load:g} on {m['cpus']} CPUs when the run started; other "
                     "processes compete for the CPU, so times are noisy (with fewer threads, e.g. --threads 1, "
                     "they suffer less)")
    for model in result.models:
        if model.status == OK:
            lines.append(f"  {model.label}: {_count(model.parameters)}, {model.dtype}, {model.device}")
        else:
            lines.append(f"  {model.label}: skipped, {model.status}: {model.reason}")
    width = max([len(r.label) for r in result.rows] + [5])
    swidth = max([len(r.structure) for r in result.rows] + [9])
    header = (f"{'model':{width}s} {'structure':{swidth}s} {'atoms':>6s} {'graph ms':>9s} {'E+F+S ms':>10s} "
              f"{'atoms/s':>10s} {'÷MatRIS':>8s} {'MD step/s':>10s} {'ns/day':>8s} {'÷MatRIS':>8s} {'peak GiB':>8s}"
              f"  status")
    lines += ["", header, "-" * len(header)]
    last = None
    for r in result.rows:
        if last is not None and r.structure != last:
            lines.append("")
        last = r.structure
        status = r.status if r.status == OK else f"{r.status}: {r.note}"
        if r.status == OK and r.note:
            status += f" ({r.note})"
        if r.properties != "E+F+S":
            status += f" [{r.properties}]"
        lines.append(
            f"{r.label:{width}s} {r.structure:{swidth}s} {r.atoms:6d} "
            f"{_num(None if r.graph_s is None else 1e3 * r.graph_s, '.2f', 9)} "
            f"{_num(None if r.efs_s is None else 1e3 * r.efs_s, '.2f', 10)} {_num(r.atoms_per_s, '.1f', 10)} "
            f"{_num(r.time_ratio, '.2f', 8)} {_num(r.md_steps_per_s, '.2f', 10)} {_num(r.ns_per_day, '.4f', 8)} "
            f"{_num(r.md_ratio, '.2f', 8)} {_num(r.peak_memory_gb, '.2f', 8)}  {status}"
        )
    return "\n".join(lines)


def write_json(result: BenchResult, path: str | os.PathLike) -> Path:
    """All of ``result`` as JSON (seconds, GiB)."""
    return _write_json(path, result.to_dict())


CSV_FIELDS = [f.name for f in fields(BenchRow)] + ["graph_share"]


def write_csv(result: BenchResult, path: str | os.PathLike) -> Path:
    """One CSV line per row, columns :data:`CSV_FIELDS` (seconds, GiB)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in result.to_dict()["rows"]:
        writer.writerow({k: "" if row[k] is None else row[k] for k in CSV_FIELDS})
    return write_text(path, buffer.getvalue())


def plot(result: BenchResult, path: str | os.PathLike) -> Path:
    """Log-log PNG (or any format matplotlib writes, by extension): time per E+F+S call and
    graph time (left), time per MD step (right), against atoms."""
    from ..extras import require

    matplotlib = require("matplotlib", "plot", "matris bench --plot")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_call, ax_md) = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    largest: list[tuple[int, float]] = []
    for k, model in enumerate(m for m in result.models if m.status == OK):
        rows = sorted((r for r in result.rows if r.model == model.key and r.status == OK), key=lambda r: r.atoms)
        color = colors[k % len(colors)]
        calls = [(r.atoms, r.efs_s) for r in rows if r.efs_s]
        if calls:
            ax_call.plot(*zip(*calls), "o-", color=color, label=f"{model.label}: E+F+S")
            largest.append(calls[-1])
        graphs = [(r.atoms, r.graph_s) for r in rows if r.graph_s]
        if graphs:
            ax_call.plot(*zip(*graphs), "s--", color=color, alpha=0.7, markersize=4, label=f"{model.label}: graph")
        steps = [(r.atoms, 1 / r.md_steps_per_s) for r in rows if r.md_steps_per_s]
        if steps:
            ax_md.plot(*zip(*steps), "o-", color=color, label=model.label)
    atoms = sorted({r.atoms for r in result.rows})
    if largest and len(atoms) > 1:
        n0, t0 = max(largest)
        ax_call.plot(atoms, [t0 * n / n0 for n in atoms], ":", color="gray", label="∝ atoms")
    m = result.meta
    for ax, ylabel in ((ax_call, "time per call (s)"), (ax_md, "time per MD step (s)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("atoms")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax_call.set_title(f"energy + forces + stress ({m['device']}, {m['dtype']})", fontsize=10)
    ax_md.set_title(f"NVE MD, {m['timestep_fs']:g} fs steps", fontsize=10)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return Path(path)


__all__ = ["CSV_FIELDS", "format_table", "plot", "write_csv", "write_json"]
