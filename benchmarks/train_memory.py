"""Peak memory and time of a training step of the published architecture, and the memory model.

    python -m benchmarks.train_memory                          # the default cases, JSON to stdout's table
    python -m benchmarks.train_memory --json benchmarks/results/train_memory.json
    python -m benchmarks.train_memory --cases mgo16 emt16 --modes rows blocks none
    python -m benchmarks.train_memory --cases mgo64 --modes rows --breakdown    # where the step's time goes
    python -m benchmarks.train_memory --cases mgo64 --layers 2    # every mode side by side, where ten
                                                                  # blocks' whole graph would not fit

A step is what ``matris train`` does per batch: energy, forces and stress with ``create_graph``, a
loss on all three (the magnetic moments' head is off: fine-tuning data rarely has them), the
backward, an AdamW step. Model: the published MatRIS-10M architecture
(``MatRISConfig.published_10m()``, random weights), float32. Each (case, mode) runs in a fresh
process, so its peak is its own: on CPU the peak resident set size (``VmHWM``), on CUDA
``torch.cuda.max_memory_allocated`` (plus the process's RSS). ``--warmup`` untimed steps (2: the
second step of a process still pays for first-touch memory on a CPU), then ``--steps`` timed ones
(median); "× none" is a row's step time over the ``none`` row's of the same batch, measured in the
same run.

Cases: rocksalt MgO (a = 4.21 Å, rattled 0.05 Å) of 8, 16 and 64 atoms (``mgo8``, ``mgo16``,
``mgo64``; 7,936, 15,872 and 63,488 angles), and batches of the fine-tuning example's data
(``examples/configs/data/emt_finetune.extxyz``: fcc metals of 1 to 8 atoms), its 2 and 16 (the
example config's ``max_structures``) largest structures (``emt2``, ``emt16``).

Modes (``MatRIS.options.training_recompute``): ``none`` (every block's graph kept; composed ops),
``blocks`` (blocks recomputed in the backward passes), ``rows`` (``blocks``, and inside each block
the line-graph steps' work per angle and the atom graph's Φ by row chunks where they make more
than one): these two run the forward and the first-order passes on the fused CPU operators, the
second order in the composed ops; and ``blocks-composed``, ``rows-composed`` (the same with the composed ops everywhere,
``MATRIS_KERNELS=torch``). A mode
whose memory model predicts more than this machine has free is skipped, with the prediction
recorded. Every row also gives the memory model's prediction
(``matris.memory.training_fixed_bytes + training_bytes``) against the measured peak.

``--breakdown``: the timed steps' seconds per kind of recomputation node
(:mod:`matris.model.recompute`), each exclusive of the nodes it runs inside it, per step: a block's
forward, its input gradients for the forces, its first-order pass with weight gradients and its
second-order pass, and the same for the row chunks nested in them (``rows``); the rest is the
model outside the blocks, the loss and the optimiser.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, peak_rss_bytes, provenance, write_json

CASES = ("mgo8", "mgo16", "mgo64", "emt2", "emt16")
MODES = ("none", "blocks", "blocks-composed", "rows", "rows-composed")


def recompute_mode(mode: str) -> str:
    """The model's ``training_recompute`` for a benchmark mode."""
    return mode.removesuffix("-composed")
GB = 2**30


def structures(case: str):
    """The case's structures (ASE Atoms)."""
    from ase.build import bulk
    from ase.io import read

    if case.startswith("mgo"):
        n = int(case[3:])
        reps = {8: (1, 1, 1), 16: (2, 1, 1), 32: (2, 2, 1), 64: (2, 2, 2)}[n]
        atoms = bulk("MgO", "rocksalt", a=4.21, cubic=True) * reps
        atoms.rattle(0.05, seed=1)
        return [atoms]
    if case.startswith("emt"):
        k = int(case[3:])
        frames = read(ROOT / "examples" / "configs" / "data" / "emt_finetune.extxyz", ":")
        return sorted(frames, key=len, reverse=True)[:k]
    raise SystemExit(f"unknown case {case!r}; use one of {CASES}")


BREAKDOWN = {("_Block", "forward"): "forward", ("_BlockVJP", "forward"): "input gradients (forces)",
             ("_Block", "backward"): "first order with weight gradients", ("_BlockVJP", "backward"): "second order"}


class _Breakdown:
    """Seconds per kind of recomputation node, each exclusive of the nodes inside it (see --breakdown)."""

    def __init__(self):
        from matris.model import recompute

        self.seconds, self._stack, self._saved = {}, [], []
        for cls in (recompute._Block, recompute._BlockVJP):
            for name in ("forward", "backward"):
                self._saved.append((cls, name, cls.__dict__[name]))
                setattr(cls, name, staticmethod(self._timed(cls, name, getattr(cls, name))))

    def _timed(self, cls, name, fn):
        def run(*args, **kwargs):
            import torch

            spec = args[1] if name == "forward" else args[0].spec
            if name == "backward" and torch.is_grad_enabled():  # only launches the input-gradient node
                return fn(*args, **kwargs)
            key = ("row chunks: " if spec.chunk else "blocks: ") + BREAKDOWN[(cls.__name__, name)]
            self._stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                inner = self._stack.pop()
                self.seconds[key] = self.seconds.get(key, 0.0) + dt - inner
                if self._stack:
                    self._stack[-1] += dt
        return run

    def close(self):
        for cls, name, fn in self._saved:
            setattr(cls, name, fn)


def worker(case: str, mode: str, steps: int, device: str, warmup: int = 2, breakdown: bool = False) -> dict:
    """One (case, mode) in this process: the model, the batch, the steps and the peaks."""
    import torch

    from matris import GraphBatch, memory
    from matris.structures import to_system

    torch.manual_seed(0)
    dev = torch.device(device)
    model = published().to(dev).train()
    model.options.training_recompute = recompute_mode(mode)
    if mode.endswith("-composed"):
        model.options.kernels = "torch"
    systems = [to_system(a) for a in structures(case)]
    g = GraphBatch.from_systems(systems, model.cutoff, model.three_body_cutoff).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    base = peak_rss_bytes()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(g, compute_forces=True, compute_stress=True, compute_magmoms=False, create_graph=True)
        loss = (out.energy_per_atom ** 2).mean() + (out.forces ** 2).mean() + (out.stress ** 2).mean()
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    times, parts = [], None
    for k in range(warmup + steps):
        if k == warmup and breakdown:
            parts = _Breakdown()
        t0 = time.perf_counter()
        step()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    if parts is not None:
        parts.close()
    peak_rss = peak_rss_bytes()
    n_atoms, n_bonds, n_angles = int(g.n_atoms.sum()), g.num_bonds, g.num_angles
    predicted = memory.training_fixed_bytes(model, ema=False) + int(memory.training_bytes(model, n_atoms, n_bonds,
                                                                                           n_angles))
    row = {"case": case, "mode": mode, "layers": LAYERS, "device": str(dev), "structures": len(systems),
           "atoms": n_atoms, "bonds": n_bonds, "angles": n_angles, "step_seconds": statistics.median(times),
           "all_seconds": times,
           "peak_rss_bytes": peak_rss, "baseline_rss_bytes": base, "predicted_bytes": predicted}
    if dev.type == "cuda":
        row["peak_cuda_bytes"] = int(torch.cuda.max_memory_allocated(dev))
    if parts is not None:
        per_step = {k: v / steps for k, v in sorted(parts.seconds.items())}
        row["breakdown_seconds"] = dict(per_step, rest=sum(times) / steps - sum(per_step.values()))
    return row


def free_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# blocks of the model measured (--layers): the published 10, or fewer, so that a batch whose whole
# graph does not fit in memory with ten blocks is measured in every mode side by side
LAYERS = 10


def published(layers: int | None = None):
    """The published 10M architecture (random weights), with ``layers`` interaction blocks (default
    :data:`LAYERS`)."""
    import dataclasses

    from matris import MatRIS, MatRISConfig

    return MatRIS(dataclasses.replace(MatRISConfig.published_10m(), num_layers=layers or LAYERS))


def predicted(case: str, mode: str) -> dict:
    """The memory model's prediction for a (case, mode), without running it, with the batch's sizes."""
    import torch

    from matris import GraphBatch, memory
    from matris.structures import to_system

    torch.manual_seed(0)
    model = published()
    model.options.training_recompute = recompute_mode(mode)
    g = GraphBatch.from_systems([to_system(a) for a in structures(case)], model.cutoff, model.three_body_cutoff)
    sizes = {"atoms": int(g.n_atoms.sum()), "bonds": g.num_bonds, "angles": g.num_angles}
    need = memory.training_fixed_bytes(model, ema=False) + int(memory.training_bytes(model, *sizes.values()))
    return {"case": case, "mode": mode, **sizes, "predicted_bytes": need}


def gpu_sizes(sizes=(24, 40, 80, 141)) -> list[dict]:
    """What the memory model implies for GPUs of these sizes (GB), float32, published 10M, AdamW +
    EMA: the angles of MgO-like cells (the ``mgo64`` case's bonds and atoms per angle) that fit in
    one batch, in each recompute mode."""
    import torch

    from matris import GraphBatch, memory
    from matris.structures import to_system

    torch.manual_seed(0)
    model = published(10)
    g = GraphBatch.from_systems([to_system(a) for a in structures("mgo64")], model.cutoff, model.three_body_cutoff)
    n_atoms, n_bonds, n_angles = int(g.n_atoms.sum()), g.num_bonds, g.num_angles
    out = []
    for size in sizes:
        row = {"gpu_gb": size}
        for name in GPU_MODES:
            per_angle = memory.training_bytes(model, n_atoms, n_bonds, n_angles, recompute=name) / n_angles
            fixed = memory.training_fixed_bytes(model, recompute=name)
            row[f"{name}_angles"] = max(0, int((size * GB - fixed) / per_angle))
        out.append(row)
    return out


GPU_MODES = ("rows", "blocks", "none")


def gpu_table(rows: list[dict]) -> str:
    lines = ["| GPU memory | MgO64 cells per batch, recompute rows | blocks | none (whole graph) |",
             "|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['gpu_gb']} GB | " + " | ".join(
            f"{r[f'{m}_angles'] // 63488} ({r[f'{m}_angles']:,} angles)" for m in GPU_MODES) + " |")
    return "\n".join(lines)


def model_prediction(row: dict) -> int:
    """The memory model of the code at hand (not the one recorded with the row) for a row's batch:
    a refit of the model shows against the committed measurements."""
    import torch


    torch.manual_seed(0)
    from matris import memory

    model = published(row.get("layers"))
    mode = recompute_mode(row["mode"])
    return memory.training_fixed_bytes(model, ema=False, recompute=mode) + int(memory.training_bytes(model,
        row["atoms"], row["bonds"], row["angles"], recompute=mode))


def table(rows: list[dict], live: bool = False) -> str:
    """The rows' table; ``live``: the memory-model column from the code at hand (else as recorded)."""
    head = ("| batch | atoms | angles | mode | peak memory (GB) | memory model (GB) | step (s) | × none |\n"
            "|---|---:|---:|---|---:|---:|---:|---:|")
    lines = [head]
    base = {r["case"]: r["step_seconds"] for r in rows if r["mode"] == "none" and "step_seconds" in r}
    for r in rows:
        if live:
            r = dict(r, predicted_bytes=model_prediction(r))
        peak = r.get("peak_cuda_bytes", r.get("peak_rss_bytes"))
        lines.append(f"| {r['case']} | {r['atoms']} | {r['angles']:,} | {r['mode']} | "
                     + (f"{peak / GB:.2f}" if peak else f"skipped: {r.get('skipped', '')}")
                     + f" | {r['predicted_bytes'] / GB:.2f} | "
                     + (f"{r['step_seconds']:.2f}" if "step_seconds" in r else "–") + " | "
                     + (f"{r['step_seconds'] / base[r['case']]:.2f}" if "step_seconds" in r and r["case"] in base
                        else "–") + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="*", default=["mgo8", "mgo16", "mgo64", "emt2", "emt16"], choices=CASES)
    p.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    p.add_argument("--steps", type=int, default=2, help="timed steps per row (after the untimed ones)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per row before the timed ones")
    p.add_argument("--device", default="cpu")
    p.add_argument("--headroom", type=float, default=1.0,
                   help="skip a row whose predicted peak exceeds this share of the free memory")
    p.add_argument("--json", default=None, help="write the rows (and provenance) to this JSON file")
    p.add_argument("--update", action="store_true",
                   help="with --json: replace only the rows measured now in that file (its provenance records "
                        "this run as an update)")
    p.add_argument("--breakdown", action="store_true",
                   help="also record each row's seconds per kind of recomputation node (see above)")
    p.add_argument("--markdown", default=None, metavar="JSON", help="print the table of a results file and exit")
    p.add_argument("--layers", type=int, default=10,
                   help="interaction blocks of the model (default: the published 10); fewer measure a batch whose "
                        "whole graph would not fit with ten in every mode, side by side (a step's time and memory "
                        "are nearly all in the blocks)")
    p.add_argument("--worker", nargs=2, metavar=("CASE", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    global LAYERS
    LAYERS = args.layers
    if args.markdown:
        data = json.loads(Path(args.markdown).read_text())
        print(table(data["rows"], live=True) + "\n\n" + gpu_table(gpu_sizes()))
        return 0
    if args.worker:
        print("ROW " + json.dumps(worker(*args.worker, args.steps, args.device, args.warmup, args.breakdown)))
        return 0

    rows = []
    for case in args.cases:
        for mode in args.modes:
            pred = predicted(case, mode)
            need = pred["predicted_bytes"]
            free = free_bytes() if args.device == "cpu" else None
            if free and need > args.headroom * free:
                row = dict(pred, skipped=f"predicted {need / GB:.1f} GB, {free / GB:.1f} GB free")
            else:
                env = dict(os.environ)
                if mode.endswith("-composed"):
                    env["MATRIS_KERNELS"] = "torch"
                proc = subprocess.run([sys.executable, "-m", "benchmarks.train_memory", "--worker", case, mode,
                                       "--steps", str(args.steps),
                                       "--warmup", str(args.warmup), "--device", args.device,
                                       "--layers", str(args.layers), *(["--breakdown"] if args.breakdown else [])],
                                      capture_output=True, text=True, env=env, cwd=ROOT)
                found = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
                if proc.returncode != 0 or not found:
                    killed = proc.returncode in (-9, 137)
                    row = dict(pred, skipped="killed (out of memory)" if killed else
                               f"failed: {proc.stderr.strip()[-300:]}")
                else:
                    row = json.loads(found[-1][4:])
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    for row in rows:
        if "breakdown_seconds" in row:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in row["breakdown_seconds"].items())
            print(f"\n{row['case']}/{row['mode']}, seconds per step: {parts}")
    sizes = gpu_sizes()
    print("\nwhat the memory model implies for GPUs (float32, AdamW + EMA, MgO-like cells):")
    print(gpu_table(sizes))
    if args.json:
        meta = provenance(argv, model_name="MatRIS published 10M architecture (MatRISConfig.published_10m()), "
                                           "random weights" + ("" if args.layers == 10 else
                                                               f", {args.layers} interaction blocks instead of 10"))
        result = {"meta": meta, "rows": rows, "gpu_sizes": sizes}
        if args.update and Path(args.json).is_file():
            old = json.loads(Path(args.json).read_text())
            new = {(r["case"], r["mode"]): r for r in rows}
            result = dict(old, rows=[new.pop((r["case"], r["mode"]), r) for r in old["rows"]] + list(new.values()),
                          gpu_sizes=sizes)  # from the memory model of the code at hand
            result["updates"] = old.get("updates", []) + [{"rows": [f"{c}/{m}" for c, m in
                                                                      ((r["case"], r["mode"]) for r in rows)],
                                                             "meta": meta}]
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
