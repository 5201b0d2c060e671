"""The documentation's figures, drawn from the committed result files like the tables.

    python -m benchmarks.figures OUTDIR            # every figure, as SVG files in OUTDIR
    python -m benchmarks.figures OUTDIR eos        # one of them

When the site is built, ``docs/hooks.py`` draws each figure of :data:`FIGURES` into the site
(``figures/NAME.svg``) and a page shows it with ``{{ figure("NAME") }}``, captioned with what
was measured, on which model and machine, and by which command (:func:`caption`). A figure
therefore shows exactly what its result files hold; to change it, rerun the command and
commit the JSON. The SVG output is deterministic (no date, fixed ids).
"""

from __future__ import annotations

import io
from pathlib import Path

from benchmarks import tables

COLORS = {"matris": "#3949ab", "matris2": "#7986cb", "official": "#e65100", "official2": "#ffb74d",
          "chgnet": "#2e7d32", "grey": "#757575"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "matris-docs", "svg.fonttype": "path", "font.size": 10,
                         "axes.grid": True, "grid.alpha": 0.3, "figure.facecolor": "white",
                         "axes.facecolor": "white", "savefig.facecolor": "white"})
    return plt


def _svg(fig) -> bytes:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return buf.getvalue()


# ---- one function per figure --------------------------------------------------------------

def speed_vs_size() -> bytes:
    """Time of one E+F+S call against atoms: the published architecture (this package, the
    official code, CHGNet) and the bundled model against CHGNet; log-log, with a line ∝ atoms."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.6), sharey=False)

    d = tables.load("cpu_speed")
    efs = [r for r in d["rows"] if r.get("kind") == "E+F+S"]
    b = tables.load("bench_demo_cpu")
    params = {m["key"]: m.get("parameters") for m in b["models"]}

    def k(n):
        return f"{n / 1e3:.0f}k" if n < 1e6 else f"{n / 1e6:.1f}M"

    def series(key):
        pts = sorted((r["atoms"], r["seconds"][key]) for r in efs if r.get("seconds", {}).get(key) is not None)
        return [p[0] for p in pts], [p[1] for p in pts]

    lines = [("fused", "this package", COLORS["matris"], "o-"),
             ("official", "official MatRIS 1.0.0, fastest setting", COLORS["official"], "s-"),
             ("official-ckpt", "official MatRIS 1.0.0, default", COLORS["official2"], "s--"),
             ("CHGNet", f"CHGNet 0.3.0 ({k(params['chgnet'])} parameters)", COLORS["chgnet"], "^-")]
    for key, label, color, style in lines:
        x, y = series(key)
        if x:
            left.plot(x, y, style, color=color, label=label)
    left.set_title(f"MatRIS-10M architecture ({k(d['official']['params'])} parameters)")

    rows = [r for r in b["rows"] if r.get("status") == "ok"]
    labels = {m["key"]: m["label"] for m in b["models"]}
    for model, color, style in (("matris", COLORS["matris"], "o-"), ("chgnet", COLORS["chgnet"], "^-")):
        pts = sorted((r["atoms"], r["efs_s"]) for r in rows if r["model"] == model)
        if pts:
            name = "matris-demo" if model == "matris" else labels.get(model, model)
            name += f" ({k(params[model])} parameters)"
            right.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=name)
    right.set_title("Models of the same size: matris-demo and CHGNet")

    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("atoms (diamond Si)")
        ax.set_ylabel("seconds per energy + forces + stress call")
        ys = [y for line in ax.get_lines() for y in line.get_ydata()]
        xs = [x for line in ax.get_lines() for x in line.get_xdata()]
        if xs:
            ref_x = [min(xs), max(xs)]
            ref_y0 = min(ys) * 0.6
            ax.plot(ref_x, [ref_y0, ref_y0 * ref_x[1] / ref_x[0]], ":", color=COLORS["grey"], lw=1,
                    label="∝ atoms (reference)")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.tight_layout()
    return _svg(fig)


def eos() -> bytes:
    """E(V) per atom of three crystals, relative to the fitted minimum, with the fit."""
    plt = _pyplot()
    d = tables.load("figures_demo_cpu")["eos"]
    fig, axes = plt.subplots(1, len(d), figsize=(10, 3.4))
    for ax, (name, e), color in zip(axes, d.items(), (COLORS["matris"], COLORS["official"], COLORS["chgnet"])):
        n = e["natoms"]
        e0 = e["e0_eV"] / n
        ax.plot([v / n for v in e["fit_volumes_A3"]], [(x / n - e0) * 1e3 for x in e["fit_energies_eV"]], "-",
                color=color, label="Birch–Murnaghan fit")
        ax.plot([v / n for v in e["volumes_A3"]], [(x / n - e0) * 1e3 for x in e["energies_eV"]], "o", color=color,
                label="computed")
        ax.axvline(e["v0_A3"] / n, color=COLORS["grey"], lw=0.8, ls=":")
        ax.set_title(f"{name}: V₀ = {e['v0_A3'] / n:.2f} Å³/atom, B = {e['bulk_modulus_GPa']:.0f} GPa", fontsize=9)
        ax.set_xlabel("volume (Å³/atom)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("E − E₀ (meV/atom)")
    fig.tight_layout()
    return _svg(fig)


def phonon_bands() -> bytes:
    """Phonon bands along the high-symmetry path, with the total DOS beside them."""
    plt = _pyplot()
    d = tables.load("figures_demo_cpu")["phonons"]
    fig, (bands, dos) = plt.subplots(1, 2, figsize=(8, 3.6), sharey=True, gridspec_kw={"width_ratios": [4, 1]})
    freqs = list(zip(*d["frequencies_THz"]))  # one list per branch
    for branch in freqs:
        bands.plot(d["distances"], branch, "-", color=COLORS["matris"], lw=1.2)
    for x in d["label_positions"]:
        bands.axvline(x, color=COLORS["grey"], lw=0.6)
    bands.axhline(0, color=COLORS["grey"], lw=0.6)
    bands.set_xticks(d["label_positions"])
    bands.set_xticklabels(["Γ" if s == "G" else s.replace("G", "Γ") for s in d["labels"]])
    bands.set_xlim(d["distances"][0], d["distances"][-1])
    bands.set_ylabel("frequency (THz)")
    bands.grid(False)
    bands.set_title(f"{d['structure']}; supercell {'×'.join(map(str, d['supercell']))}", fontsize=9)
    dos.plot(d["dos"], d["dos_frequencies_THz"], "-", color=COLORS["matris"], lw=1.2)
    dos.set_xlabel("DOS")
    dos.set_xticks([])
    dos.grid(False)
    fig.tight_layout()
    return _svg(fig)


def md_energy() -> bytes:
    """NVE: potential and total energy against time (float64), and the total energy's change
    in float64 and float32."""
    plt = _pyplot()
    d = tables.load("figures_demo_cpu")["md"]
    runs = d["runs"]
    fig, (top, bottom) = plt.subplots(1, 2, figsize=(10, 3.6))
    r = runs["float64"]
    top.plot(r["time_ps"], r["potential_meV_per_atom"], "-", color=COLORS["chgnet"], lw=1, label="potential energy")
    top.plot(r["time_ps"], r["total_meV_per_atom"], "-", color=COLORS["matris"], lw=1.5, label="total energy")
    top.set_xlabel("time (ps)")
    top.set_ylabel("energy − initial total (meV/atom)")
    top.set_title(f"{d['structure']}, NVE from {d['initial_temperature_K']:.0f} K, "
                  f"{d['timestep_fs']:g} fs steps, float64", fontsize=9)
    top.legend(fontsize=8)
    for dtype, color in (("float64", COLORS["matris"]), ("float32", COLORS["official"])):
        r = runs[dtype]
        bottom.plot(r["time_ps"], r["total_meV_per_atom"], "-", color=color, lw=1,
                    label=f"{dtype}: drift {r['drift_meV_per_atom_per_ps']:+.2g} meV/atom/ps")
    bottom.set_xlabel("time (ps)")
    bottom.set_ylabel("total energy − initial (meV/atom)")
    bottom.set_title("the total energy alone (note the scale)", fontsize=9)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    return _svg(fig)


def kappa_small() -> bytes:
    """The κ task's small case: κ at 300 K per structure in float64 and float32, and where each
    structure's time goes (relaxation, forces of the displaced supercells, phono3py)."""
    plt = _pyplot()
    d = tables.load("kappa_small_cpu")
    cases = list(dict.fromkeys(r["case"] for r in d["rows"]))
    row = {(r["case"], r["dtype"]): r for r in d["rows"]}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.38
    for k, (dtype, color) in enumerate((("float64", COLORS["matris"]), ("float32", COLORS["official"]))):
        xs = [i + (k - 0.5) * width for i in range(len(cases))]
        left.bar(xs, [row[(c, dtype)]["kappa_avg"] for c in cases], width, color=color, label=dtype)
    for i, c in enumerate(cases):
        diff = 100 * d["float32_relative_difference"][c]
        left.annotate(f"{diff:+.3f} %", (i, row[(c, "float64")]["kappa_avg"]), ha="center", va="bottom", fontsize=8,
                      xytext=(0, 3), textcoords="offset points")
    left.set_ylim(0, 1.15 * max(r["kappa_avg"] for r in d["rows"]))  # room for the labels
    left.set_xticks(range(len(cases)))
    left.set_xticklabels(cases)
    left.set_ylabel("κ at 300 K (W/m/K)")
    left.set_title("κ (float32 − float64 above the bars)", fontsize=9)
    left.legend(fontsize=8)
    labels = [f"{c}\n{dtype}" for c in cases for dtype in ("float64", "float32")]
    bottom = [0.0] * len(labels)
    for phase, color in (("relax", COLORS["matris"]), ("forces", COLORS["official"]), ("kappa", COLORS["chgnet"])):
        values = [row[(c, dtype)]["seconds"][phase] for c in cases for dtype in ("float64", "float32")]
        right.bar(range(len(labels)), values, 0.6, bottom=bottom, color=color, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    right.set_xticks(range(len(labels)))
    right.set_xticklabels(labels, fontsize=8)
    right.set_ylabel("seconds per structure")
    right.set_title("time per structure on this CPU", fontsize=9)
    right.legend(fontsize=8)
    fig.tight_layout()
    return _svg(fig)


def peers() -> bytes:
    """MatRIS-10M against the peer universal potentials (``benchmarks/peers.py``): time per E+F+S
    call and peak memory against atoms (diamond Si, log-log), and the combined score against the
    time per call of the largest Si cell, so the speed/accuracy trade-off shows."""
    plt = _pyplot()
    d = tables.load("peers_cpu")
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4))
    cmap = plt.get_cmap("tab10")
    si = sorted((k for k in d["structures"] if k.startswith("si")), key=lambda k: d["structures"][k]["n_atoms"])
    big = si[-1]
    for i, (key, row) in enumerate(d["models"].items()):
        if not row.get("params"):
            continue
        color = COLORS["matris"] if key == "ours" else (COLORS["matris2"] if key.startswith("ours") else cmap(i))
        style = "o-" if key.startswith("ours") else ".-"
        st = row["structures"]
        for ax, value in ((axes[0], lambda e: e.get("efs_seconds", {}).get("median")),
                          (axes[1], lambda e: e.get("peak_rss_gb"))):
            pts = [(d["structures"][k]["n_atoms"], value(st.get(k, {}))) for k in si]
            pts = [p for p in pts if p[1] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color,
                        label=tables.peer_name(row))
        t = st.get(big, {}).get("efs_seconds", {}).get("median")
        score = (row.get("score") or {}).get("CPS")
        if t is not None and score is not None and key != "ours-compile":
            axes[2].plot([t], [score], "o", color=color, ms=8 if key == "ours" else 6)
            axes[2].annotate(row["name"].split(" (")[0], (t, score), fontsize=7, xytext=(4, 3),
                             textcoords="offset points")
    n_big = d["structures"][big]["n_atoms"]
    for ax, ylabel in ((axes[0], "seconds per energy + forces + stress call"),
                       (axes[1], "peak resident memory (GB), fresh process")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("atoms (diamond Si)")
        ax.set_ylabel(ylabel)
    axes[2].set_xscale("log")
    axes[2].set_xlabel(f"seconds per E+F+S call, Si{n_big}")
    axes[2].set_ylabel("Matbench Discovery combined score (CPS)")
    axes[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(1.15, -0.14), ncol=4, frameon=False)
    fig.tight_layout()
    return _svg(fig)


# name → (drawing function, result files it reads, caption)
FIGURES = {
    "speed_vs_size": (speed_vs_size, ("cpu_speed", "bench_demo_cpu"),
                      "Time of one energy + forces + stress call against system size on the CPU, log-log. Left: "
                      "the architecture of the published 10M models (random weights: the speed does not depend on "
                      "them), in this package, in the official MatRIS 1.0.0 code and, for scale, CHGNet 0.3.0. "
                      "Right: the bundled matris-demo against CHGNet 0.3.0, two models of the same size."),
    "eos": (eos, ("figures_demo_cpu",),
            "Equations of state computed with `matris.simulate.equation_of_state` (11 volumes, ±6 %, "
            "positions relaxed) with the bundled model matris-demo, float32."),
    "phonon_bands": (phonon_bands, ("figures_demo_cpu",),
                     "Phonon bands and density of states of diamond Si from `matris.simulate.phonons` with the "
                     "bundled model matris-demo (finite displacements, phonopy), float32."),
    "md_energy": (md_energy, ("figures_demo_cpu",),
                  "NVE molecular dynamics with `matris.simulate.md` and the bundled model matris-demo: the potential "
                  "energy swings as heat moves between kinetic and potential energy while the total stays flat; "
                  "right, the total energy alone in float64 and float32."),
    "peers": (peers, ("peers_cpu",),
              "MatRIS-10M (this package) against the universal potentials users would pick instead, each at its "
              "published size, float32 on the CPU, through its own ASE calculator in its own environment. Left: time "
              "of one energy + forces + stress call; middle: peak resident memory of a fresh process making that "
              "call; right: Matbench Discovery's combined score (CPS, from the leaderboard) against the time per "
              "call on the largest cell. Random weights where the published ones download at run time."),
    "kappa_small": (kappa_small, ("kappa_small_cpu",),
                    "The κ task's protocol (`matris.discovery.kappa`) on diamond Si and rocksalt MgO with the bundled "
                    "model matris-demo: 2×2×2 primitive supercells, 11³ q-mesh, Wigner RTA at 300 K; left κ in "
                    "float64 and float32, right the time per structure by phase."),
}


def caption(name: str) -> str:
    """The figure's caption: what it shows, then where each number comes from."""
    if name not in FIGURES:
        raise KeyError(f"no figure {name!r}; known: {', '.join(FIGURES)}")
    _, sources, text = FIGURES[name]
    lines = [text]
    for source in sources:
        try:
            tables.result_path(source)
        except KeyError:
            continue
        lines.append(tables.provenance(source))
    return " ".join(lines)


def draw(name: str) -> bytes:
    """The SVG of figure ``name``."""
    if name not in FIGURES:
        raise KeyError(f"no figure {name!r}; known: {', '.join(FIGURES)}")
    return FIGURES[name][0]()


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("outdir", type=Path, help="folder of the SVG files")
    p.add_argument("names", nargs="*", metavar="NAME", help=f"figures to draw (default: all of {', '.join(FIGURES)})")
    args = p.parse_args(argv)
    unknown = sorted(set(args.names) - set(FIGURES))
    if unknown:
        p.error(f"unknown figure {', '.join(unknown)}; known: {', '.join(FIGURES)}")
    out, names = args.outdir, args.names or list(FIGURES)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = out / f"{name}.svg"
        path.write_bytes(draw(name))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
