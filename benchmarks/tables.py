"""Markdown tables from the committed result files, so no measured number is ever retyped.

    python -m benchmarks.tables                     # every table, as the documentation shows them
    python -m benchmarks.tables simulate_cpu        # one of them
    python -m benchmarks.tables cpu_speed/official  # one view of a result file (VIEWS)

The documentation site's performance page (and every other page that quotes a measurement)
is generated from these functions at build time by ``docs/hooks.py``: a page writes
``{{ table("simulate_cpu") }}`` or ``{{ value("nve_cpu", "drift", ".2g") }}`` and the build
fills it in from ``benchmarks/results/``. A result file that is missing or lacks a key fails
the build (``mkdocs build --strict`` runs in the test suite).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from benchmarks.common import ROOT, command_now

RESULTS = ROOT / "benchmarks" / "results"

# results kept outside benchmarks/results: name → path relative to the repository root
OTHER_RESULTS = {"distill_evaluation": "examples/distill/evaluation.json"}


def result_path(name: str) -> Path:
    """The file behind a result name (``"nve_cpu"`` → ``benchmarks/results/nve_cpu.json``)."""
    if name in OTHER_RESULTS:
        return ROOT / OTHER_RESULTS[name]
    path = RESULTS / (name if name.endswith(".json") else f"{name}.json")
    if not path.is_file():
        known = sorted(p.stem for p in RESULTS.glob("*.json")) + sorted(OTHER_RESULTS)
        raise KeyError(f"no result file {path.relative_to(ROOT)}; known results: {', '.join(known)}")
    return path


@lru_cache(maxsize=None)
def load(name: str):
    return json.loads(result_path(name).read_text())


def lookup(name: str, key: str):
    """A value by dotted path (``"rows.0.efs_s"``, ``"summary.speedup"``) in a result file."""
    node = load(name)
    for part in key.split("."):
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(f"{result_path(name).relative_to(ROOT)} has no key {key!r} (stuck at {part!r})")
    return node


def value(name: str, key: str, fmt: str = "") -> str:
    """One number from a result file, formatted (``fmt`` as in ``format(x, fmt)``; ``",.0f"``)."""
    return format(lookup(name, key), fmt)


def _meta(data) -> dict:
    if isinstance(data, dict):
        for key in ("meta", "provenance"):
            if isinstance(data.get(key), dict):
                return data[key]
    return {}


def machine(name: str) -> str | None:
    """The machine of a result file in words: the CPU's model and vector instruction set and the
    number of CPUs, as far as recorded (``"Intel(R) Xeon(R) Processor (AVX-512), 2 CPUs"``)."""
    import re

    data = load(name)
    meta = _meta(data)
    cpus = meta.get("cpus")
    if cpus is None and isinstance(meta.get("machine"), str):
        m = re.search(r"(\d+) CPUs", meta["machine"])
        cpus = int(m.group(1)) if m else None
    if cpus is None and isinstance(data, dict):
        cpus = data.get("cpus")
    cpu = meta.get("cpu") if isinstance(meta.get("cpu"), dict) else None
    if cpu:
        what = f"{cpu['model']} ({cpu['isa']})"
    elif meta.get("hardware") or meta.get("machine"):
        what = str(meta.get("hardware") or meta["machine"]).split(",")[0]
    else:
        return None
    return f"{what}, {cpus} CPUs" if cpus else what


def provenance(name: str, history: bool = False) -> str:
    """One line: file, command, model (and its sha256), machine and date, as far as recorded;
    with ``history`` also the commit the numbers were measured at (for the development page:
    the user pages leave it to the result file)."""
    meta = _meta(load(name))
    path = result_path(name).relative_to(ROOT)
    parts = [f"Source: `{path}`"]
    if meta.get("command"):
        parts.append(f"command `{command_now(meta['command'])}`")
    if history and meta.get("commit"):
        dirty = " (uncommitted changes)" if meta.get("dirty") else ""
        parts.append(f"commit `{meta['commit'][:10]}`{dirty}")
    if meta.get("model"):
        sha = f" (sha256 `{meta['model_sha256'][:12]}…`)" if meta.get("model_sha256") else ""
        parts.append(f"model {meta['model']}{sha}")
    where = machine(name)
    if where:
        parts.append(f"machine {where}")
    if meta.get("date"):
        parts.append(f"run {meta['date'][:10]}")
    if len(parts) == 1:
        parts.append("this older result records no command")
    return "; ".join(parts) + "."


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


# ---- one renderer per result file ---------------------------------------------------------

def bench(name: str) -> str:
    """``matris bench`` results: MatRIS against each compared model, one line per structure."""
    data = load(name)
    rows = [r for r in data["rows"] if r.get("status") == "ok"]
    ours = {r["structure"]: r for r in rows if r["model"] == "matris"}
    others = sorted({r["model"] for r in rows if r["model"] != "matris"})
    labels = {m["key"]: m["label"] for m in data["models"]}
    lines = []
    for other in others or [None]:
        head = "| structure | MatRIS E+F+S | MatRIS graph"
        sep = "|---|---:|---:"
        if other:
            head += f" | {labels[other]} E+F+S | {other} ÷ MatRIS | MD steps/s (MatRIS / {other})" \
                    f" | peak RSS GiB (MatRIS / {other})"
            sep += "|---:|---:|---:|---:"
        else:
            head += " | MD steps/s | peak RSS GiB"
            sep += "|---:|---:"
        lines += [head + " |", sep + "|"]
        for structure, r in ours.items():
            cells = [structure, _ms(r["efs_s"]), f"{r['graph_s'] * 1e3:.1f} ms"]
            o = next((x for x in rows if x["model"] == other and x["structure"] == structure), None) if other else None
            if other and o:
                cells += [_ms(o["efs_s"]), f"{o['time_ratio']:.2f}",
                          f"{r['md_steps_per_s']:.3g} / {o['md_steps_per_s']:.3g}",
                          f"{r['peak_memory_gb']:.2f} / {o['peak_memory_gb']:.2f}"]
            elif other:
                cells += ["–"] * 4
            else:
                cells += [f"{r['md_steps_per_s']:.3g}", f"{r['peak_memory_gb']:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    meta = data["meta"]
    lines.append(f"\n{meta['device']}, {meta['threads']} threads, {meta['dtype']}, median of {meta['repeat']} "
                 f"calls after a warm-up; MD: {meta['md_steps']} velocity-Verlet steps of {meta['timestep_fs']:g} fs. "
                 f"Load average {meta.get('load_average_start', '–')} at the start.")
    return "\n".join(lines)


def cpu_speed(name: str = "cpu_speed") -> str:
    from benchmarks.cpu_speed import markdown

    return markdown(str(result_path(name)), command=False)  # the provenance line gives command and commit


def kappa_small(name: str = "kappa_small_cpu") -> str:
    from benchmarks.kappa_small import table as kappa_table

    d = load(name)
    diffs = ", ".join(f"{case} {100 * v:+.3f} %" for case, v in d["float32_relative_difference"].items())
    return (kappa_table(d["rows"]) + f"\n\nq-mesh {d['mesh']}³, supercells {d['supercells']}; "
            f"float32 − float64, relative to κ: {diffs}.")


def train_memory(name: str = "train_memory") -> str:
    from benchmarks.train_memory import gpu_sizes, gpu_table
    from benchmarks.train_memory import table as memory_table

    d = load(name)
    text = memory_table(d["rows"], live=True) + (
        f"\n\nCPU: {d['meta']['cpu']['model']} ({d['meta']['cpu']['isa']}); peak memory: the peak resident set "
        "size of each row's process; memory model: `matris.memory.training_fixed_bytes` (without EMA) plus "
        "`training_bytes` of this version of the code." if d["meta"].get("cpu") else "")
    text += ("\n\nWhat the memory model implies for GPUs (float32, AdamW + EMA; angles of MgO-like cells per "
             "batch, and how many 64-atom MgO cells that is):\n\n" + gpu_table(gpu_sizes()))
    timed = {r["mode"]: r for r in d["rows"] if r["case"] == "mgo64" and r.get("breakdown_seconds")
             and r["mode"] in ("blocks", "rows")}
    if timed:  # --breakdown: where the step's time goes
        modes = list(timed)
        keys = sorted({k for r in timed.values() for k in r["breakdown_seconds"]}, key=lambda k: (k == "rest", k))
        text += ("\n\nWhere a step's time goes (MgO64, seconds per step; each kind of recomputation node without "
                 "the nodes it runs inside it):\n\n| part | " + " | ".join(f"`{m}`" for m in modes) + " |\n|---|"
                 + "---:|" * len(modes) + "\n" + "\n".join(
                     f"| {k} | " + " | ".join(f"{timed[m]['breakdown_seconds'][k]:.1f}" if k in
                                              timed[m]["breakdown_seconds"] else "–" for m in modes) + " |"
                     for k in keys)
                 + "\n| step | " + " | ".join(f"{timed[m]['step_seconds']:.1f}" for m in modes) + " |")
    return text


def simulate(name: str = "simulate_cpu") -> str:
    d = load(name)
    lines = ["| path | time | structures/s | converged | mean steps |", "|---|---:|---:|---:|---:|"]
    for path, r in d["rows"].items():
        steps = "–" if r["mean_steps"] is None else f"{r['mean_steps']:.1f}"
        lines.append(f"| {path} | {r['s']:.1f} s | {r['structures_per_s']:.2f} | {r['converged']}/{d['structures']} "
                     f"| {steps} |")
    lines.append(f"\n{d['structures']} rattled Si{d['atoms_each']} cells, fmax {d['fmax']} eV/Å, {d['device']}, "
                 f"{d['threads']} threads, {d['dtype']}: the batch is **{d['speedup']:.1f}× faster**; final energies "
                 f"of the two paths differ by at most {d['max_energy_difference_meV_per_atom']:.2f} meV/atom.")
    return "\n".join(lines)


def nve(name: str = "nve_cpu") -> str:
    d = load(name)
    rows = [
        ("system", f"Si{d['atoms']}, a = {d['lattice_A']} Å, {d['dtype']}, {d['device']}"),
        ("run", f"{d['steps']} steps of {d['timestep_fs']} fs = {d['time_ps']} ps, "
                f"from {d['initial_temperature_K']:.0f} K (mean {d['mean_temperature_K']:.0f} K)"),
        ("total-energy drift", f"**{d['drift']:.2g} meV/atom/ps**"),
        ("energy band (max − min)", f"{d['span']:.2g} meV/atom"),
        ("largest step-to-step change", f"{d['max_smooth_step']:.2g} meV/atom"),
        ("steps with a pair crossing r_c or r_3", f"{d['crossings']}"),
        ("speed", f"{d['steps_per_s']:.2f} steps/s ({d['ns_per_day']:.2f} ns/day)"),
    ]
    return "| quantity | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def physics_checks(name: str = "physics_checks_cpu") -> str:
    d = load(name)
    n, r = d["nvt_langevin_si8_300K"], d["relax_strained_si8"]
    return "\n".join([
        "| check | set-up | measured |", "|---|---|---|",
        f"| NVT Langevin | Si{n['atoms']}, {n['target_K']:.0f} K, {n['steps']} × {n['timestep_fs']} fs, "
        f"friction {n['friction_per_fs']}/fs | mean T {n['mean_temperature_K']:.0f} ± {n['standard_error_K']:.0f} K |",
        f"| relaxation | Si{r['atoms']} strained 3 %, rattled | energy −{r['energy_drop_eV']:.2f} eV in {r['steps']} "
        f"steps, fmax {r['fmax_eV_A']:.3f} eV/Å, stress × V/N {r['stress_times_volume_per_atom_eV']:.3f} eV |",
    ])


def memory_levels(name: str = "memory_levels_cpu") -> str:
    d = load(name)
    rows = d["rows"]
    lines = ["| level | blocks | atoms | angles | measured peak | estimate |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        peak = "not run" if r["measured_peak_GB"] is None else f"{r['measured_peak_GB']:.1f} GB"
        lines.append(f"| {r['level']} | {r['blocks']} | {r['atoms']:,} | {r['angles']:,} | {peak} | "
                     f"{r['estimate_GB']:.1f} GB |")
    extra = ", ".join(f"level {k}: {v:.1f} GB" for k, v in d["per_further_block_GB"].items())
    lines.append(f"\nEach further block adds {extra}.")
    return "\n".join(lines)


def fusion_memory(name: str = "fusion_memory") -> str:
    d = load(name)
    ref, fused = d["reference"], d["fused"]
    rows = [("edge-sized bytes written by the forward", "edge_bytes_written"),
            ("activation bytes saved for the backward", "saved_bytes_excluding_weights_and_inputs")]
    lines = ["| one gated Φ of the line graph | reference | fused | ratio |", "|---|---:|---:|---:|"]
    for label, key in rows:
        lines.append(f"| {label} | {ref[key]:,} | {fused[key]:,} | {ref[key] / fused[key]:.2f}× |")
    return "\n".join(lines)


def kernel_resources(name: str = "kernel_resources_sm90") -> str:
    lines = ["| kernel specialisation | warps | registers/thread | spilled stores / loads |", "|---|---:|---:|---:|"]
    for r in load(name):
        lines.append(f"| `{r['kernel']}` | {r['warps']} | {r['registers']} | "
                     f"{r['spill_stores']} / {r['spill_loads']} |")
    return "\n".join(lines)


def train_throughput(name: str = "train_throughput_cpu") -> str:
    d = load(name)
    return "\n".join([
        "| config | parameters | batch | atoms / angles per structure | step | structures/s | atoms/s | in the model |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {Path(d['config']).name} | {d['parameters']:,} | {d['batch_structures']} | {d['mean_atoms']:.1f} / "
        f"{d['mean_angles']:,.0f} | {d['ms_per_step'] / 1e3:.2f} s | **{d['structures_per_s']:.1f}** | "
        f"{d['atoms_per_s']:.0f} | {100 * d['model_share']:.0f} % |",
        f"\n{d['steps']} steps, precision {d['precision']}, {d['device']}.",
    ])


def data_throughput(name: str = "data_throughput_cpu") -> str:
    d = load(name)
    s = d["summary"]
    lines = ["| graph-cache build | structures | seconds | structures/s |", "|---|---:|---:|---:|"]
    for r in d["build"]:
        lines.append(f"| {r['workers']} worker{'s' if r['workers'] > 1 else ''} | {r['structures']:,} | "
                     f"{r['seconds']:.1f} | {r['structures_per_s']:.0f} |")
    lines += ["", "| loader | batches | structures/s |", "|---|---:|---:|"]
    for r in d["loader"]:
        where = "in the training process" if r["loader_workers"] == 0 else f"{r['loader_workers']} DataLoader workers"
        lines.append(f"| {where} | {r['batches']} | {r['structures_per_s']:.0f} |")
    m = d["model_10m"]
    lines += [
        "",
        f"- build scaling efficiency with 2 workers: {100 * s['build_scaling_efficiency']:.0f} %; "
        f"OMat24 (~100 M structures) at 32 workers: about {s['omat24_build_hours_32_workers']:.1f} h (extrapolated);",
        f"- loader: {s['loader_structures_per_s_per_worker']:.0f} structures/s per worker, "
        f"{s['loader_structures_per_s_8_workers_extrapolated']:,.0f} with 8 workers (extrapolated);",
        f"- one training step of the 10M model costs {m['flops_per_structure'] / 1e9:.0f} GFLOP per structure, so an "
        f"H200 at its TF32 peak could consume at most {s['gpu_structures_per_s_upper_bound_tf32_peak']:,.0f} "
        f"structures/s: 8 loader workers leave a margin of {s['margin_8_workers_vs_tf32_peak_bound']:.1f}× "
        f"({s['margin_8_workers_vs_fp32_peak_bound']:.1f}× at the FP32 peak).",
    ]
    return "\n".join(lines)


def cache_build(name: str = "cache_build_cpu") -> str:
    lines = ["| stored | structures | atoms each | seconds | structures/s | kB per structure |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in load(name)["rows"]:
        what = "bonds and angles" if r["store_angles"] else "bonds only"
        lines.append(f"| {what} | {r['structures']:,} | {r['atoms_per_structure']} | {r['seconds']:.1f} | "
                     f"{r['structures_per_s']:.0f} | {r['kB_per_structure']:.1f} |")
    return "\n".join(lines)


def compile_check(name: str = "compile_check_cpu") -> str:
    lines = ["| dtype | backend | steps | graphs | graph breaks | first call | later calls (median) | "
             "max rel. error vs eager |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in load(name)["rows"]:
        lines.append(f"| {r['dtype']} | {r['backend']} | {r['steps']} | {r['graphs']} | {r['graph_breaks']} | "
                     f"{r['first_call_s']:.0f} s | {r['later_calls_median_s'] * 1e3:.0f} ms | "
                     f"{r['max_rel_error_vs_eager']:.2g} |")
    return "\n".join(lines)


def speed(name: str = "speed_cpu") -> str:
    d = load(name)
    lines = [f"10-block width-128 architecture ({d['meta']['parameters']:,} parameters), {d['meta']['dtype']}, "
             f"{d['meta']['device']}, {d['meta']['threads']} threads.", "",
             "| structure | bonds | angles | graph | E+F+S | memory level | peak RSS |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        lines.append(f"| {r['structure']} | {r['directed_edges']:,} | {r['angles']:,} | {r['graph_ms']:.1f} ms | "
                     f"{_ms(r['efs_ms'] / 1e3)} | {r['checkpoint_level']} | {r['peak_rss_gb']:.1f} GB |")
    return "\n".join(lines)


def distill_evaluation(name: str = "distill_evaluation") -> str:
    d = load(name)
    h = d["held_out"]
    lines = [f"Held-out set: {h['structures']} structures, {h['atoms']:,} atoms, from prototype families "
             "that share nothing with training.", "",
             "| prototype | structures | energy (meV/atom) | forces (meV/Å) | stress (GPa) |",
             "|---|---:|---:|---:|---:|",
             f"| **all** | {h['structures']} | **{h['energy_mae_meV_atom']:.0f}** | **{h['force_mae_meV_A']:.0f}** | "
             f"{h['stress_mae_GPa']:.2f} |"]
    for proto, r in sorted(h["by_prototype"].items()):
        lines.append(f"| {proto} | {r['structures']} | {r['energy_mae_meV_atom']:.0f} | {r['force_mae_meV_A']:.0f} | "
                     f"{r['stress_mae_GPa']:.2f} |")
    lines += ["", "| lattice constant | teacher (CHGNet 0.3.0) | matris-demo | difference |", "|---|---:|---:|---:|"]
    for crystal, r in d["lattice_constants_A"].items():
        lines.append(f"| {crystal} | {r['teacher']:.3f} Å | {r['model']:.3f} Å | "
                     f"{100 * (r['model'] / r['teacher'] - 1):+.2f} % |")
    return "\n".join(lines)


def parity(name: str = "parity") -> str:
    """Largest error per fixture folder against the reference implementation's outputs."""
    rows = load(name)["rows"]
    lines = ["| fixture folder | structures | max \\|ΔE\\|/atom (eV) | max \\|ΔF\\| (eV/Å) | max \\|Δσ\\| (GPa) | "
             "max \\|Δm\\| (μB) | edge and angle counts |", "|---|---:|---:|---:|---:|---:|---|"]
    for folder in sorted({r["folder"] for r in rows}):
        group = [r for r in rows if r["folder"] == folder]
        counts = all(r["edges"][0] == r["edges"][1] and r["angles"][0] == r["angles"][1] for r in group)
        cells = [f"{max(r[k] for r in group):.1e}" for k in ("energy_per_atom", "forces", "stress", "magmoms")]
        lines.append(f"| `{folder}` | {len(group)} | " + " | ".join(cells) + f" | {'equal' if counts else 'DIFFER'} |")
    return "\n".join(lines)


def lammps(name: str = "lammps_cpu") -> str:
    """pair_style matris: the runs of the scaling benchmark (per-rank pair time, working memory and
    bytes exchanged against the prediction), the ratios to one rank, and the NVE drift."""
    d = load(name)
    lines = []
    sc = d.get("scaling")
    if sc:
        mib = 2**20
        lines += ["| atoms | ranks | mode | pair time (s/step, slowest rank) | atoms / ghosts per rank | "
                  "working memory per rank (MiB) | exchanged per rank (MiB/step; predicted) |",
                  "|---:|---:|---|---:|---|---:|---|"]
        for r in sc["runs"]:
            ranks = r.get("per_rank", [])
            who = " · ".join(f"{x['atoms']:,} / {x['ghosts']:,}" for x in ranks) or "whole cell on rank 0"
            mem = " · ".join(f"{x['working_bytes'] / mib:.0f}" for x in ranks) or "–"
            ex = " · ".join(f"{x['bytes_per_step'] / mib:.1f} ({x['predicted_bytes_per_step'] / mib:.1f})"
                            for x in ranks) or "–"
            lines.append(f"| {r['atoms']:,} | {r['ranks']} | {r['mode']} | {r['pair_s_per_step']['max']:.3f} | "
                         f"{who} | {mem} | {ex} |")
        lines += ["", "| scaling | ranks | pair time vs 1 rank (domain) | working memory vs 1 rank | "
                      "pair time vs 1 rank (whole cell) |", "|---|---:|---:|---:|---:|"]
        for r in sc["strong"]:
            lines.append(f"| strong, {r['atoms']:,} atoms | {r['ranks']} | {r['pair_time_vs_1_rank']:.2f} | "
                         f"{r['working_memory_vs_1_rank']:.2f} | {r['pair_time_vs_gather']:.2f} |")
        for r in sc["weak"]:
            lines.append(f"| weak, {r['atoms_per_rank']:,} atoms per rank | {r['ranks']} | efficiency "
                         f"{r['efficiency']:.2f} | – | – |")
        lines.append(f"\n{d['device']}, {d['dtype']}, one model thread per rank, {d['cpus']} cores; 1 fs steps.")
    if d.get("nve"):
        v = d["nve"]
        lines += ["",
                  "| NVE, Si64, 300 K, 0.5 fs, 1 ps, float64 | total-energy drift (meV/atom/ps) | band (meV/atom) |",
                  "|---|---:|---:|",
                  f"| LAMMPS `fix nve` | {v['drift_meV_atom_ps']:.2g} | {v['span_meV_atom']:.2g} |"]
        if "ase_drift_meV_atom_ps" in v:
            lines.append(f"| ASE velocity Verlet (`benchmarks/nve.py`) | {v['ase_drift_meV_atom_ps']:.2g} | "
                         f"{v['ase_span_meV_atom']:.2g} |")
    return "\n".join(lines)


def lammps_exactness(name: str = "lammps_exactness") -> str:
    """pair_style matris (mode domain) on 1 to 8 ranks against the ASE calculator, float64."""
    d = load(name)
    lines = ["| MPI ranks | energy (relative) | per-atom energies (eV) | forces (eV/Å) | virial (relative) |",
             "|---|---:|---:|---:|---:|"]
    for r in d["rows"]:
        who = f"{r['ranks']}" + (f", {r['left_out']} left out" if r.get("left_out") else "")
        lines.append(f"| {who} | {r['energy_rel']:.1e} | {r['atomic_energy_max']:.1e} | {r['force_max']:.1e} | "
                     f"{r['virial_rel']:.1e} |")
    return "\n".join(lines)


# ---- views for the user pages: one question per table, every column visible ---------------

def _cpu_line(name: str, threads=None) -> str:
    where = machine(name) or "CPU"
    t = threads if threads is not None else load(name).get("threads")
    return f"{where}{f', {t} threads' if t else ''}"


def _rows(name: str, kind: str = "E+F+S") -> list:
    return [r for r in load(name)["rows"] if r.get("kind") == kind]


def _x(a: float, b: float) -> str:
    return f"{a / b:.1f}×"


def _s(seconds: float) -> str:
    return f"{seconds:.3g} s"


PUBLISHED_ARCH = "MatRIS-10M architecture (that of matris-10m-oam, -mp and -omat), random weights, float32"


def _cpu_caption(name: str, d: dict, model: str = PUBLISHED_ARCH, isa: bool = False) -> str:
    """The line above a CPU table: model, machine (with the fused kernels' instruction set), rounds."""
    built = (d.get("native") or {}).get("instruction_set") if isa else None
    return (f"**Model:** {model}. **Machine:** {_cpu_line(name)}{f'; fused kernels built for {built}' if built else ''}"
            f". Median of {d['rounds']} interleaved rounds.")


def _cpu_pair(name: str, model: str, header: str, other: str, ratio) -> str:
    """Rows of the default (fused) time against ``seconds[other]`` with ``ratio(fused, other)``."""
    d = load(name)
    lines = [_cpu_caption(name, d, model, isa=True), "", header, "|---|---|---:|---:|---:|"]
    for r in d["rows"]:
        t = r["seconds"]
        if t.get(other) is not None:
            lines.append(f"| {r['structure']} | {r['kind']} | {_s(t['fused'])} | {_s(t[other])} | "
                         f"{ratio(t['fused'], t[other])} |")
    return "\n".join(lines)


def cpu_plain(name: str = "cpu_speed") -> str:
    """The published architecture alone: time per call and per MD step with the default kernels."""
    d = load(name)
    lines = [_cpu_caption(name, d), "",
             "| structure | call | time | atoms per second |", "|---|---|---:|---:|"]
    for r in d["rows"]:
        t = r["seconds"].get("fused")
        if t is not None:
            lines.append(f"| {r['structure']} | {r['kind']} | {_s(t)} | {r['atoms'] / t:,.0f} |")
    return "\n".join(lines)


def cpu_official(name: str = "cpu_speed") -> str:
    """The published architecture: this package against the official MatRIS code, same weights."""
    d = load(name)
    lines = [_cpu_caption(name, d), "",
             "| structure | this package | official, fastest setting | slower by | official, default | slower by |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in _rows(name):
        t = r["seconds"]
        if t.get("official") is None:
            continue
        lines.append(f"| {r['structure']} | {_s(t['fused'])} | {_s(t['official'])} | {_x(t['official'], t['fused'])} "
                     f"| {_s(t['official-ckpt'])} | {_x(t['official-ckpt'], t['fused'])} |")
    info = d.get("official") or {}
    lines.append(f"\nOfficial: MatRIS {info.get('matris', '1.0.0')} on the same weights, each call timed in its own "
                 "process; fastest setting `mode=\"torch\"`, `activation_checkpoint=False`; default: with activation "
                 "checkpointing. \"Slower by\": its time ÷ this package's.")
    return "\n".join(lines)


def cpu_chgnet(name: str = "cpu_speed") -> str:
    """The published architecture against CHGNet 0.3.0, per call and per MD step."""
    return _cpu_pair(name, f"{PUBLISHED_ARCH}; CHGNet 0.3.0 with its own weights",
                     "| structure | call | MatRIS-10M | CHGNet 0.3.0 | MatRIS-10M ÷ CHGNet |", "CHGNet", _x)


def cpu_fallback(name: str = "cpu_speed") -> str:
    """The fused C++ kernels against the PyTorch reference ops (what runs without a compiler)."""
    return _cpu_pair(name, PUBLISHED_ARCH,
                     "| structure | call | fused C++ kernels (default) | PyTorch ops (no compiler) | speed-up |",
                     "torch", lambda fused, torch_ops: _x(torch_ops, fused))


def cpu_compiled(name: str = "cpu_speed_compiled") -> str:
    """Eager against ``model.compile()``, and what the compilation costs."""
    d = load(name)
    lines = [_cpu_caption(name, d), "",
             "| structure | eager (default) | `model.compile()` | speed-up |", "|---|---:|---:|---:|"]
    for r in _rows(name):
        t = r["seconds"]
        if t.get("compiled") is None:
            continue
        lines.append(f"| {r['structure']} | {_s(t['fused'])} | {_s(t['compiled'])} | {_x(t['fused'], t['compiled'])} |")
    first = (d.get("compile_seconds") or {}).get("compiled")
    if first:
        lines.append(f"\nThe first call compiles: {first:.0f} s here, paid once per process and cell-size regime.")
    return "\n".join(lines)


def system_size(name: str = "system_size_cpu") -> str:
    """Peak memory (and time) of one E+F+S call against the size of the cell: at the level the model
    picks, and at each fixed level measured (2, and 3: the least memory)."""
    d = load(name)
    rows = {(r["atoms"], r["requested_level"]): r for r in d["rows"]}
    fixed = sorted({lv for _, lv in rows if lv not in ("auto", "graph")})
    lines = [f"**Model:** {PUBLISHED_ARCH} ({d['parameters']:,} parameters). **Machine:** "
             f"{_cpu_line(name, d['rows'][0].get('threads'))}. One call per process, after a warm-up call.", "",
             "| structure | angles | level picked | peak memory, time |"
             + "".join(f" at level {lv} |" for lv in fixed), "|---|---:|---:|---:|" + "---:|" * len(fixed)]
    for (atoms, level), r in sorted(rows.items()):
        if level != "auto":
            continue
        cells = "".join(f" {rows[(atoms, lv)]['peak_rss_GB']:.1f} GB, {rows[(atoms, lv)]['efs_s']:.1f} s |"
                        if "efs_s" in rows.get((atoms, lv), {}) else " – |" for lv in fixed)
        lines.append(f"| Si{atoms} | {r['angles']:,} | {r['level']} | {r['peak_rss_GB']:.1f} GB, {r['efs_s']:.1f} s |"
                     + cells)
    lines.append("\n–: not run, its estimate exceeding the memory the machine had. "
                 "Level picked: by the model, for the memory the machine above had free "
                 "([Large systems and memory](memory.md)). Peak memory: the whole process's peak resident set "
                 "size (Python, torch, the model and the call).")
    return "\n".join(lines)


def system_levels(name: str = "system_size_cpu") -> str:
    """Per memory level: bytes per angle above the process's base, and time against level 0."""
    d = load(name)
    lines = ["| level | bytes per angle (cell) | time ÷ level 0 (cell) |", "|---:|---:|---:|"]
    for level, r in sorted(d["summary"].items()):
        ratio = r.get("vs_level0")
        time = f"{ratio['time_ratio']:.2f} (Si{ratio['atoms']})" if ratio else "–"
        lines.append(f"| {level} | {r['bytes_per_angle']:,.0f} (Si{r['atoms']}) | {time} |")
    lines.append("\nBytes per angle: the call's peak resident memory above the process's peak after a warm-up "
                 "call, divided by the cell's angles, on the largest cell each level ran. Time: one call each, one "
                 "after the other in fresh processes.")
    return "\n".join(lines)


def system_fit(name: str = "system_size_cpu", sizes=(24, 48, 80, 141)) -> str:
    """How many atoms fit, from the straight line through the lowest level's rows."""
    d = load(name)
    fit = d["lowest_fit"]
    lowest = str(fit["level"])
    least = [r for r in d["rows"] if r["requested_level"] == lowest and "efs_s" in r]
    big = max(least, key=lambda r: r["atoms"])
    per_atom = big["angles"] / big["atoms"]
    # Si from the largest measured cell; the oxides' angles per atom from the file
    kinds = {"diamond Si": per_atom, **{k: a for k, a in d.get("angles_per_atom", {}).items() if "Si" not in k}}
    lines = [f"**Model:** {PUBLISHED_ARCH}, memory level {lowest} (the least memory). **Machine:** "
             f"{_cpu_line(name, big.get('threads'))}.", "",
             "| memory | angles |" + "".join(f" {k} atoms |" for k in kinds), "|---:|---:|" + "---:|" * len(kinds)]
    for gb in sizes:
        angles = (gb - fit["GB_fixed"]) / fit["GB_per_angle"]
        lines.append(f"| {gb} GB | {angles / 1e6:.1f} million |"
                     + "".join(f" {angles / a:,.0f} |" for a in kinds.values()))
    measured = ", ".join(f"Si{r['atoms']} {r['peak_rss_GB']:.1f} GB" for r in least)
    lines.append(f"\nA straight line through the measured level-{lowest} peaks ({measured}): "
                 f"{fit['GB_fixed']:.1f} GB fixed plus {fit['GB_per_angle'] * 1e6:.0f} GB per million angles. "
                 f"Diamond Si has {per_atom:.0f} angles per atom at r_3 = 4.5 Å; denser materials have more "
                 "(" + ", ".join(f"{k} {a:.0f}" for k, a in kinds.items() if k != "diamond Si")
                 + "; the line was measured on Si, whose bonds per angle are close to theirs), so count your "
                 "cell's angles (`GraphBatch.num_angles`) and divide. "
                 "Beyond the largest measured cell this is an extrapolation.")
    graphs = [r for r in d["rows"] if r["requested_level"] == "graph"]
    if graphs:
        g = max(graphs, key=lambda r: r["atoms"])
        per_angle = g["peak_above_start_GB"] / g["angles"]
        lines.append(f"\nBuilding the graph (neighbour list and line graph) is not what limits the size: for Si"
                     f"{g['atoms']:,} ({g['angles'] / 1e6:.1f} million angles) it peaks at "
                     f"{g['peak_above_start_GB']:.1f} GB above the process's start ({per_angle * 1e9:.0f} bytes "
                     f"per angle, {fit['GB_per_angle'] / per_angle:.0f} times less than the model's level "
                     f"{lowest}) and takes {g['build_s']:.1f} s.")
    return "\n".join(lines)


def bench_time(name: str = "bench_demo_cpu") -> str:
    """``matris bench``: time per E+F+S call, MatRIS against each compared model."""
    d = load(name)
    rows = [r for r in d["rows"] if r.get("status") == "ok"]
    models = {m["key"]: m for m in d["models"]}
    ours = {r["structure"]: r for r in rows if r["model"] == "matris"}
    others = sorted({r["model"] for r in rows if r["model"] != "matris"})
    meta = d["meta"]
    lines = [f"**Models:** {models['matris']['label']}, {models['matris']['parameters']:,} parameters"
             + "".join(f"; {models[o]['label']}, {models[o]['parameters']:,} parameters" for o in others)
             + f"; {meta['dtype']}. **Machine:** {machine(name)}, {meta['threads']} threads. Median of "
               f"{meta['repeat']} calls after a warm-up.", ""]
    for other in others:
        short = models[other]["label"].split(" (")[0]
        lines += [f"| structure | MatRIS E+F+S | {models[other]['label']} E+F+S | {short} ÷ MatRIS |",
                  "|---|---:|---:|---:|"]
        for structure, r in ours.items():
            o = next((x for x in rows if x["model"] == other and x["structure"] == structure), None)
            if o:
                lines.append(f"| {structure} | {_ms(r['efs_s'])} | {_ms(o['efs_s'])} | {o['time_ratio']:.2f} |")
    return "\n".join(lines)


def bench_md(name: str = "bench_demo_cpu") -> str:
    """``matris bench``: MD steps per second and peak memory, MatRIS against each compared model."""
    d = load(name)
    rows = [r for r in d["rows"] if r.get("status") == "ok"]
    ours = {r["structure"]: r for r in rows if r["model"] == "matris"}
    others = sorted({r["model"] for r in rows if r["model"] != "matris"})
    meta = d["meta"]
    labels = {m["key"]: m["label"].split(" (")[0] for m in d["models"]}
    lines = [f"Same models and machine; MD: {meta['md_steps']} NVE velocity-Verlet steps of "
             f"{meta['timestep_fs']:g} fs; memory: the process's peak resident set size.", ""]
    for other in others:
        lines += [f"| structure | MD steps/s, MatRIS | MD steps/s, {labels[other]} | peak GiB, MatRIS | "
                  f"peak GiB, {labels[other]} |",
                  "|---|---:|---:|---:|---:|"]
        for structure, r in ours.items():
            o = next((x for x in rows if x["model"] == other and x["structure"] == structure), None)
            if o:
                lines.append(f"| {structure} | {r['md_steps_per_s']:.3g} | {o['md_steps_per_s']:.3g} | "
                             f"{r['peak_memory_gb']:.2f} | {o['peak_memory_gb']:.2f} |")
    return "\n".join(lines)


def train_throughput_short(name: str = "train_throughput_cpu") -> str:
    d = load(name)
    return "\n".join([
        f"**Model:** `{Path(d['config']).name}` ({d['parameters']:,} parameters), precision {d['precision']}. "
        f"**Machine:** the development machine's CPU ({d['device']}; this older result records no more), "
        f"{d['steps']} steps.", "",
        "| batch | atoms / angles per structure | time per step | structures/s | atoms/s |",
        "|---:|---:|---:|---:|---:|",
        f"| {d['batch_structures']} | {d['mean_atoms']:.1f} / {d['mean_angles']:,.0f} | {d['ms_per_step'] / 1e3:.2f} s "
        f"| **{d['structures_per_s']:.1f}** | {d['atoms_per_s']:.0f} |",
        f"\n{100 * d['model_share']:.0f} % of the step is spent in the model (the rest: data, loss, optimizer).",
    ])


def compile_short(name: str = "compile_check_cpu") -> str:
    d = load(name)
    lines = [f"**Model:** the small test fixture ({d['meta'].get('model', '')}), 20 MD-like steps of 8 to 48 atoms, "
             f"`fullgraph=True`. **Machine:** {machine(name)}.", "",
             "| dtype | graphs | graph breaks | first call | later calls | max rel. error |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        lines.append(f"| {r['dtype']} | {r['graphs']} | {r['graph_breaks']} | {r['first_call_s']:.0f} s | "
                     f"{r['later_calls_median_s'] * 1e3:.0f} ms | {r['max_rel_error_vs_eager']:.2g} |")
    lines.append("\nFirst call: compilation included, with Inductor's on-disk cache warm; later calls: median; "
                 "error: largest relative difference from eager.")
    return "\n".join(lines)


def _peer_rows(d: dict):
    """(key, row) of a peers result file, ours first as run."""
    return list(d["models"].items())


def _skeys(d: dict) -> list[str]:
    return list(d["structures"])


def _label(d: dict, skey: str) -> str:
    """``si512`` → ``Si512``, ``srtio3_135`` → ``SrTiO3 (135)``."""
    n = d["structures"][skey]["n_atoms"]
    prefix = skey.split("_")[0]
    return f"Si{n}" if prefix.startswith("si") else f"{ {'srtio3': 'SrTiO3'}.get(prefix, prefix)} ({n})"


def _peers_caption(name: str, d: dict) -> str:
    m = d["meta"]
    return (f"**Machine:** {_cpu_line(name, m['threads'])}, {m['dtype']}; its float32 GEMM rate "
            f"{m['gemm']['gflops_1024cubed']:.0f} GFLOP/s (1,024³ `mm`). Medians of {m['rounds']} interleaved "
            "rounds; models whose processes fit in memory together ran side by side.")


def peer_name(row: dict) -> str:
    """The model's name, with the options it ran with (``compile=True``)."""
    extra = ", ".join(f"{k}={v}" for k, v in (row.get("options") or {}).items() if k != "mode")
    return f"{row['name']}{f', {extra}' if extra else ''}"


def _not_run(row: dict) -> str | None:
    if row.get("params"):
        return None
    return row.get("error") or "no result"


def peers(name: str = "peers_cpu") -> str:
    """Time per E+F+S call against the peer universal potentials (``benchmarks/peers.py``), with each
    model's Matbench-Discovery combined score and its time relative to MatRIS-10M."""
    d = load(name)
    skeys = _skeys(d)
    ours = d["models"].get("ours", {}).get("structures", {})
    head = ["model", "params", "weights", "CPS"] + [_label(d, k) for k in skeys] + [f"MD step {_label(d, skeys[0])}"]
    lines = [_peers_caption(name, d), "", "Seconds per energy + forces + stress call (the time ÷ MatRIS-10M's "
             "below it):", "", "| " + " | ".join(head) + " |", "|---|---:|---|---:|" + "---:|" * (len(skeys) + 1)]
    for key, row in _peer_rows(d):
        why = _not_run(row)
        score = (row.get("score") or {}).get("CPS")
        cells = [peer_name(row), f"{row['params'] / 1e6:.1f}M" if row.get("params") else "—",
                 row.get("weights") or "—", f"{score:.3f}" if score is not None else "—"]
        if why:
            lines.append("| " + " | ".join(cells + [f"not run: {why}"] + [""] * len(skeys)) + " |")
            continue
        for k in skeys:
            e = row["structures"].get(k, {})
            if "efs_seconds" not in e:
                cells.append("over memory limit" if "resident" in (e.get("error") or "") else "—")
                continue
            t = e["efs_seconds"]["median"]
            ref = ours.get(k, {}).get("efs_seconds")
            rel = f" ({t / ref['median']:.2f}×)" if ref and key != "ours" else ""
            cells.append(f"{t:.3g}{rel}")
        md = row["structures"].get(skeys[0], {}).get("md_seconds")
        cells.append(f"{md['median']:.3g}" if md else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("\nCPS: Matbench Discovery's combined performance score of the published model "
                 "(`benchmarks/results/peer_scores.json`, from the leaderboard's model files). Random weights: the "
                 "published architecture built by the peer's own package (the weights download at run time); speed "
                 "and memory do not depend on their values.")
    return "\n".join(lines)


def peers_memory(name: str = "peers_cpu") -> str:
    """Peak resident memory of one E+F+S call in a fresh process, per model and structure."""
    d = load(name)
    skeys = _skeys(d)
    big = max(skeys, key=lambda k: d["structures"][k]["n_atoms"])
    head = ["model", "after loading"] + [_label(d, k) for k in skeys] + [f"per atom, {_label(d, big)}"]
    lines = [_peers_caption(name, d).split(" Medians")[0], "",
             "Peak resident memory (GB) of a fresh process making one E+F+S call:", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(skeys) + 2)]
    for key, row in _peer_rows(d):
        why = _not_run(row)
        if why:
            lines.append(f"| {peer_name(row)} | not run: {why} |" + " |" * (len(skeys) + 1))
            continue
        st = row["structures"]
        base = next((e["base_rss_gb"] for e in st.values() if "base_rss_gb" in e), None)
        cells = [peer_name(row), f"{base:.2f}" if base is not None else "—"]
        for k in skeys:
            e = st.get(k, {})
            cells.append(f"{e['peak_rss_gb']:.2f}" if "peak_rss_gb" in e else
                         ("over limit" if "resident" in (e.get("error") or "") else "—"))
        e = st.get(big, {})
        cells.append(f"{e['per_atom_kb']:,.0f} KB" if "per_atom_kb" in e else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\n\"After loading\": the process with its libraries and model, before the first call; per atom: "
                 f"(peak − after loading) ÷ atoms. Processes past {d['meta']['max_rss_gb']:g} GB were stopped.")
    return "\n".join(lines)


VIEWS = {
    ("cpu_speed", "speed"): cpu_plain,
    ("cpu_speed", "official"): cpu_official,
    ("cpu_speed", "chgnet"): cpu_chgnet,
    ("cpu_speed", "fallback"): cpu_fallback,
    ("cpu_speed_avx2", "chgnet"): cpu_chgnet,
    ("cpu_speed_compiled", "compiled"): cpu_compiled,
    ("system_size_cpu", "fit"): system_fit,
    ("system_size_cpu", "levels"): system_levels,
    ("bench_demo_cpu", "time"): bench_time,
    ("bench_demo_cpu", "md"): bench_md,
    ("train_throughput_cpu", "short"): train_throughput_short,
    ("compile_check_cpu", "short"): compile_short,
    ("peers_cpu", "memory"): peers_memory,
}


def official_api(name: str = "official_api_cpu") -> str:
    """The official MatRIS package against ours through each official entry point
    (``benchmarks/official_api.py``): seconds, ratio, largest differences."""
    from benchmarks.official_api import table as official_table

    return official_table(load(name))


def shared_machine(name: str = "shared_machine_cpu") -> str:
    """``matris md`` beside ``matris train`` on one machine, by thread wait policy
    (``benchmarks/shared_machine.py``)."""
    from benchmarks.shared_machine import markdown

    return markdown(load(name))


TABLES = {
    "shared_machine_cpu": shared_machine,
    "official_api_cpu": official_api,
    "system_size_cpu": system_size,
    "lammps_cpu": lammps,
    "lammps_exactness": lammps_exactness,
    "parity": parity,
    "cpu_speed": cpu_speed,
    "cpu_speed_epyc_avx2": cpu_speed,
    "cpu_speed_avx2": cpu_speed,
    "cpu_speed_compiled": cpu_speed,
    "bench_demo_cpu": bench,
    "bench_cpu": bench,
    "simulate_cpu": simulate,
    "nve_cpu": nve,
    "physics_checks_cpu": physics_checks,
    "memory_levels_cpu": memory_levels,
    "fusion_memory": fusion_memory,
    "kernel_resources_sm90": kernel_resources,
    "train_throughput_cpu": train_throughput,
    "train_memory": train_memory,
    "kappa_small_cpu": kappa_small,
    "data_throughput_cpu": data_throughput,
    "cache_build_cpu": cache_build,
    "compile_check_cpu": compile_check,
    "speed_cpu": speed,
    "distill_evaluation": distill_evaluation,
    "peers_cpu": peers,
}


def table(name: str, view: str | None = None, source: bool = True, history: bool = False) -> str:
    """The markdown table of one result file (or one ``view`` of it, :data:`VIEWS`), followed by
    its provenance line (with the commit when ``history``)."""
    if view is not None:
        if (name, view) not in VIEWS:
            known = ", ".join(f"{n}/{v}" for n, v in VIEWS)
            raise KeyError(f"no table view {view!r} of {name!r}; known views: {known}")
        text = VIEWS[(name, view)](name)
    elif name not in TABLES:
        raise KeyError(f"no table renderer for {name!r}; known: {', '.join(TABLES)}")
    else:
        text = TABLES[name](name)
    return text + (f"\n\n<small>{provenance(name, history)}</small>" if source else "")


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="result names (simulate_cpu) or views (cpu_speed/official); default: every table")
    names = p.parse_args(argv).names or (list(TABLES) + [f"{n}/{v}" for n, v in VIEWS])
    for name in names:
        base, _, view = name.partition("/")
        print(f"## {name}\n\n{table(base, view or None)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
