"""CPU: the projection rewrite of Φ's first layer against the literal concatenation.

    python benchmarks/rewrite_cpu.py [--json out.json]

Same weights (the 10-block width-128 architecture, random), float32, CPU. It times
energy+forces+stress calls and one training step (energy + force loss, create_graph,
backward and AdamW step), with ``model.projection_rewrite`` True and False side by side
in one process, alternating, and prints the medians and their ratio. Both run the composed
PyTorch ops (``kernel_backend="torch"``); the chunked CPU path has the rewrite built in.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.gpu import diamond_si  # noqa: E402
from matris import GraphBatch, MatRIS, MatRISConfig  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = MatRIS(MatRISConfig(num_layers=10, three_body_cutoff=4.5, reference_energy="mptrj")).eval()
    model.kernel_backend = "torch"  # the composed ops: the chunked CPU path always uses the rewrite
    model.checkpointing = 0  # compare the rewrite alone
    rows = []

    def measure(label, make_fn, n_atoms, angles):
        times = {True: [], False: []}
        for rewrite in (True, False):  # warm-up both
            model.projection_rewrite = rewrite
            make_fn()()
        for _ in range(args.repeat):
            for rewrite in (True, False):
                model.projection_rewrite = rewrite
                fn = make_fn()
                t0 = time.perf_counter()
                fn()
                times[rewrite].append(time.perf_counter() - t0)
        new, old = statistics.median(times[True]), statistics.median(times[False])
        rows.append(dict(case=label, atoms=n_atoms, angles=angles, rewrite_s=new, plain_s=old, speedup=old / new))
        print(f"{label:34s} {n_atoms:6d} {angles:8d} {1e3 * new:12.1f} {1e3 * old:12.1f} {old / new:8.2f}×", flush=True)

    print(f"{'case':34s} {'atoms':>6s} {'angles':>8s} {'rewrite (ms)':>12s} {'plain (ms)':>12s} {'speedup':>9s}")
    for k in (1, 2):
        system = diamond_si(k)
        g = GraphBatch.from_systems([system], model.cutoff, model.three_body_cutoff)
        measure(f"E+F+S {system.name}", lambda: (lambda: model(g)), system.num_atoms, g.num_angles)
    batch = [diamond_si(1, seed=s) for s in range(4)]
    g = GraphBatch.from_systems(batch, model.cutoff, model.three_body_cutoff)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def train_step():
        def run():
            model.train()
            opt.zero_grad(set_to_none=True)
            out = model(g, compute_stress=False, create_graph=True)
            loss = (out.energy_per_atom ** 2).mean() + (out.forces ** 2).mean()
            loss.backward()
            opt.step()
            model.eval()
        return run

    measure("training step, 4 × Si8 (E + F loss)", train_step, g.num_atoms, g.num_angles)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
