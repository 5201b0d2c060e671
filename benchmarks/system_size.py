"""How the published architecture's memory grows with the system: one energy + forces + stress
call of the MatRIS-10M architecture on diamond Si cells of growing size, on the CPU.

    python -m benchmarks.system_size --json benchmarks/results/system_size_cpu.json

Model: ``MatRISConfig.published_10m()`` (the architecture of matris-10m-oam, -mp and -omat:
10 blocks of width 128, r_c 6 Å, r_3 4.5 Å) with random weights, float32, through the ASE
calculator (``MatRISCalculator``) with the default CPU kernels. Speed and memory depend on the
architecture and the graph, not on the weights. Structures: the standard rattled diamond Si
cells of ``matris bench`` (``matris.bench.standard_structure``).

Each (size, memory level) runs in a fresh process, so its peak memory is its own: the
process's peak resident set size (``VmHWM``), which includes Python, torch and the model
(what a user's process needs), and that peak above the process's base (its peak after the warm-up
call, before this one), per angle. Per size it runs the memory level the model picks by itself on
this machine (``auto``) and each level asked for (default 0–3; see docs/memory.md); a fixed level
whose own estimate (``matris.memory.activation_bytes``) exceeds 80 % of the memory available is
skipped with its reason. One warm-up call on Si8 first (the fused operators' first call), then one
timed call. ``summary`` gives, per level, the bytes per angle above the base at the largest cell
measured and the time against level 0's on the largest cell where both ran.

From the lowest level's rows, a straight line through peak memory against the number of angles
(the line graph sets the cost) tells how many atoms fit in a given memory; the documentation's
table renders it from this file (``benchmarks/tables.py``). Each row also records the time of
its call and the load average, but peak memory does not depend on other work on the machine
while time does: the documentation's speed tables come from ``benchmarks/cpu_speed.py``, which
times its variants side by side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from benchmarks.common import ROOT, peak_rss_bytes, rss_bytes, timed


def graph_child(atoms_count: int) -> dict:
    """The neighbour list and line graph of one Si cell in this (fresh) process: the peak memory
    of building them above the process's start, and what the graph holds."""
    from matris import MatRISConfig
    from matris.bench import standard_structure
    from matris.graph import GraphBatch
    from matris.structures import to_system

    c = MatRISConfig.published_10m()
    system = to_system(standard_structure("si", atoms_count).atoms)
    start = rss_bytes()
    graph, seconds = timed(GraphBatch.from_systems, [system], c.pairwise_cutoff, c.three_body_cutoff)
    peak = peak_rss_bytes()
    return {"atoms": atoms_count, "bonds": int(graph.num_bonds), "angles": int(graph.num_angles),
            "requested_level": "graph", "build_s": seconds, "peak_above_start_GB": (peak - start) / 1e9,
            "held_GB": (rss_bytes() - start) / 1e9}


def angles_per_atom() -> dict[str, float]:
    """Angles per atom at the published cutoffs of two oxides (rocksalt MgO, cubic SrTiO3), to turn
    the per-angle line into atoms of each (Si's come from the measured cells)."""
    from ase.build import bulk
    from ase.spacegroup import crystal

    from matris import MatRISConfig
    from matris.graph import GraphBatch
    from matris.structures import to_system

    c = MatRISConfig.published_10m()
    cells = {"rocksalt MgO": bulk("MgO", "rocksalt", a=4.21, cubic=True) * (2, 2, 2),
             "perovskite SrTiO3": crystal(["Sr", "Ti", "O"], [(0, 0, 0), (0.5, 0.5, 0.5), (0.5, 0.5, 0)],
                                          spacegroup=221, cellpar=[3.905] * 3 + [90] * 3) * (3, 3, 3)}
    out = {}
    for name, atoms in cells.items():
        g = GraphBatch.from_systems([to_system(atoms)], c.pairwise_cutoff, c.three_body_cutoff)
        out[name] = g.num_angles / len(atoms)
    return out


PROPERTIES = {"efs": ["energy", "forces", "stress"], "ef": ["energy", "forces"], "e": ["energy"]}


def child(atoms_count: int, level: str, threads: int | None, properties: str = "efs") -> dict:
    """One timed call in this (fresh) process: E+F+S (``efs``) or E+F through the calculator, or the
    energy alone (``e``) through ``MatRIS.__call__`` without forces (the calculator computes forces)."""
    import torch

    if level == "graph":
        return graph_child(atoms_count)

    from matris import MatRIS, MatRISCalculator, MatRISConfig, memory
    from matris.bench import standard_structure
    from matris.graph import GraphBatch
    from matris.structures import to_system

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = MatRIS(MatRISConfig.published_10m()).eval()
    if level != "auto":
        model.options.memory_level = int(level)
    calc = MatRISCalculator(model, device="cpu", dtype=torch.float32)
    warm = standard_structure("si", 8).atoms
    calc.calculate(warm, ["energy", "forces", "stress"])  # the fused operators' first call
    if properties == "e":  # and the energy alone's
        model(GraphBatch.from_systems([to_system(warm)], model.cutoff, model.three_body_cutoff),
              compute_forces=False, compute_stress=False)
    base = peak_rss_bytes()
    atoms = standard_structure("si", atoms_count).atoms
    c = model.config
    graph = GraphBatch.from_systems([to_system(atoms)], c.pairwise_cutoff, c.three_body_cutoff)
    chosen = memory.inference_level(model, graph, torch.float32, backward=properties != "e")
    calc.reset()
    t0 = time.perf_counter()
    if properties == "e":
        model(graph, compute_forces=False, compute_stress=False)
    else:
        calc.calculate(atoms, PROPERTIES[properties])
    seconds = time.perf_counter() - t0
    peak = peak_rss_bytes()
    return {"atoms": len(atoms), "bonds": int(graph.num_bonds), "angles": int(graph.num_angles),
            "requested_level": level, "level": int(chosen), "efs_s": seconds, "peak_rss_GB": peak / 1e9,
            "base_rss_GB": base / 1e9, "properties": properties,
            "bytes_per_angle": (peak - base) / max(int(graph.num_angles), 1),
            "threads": torch.get_num_threads()}


def skip_reason(atoms_count: int, level: str, properties: str = "efs") -> str | None:
    """Why a fixed level is not run on this cell: its estimate exceeds 80 % of the available memory."""
    if level in ("auto", "graph"):
        return None
    import torch

    from matris import MatRIS, MatRISConfig, memory
    from matris.bench import standard_structure
    from matris.graph import GraphBatch
    from matris.structures import to_system

    model = MatRIS(MatRISConfig.published_10m())
    c = model.config
    graph = GraphBatch.from_systems([to_system(standard_structure("si", atoms_count).atoms)], c.pairwise_cutoff,
                                    c.three_body_cutoff)
    need = memory.activation_bytes(model, graph, int(level), torch.float32, "fused", backward=properties != "e")
    room = memory.available_memory(torch.device("cpu"))
    if need > 0.8 * room:
        return f"estimated {need / 1e9:.1f} GB, more than 80 % of the {room / 1e9:.1f} GB available"
    return None


def summarize(rows: list[dict]) -> dict:
    """Per level: bytes per angle above the base at the largest cell, and time ÷ level 0's on the
    largest cell where both ran."""
    out = {}
    timed = [r for r in rows if "efs_s" in r and r["requested_level"] not in ("auto", "graph")]
    for level in sorted({r["requested_level"] for r in timed}):
        mine = [r for r in timed if r["requested_level"] == level]
        big = max(mine, key=lambda r: r["atoms"])
        entry = {"atoms": big["atoms"], "bytes_per_angle": big["bytes_per_angle"], "efs_s": big["efs_s"]}
        both = [(r, z) for r in mine for z in timed if z["requested_level"] == "0" and z["atoms"] == r["atoms"]]
        if both:
            r, z = max(both, key=lambda p: p[0]["atoms"])
            entry["vs_level0"] = {"atoms": r["atoms"], "time_ratio": r["efs_s"] / z["efs_s"],
                                  "bytes_per_angle_level0": z["bytes_per_angle"]}
        out[level] = entry
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="*", default=[64, 216, 512, 1000], help="Si atoms (multiples of 8)")
    p.add_argument("--levels", nargs="+", default=["auto", "0", "1", "2", "3"], help="memory levels: auto, 0, 1, 2, 3")
    p.add_argument("--graph-sizes", type=int, nargs="*", default=[4096, 32768, 97336],
                   help="Si atoms whose graph construction alone is measured (no model)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--properties", choices=sorted(PROPERTIES), default="efs",
                   help="what each call computes: efs (default), ef, or e (energy alone, no backward pass)")
    p.add_argument("--json", default=None)
    p.add_argument("--child", nargs=2, metavar=("ATOMS", "LEVEL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1], args.threads, args.properties)))
        return 0

    import os

    load_start = os.getloadavg()[0]
    rows = []
    runs = [(n, level) for n in args.sizes for level in args.levels] + [(n, "graph") for n in args.graph_sizes]
    for n, level in runs:
        why = skip_reason(n, level, args.properties)
        if why:
            rows.append({"atoms": n, "requested_level": level, "skipped": why})
            print(f"Si{n:<5} level {level}: skipped ({why})", flush=True)
            continue
        cmd = [sys.executable, "-m", "benchmarks.system_size", "--child", str(n), level]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        cmd += ["--properties", args.properties]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"Si{n}, level {level}: the child process failed")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        if level == "graph":
            print(f"Si{row['atoms']:<5} {row['angles']:>9,} angles  graph only     build {row['build_s']:7.2f} s  "
                  f"peak {row['peak_above_start_GB']:5.2f} GB above the start", flush=True)
        else:
            print(f"Si{row['atoms']:<5} {row['angles']:>9,} angles  level {row['level']} ({level:>4})  "
                  f"{args.properties.upper():<5} {row['efs_s']:7.2f} s  peak RSS {row['peak_rss_GB']:5.2f} GB  "
                  f"{row['bytes_per_angle']:6.0f} B per angle above the base", flush=True)
    from matris.memory import CHUNK_ROWS

    result: dict = {"rows": rows, "load_average_start": load_start, "load_average_end": os.getloadavg()[0],
                    "angles_per_atom": angles_per_atom(), "chunk_rows": CHUNK_ROWS}
    import numpy as np

    from matris.memory import LOWEST_LEVEL

    result["summary"] = summarize(rows)
    least = [r for r in rows if r["requested_level"] == str(LOWEST_LEVEL) and "efs_s" in r]
    if len(least) >= 2:  # a straight line through the lowest level's peaks
        slope, intercept = np.polyfit([r["angles"] for r in least], [r["peak_rss_GB"] for r in least], 1)
        result["lowest_fit"] = {"level": LOWEST_LEVEL, "GB_per_angle": float(slope), "GB_fixed": float(intercept),
                                "KiB_per_angle": float(slope) * 1e9 / 1024}
    if args.json:
        import torch

        from benchmarks.common import provenance, write_json
        from matris import MatRIS, MatRISConfig

        result["parameters"] = sum(q.numel() for q in MatRIS(MatRISConfig.published_10m()).parameters())
        result["dtype"] = "float32"
        result["device"] = "cpu"
        result["meta"] = provenance(argv, "MatRIS published 10M architecture (MatRISConfig.published_10m()), "
                                          "random weights")
        result["meta"]["torch_threads"] = torch.get_num_threads() if not args.threads else args.threads
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
