"""Peak memory of one energy + forces + stress call at each memory-saving level (CPU).

    python -m benchmarks.memory_levels --json benchmarks/results/memory_levels_cpu.json

The "Large systems and memory" table of the docs (docs/memory.md) comes from this script. It builds the
1,000-atom bcc Fe cell of ``benchmarks/speed.py`` (rattled by 0.02 Å), a random-weight model
of the published 10M architecture (``examples/configs/matris-10m.yaml``: width 128,
r_c = 6 Å, r_3 = 4.5 Å) with 1 and 2 interaction blocks, and runs one E+F+S call in a fresh
subprocess per (level, blocks), forcing ``model.options.memory_level = level``. Per row it reports:

- the model's own estimate of the activations (``matris.memory.activation_bytes``), the
  figure the automatic level choice uses;
- the measured peak resident memory of the call: the process's peak RSS minus its RSS just
  before the call (model, graph and Python already loaded);
- the time of the call.

The difference between the 1- and 2-block rows is the cost of each further block. Level 0
(everything kept) is only estimated by default: on 1,000-atom Fe it needs ≈ 14 GB per block,
which is more than a 24 GB machine can run next to anything else; ``--measure-level0`` runs it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.common import ROOT, peak_rss_bytes, provenance, rss_bytes, timed, write_json

GIB = 2**30


def _estimate(model, graph, level: int) -> float:
    """The model's own estimate of the activations, GB (:func:`matris.memory.activation_bytes`)."""
    from matris import memory

    return memory.activation_bytes(model, graph, level) / 1e9

def _model_and_graph(blocks: int, atoms: int):
    import numpy as np
    import torch
    import yaml
    from ase.build import bulk

    from matris import MatRIS, MatRISConfig
    from matris.graph import GraphBatch
    from matris.structures import to_system

    cfg = yaml.safe_load((ROOT / "examples/configs/matris-10m.yaml").read_text())["model"]
    cfg["num_layers"] = blocks
    torch.manual_seed(0)
    model = MatRIS(MatRISConfig(**cfg)).eval()
    rng = np.random.default_rng(0)
    cell = bulk("Fe", "bcc", a=2.87, cubic=True).repeat(8)  # 1,024 atoms
    cell = cell[:atoms]
    cell.positions += rng.normal(scale=0.02, size=cell.positions.shape)
    c = model.config
    graph = GraphBatch.from_systems([to_system(cell)], c.pairwise_cutoff, c.three_body_cutoff)
    return model, graph


def child(level: int, blocks: int, atoms: int) -> dict:
    """One E+F+S call at ``level`` in this (fresh) process; prints and returns the row."""
    model, graph = _model_and_graph(blocks, atoms)
    model.options.memory_level = level
    before = rss_bytes()
    out, seconds = timed(model, graph, compute_forces=True, compute_stress=True)
    peak = peak_rss_bytes()
    assert out.forces is not None and bool(out.energy.isfinite().all())
    return {"level": level, "blocks": blocks, "atoms": atoms, "bonds": int(graph.num_bonds),
            "angles": int(graph.num_angles),
            "estimate_GB": _estimate(model, graph, level),
            "measured_peak_GB": (peak - before) / 1e9, "rss_before_GB": before / 1e9,
            "seconds": seconds}


def estimate(level: int, blocks: int, atoms: int) -> dict:
    model, graph = _model_and_graph(blocks, atoms)
    return {"level": level, "blocks": blocks, "atoms": atoms, "bonds": int(graph.num_bonds),
            "angles": int(graph.num_angles), "estimate_GB": _estimate(model, graph, level),
            "measured_peak_GB": None, "rss_before_GB": None, "seconds": None}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--atoms", type=int, default=1000, help="atoms of the bcc Fe cell (at most 1,024)")
    p.add_argument("--blocks", type=int, nargs="+", default=[1, 2], help="interaction blocks of the model")
    p.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2, 3], choices=(0, 1, 2, 3))
    p.add_argument("--measure-level0", action="store_true", help="run level 0 too (≈ 14 GB per block at 1,000 atoms)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", type=int, nargs=3, metavar=("LEVEL", "BLOCKS", "ATOMS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return {}

    rows = []
    print(f"{'level':>5s} {'blocks':>6s} {'angles':>8s} {'estimate':>9s} {'measured':>9s} {'time':>8s}", flush=True)
    for level in args.levels:
        for blocks in args.blocks:
            if level == 0 and not args.measure_level0:
                row = estimate(level, blocks, args.atoms)
            else:
                run = subprocess.run([sys.executable, "-m", "benchmarks.memory_levels", "--child", str(level),
                                      str(blocks), str(args.atoms)], capture_output=True, text=True, cwd=ROOT)
                if run.returncode:
                    raise SystemExit(f"level {level}, {blocks} blocks failed:\n{run.stderr[-3000:]}")
                row = json.loads(run.stdout.strip().splitlines()[-1])
            rows.append(row)
            measured = "-" if row["measured_peak_GB"] is None else f"{row['measured_peak_GB']:.2f}GB"
            secs = "-" if row["seconds"] is None else f"{row['seconds']:.0f}s"
            print(f"{level:5d} {blocks:6d} {row['angles']:8d} {row['estimate_GB']:8.2f}GB {measured:>9s} {secs:>8s}",
                  flush=True)
    per_block = {}
    for level in args.levels:
        by_blocks = {r["blocks"]: r for r in rows if r["level"] == level and r["measured_peak_GB"] is not None}
        if 1 in by_blocks and 2 in by_blocks:
            per_block[level] = by_blocks[2]["measured_peak_GB"] - by_blocks[1]["measured_peak_GB"]
            print(f"level {level}: each further block adds {per_block[level]:.2f} GB (measured)")
    result = {"rows": rows, "per_further_block_GB": per_block}
    if args.json:
        result["provenance"] = provenance(argv,
                                          model_name="random weights, examples/configs/matris-10m.yaml architecture")
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
