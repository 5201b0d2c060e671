"""CPU speed of the published architecture against CHGNet, measured side by side in one process.

    python benchmarks/cpu_speed.py                      # Si 8/64/216, MD of Si64, op shares
    python benchmarks/cpu_speed.py --json benchmarks/results/cpu_speed.json
    python benchmarks/cpu_speed.py --sizes 8 64 --rounds 3 --variants chunked torch
    python benchmarks/cpu_speed.py --markdown benchmarks/results/cpu_speed.json   # the docs' table

Model: the 10-block width-128 architecture of MatRIS-10M (r_c 6 Å, r_3 4.5 Å), random
weights (speed does not depend on their values), float32. Every call is an ASE calculator
call for energy, forces and stress on a freshly rattled diamond-Si cell (``matris.bench``'s
standard structures), graph construction included, as a user's script sees it.

Variants of our model (``--variants``): ``chunked`` (the default CPU path, fused formulas run
over cache-sized chunks, :mod:`matris.kernels`, with their elementwise, gather and scatter
steps in the fused C++ loops of ``kernels/native.cpp``), ``chunked-ops`` (the same chunks with
those steps as PyTorch ops, ``MATRIS_NATIVE=0``), ``torch`` (the composed PyTorch reference ops),
``compiled`` (``model.compile()``: Inductor, dynamic shapes; its compile time is reported
apart). CHGNet 0.3.0 runs in the same process when installed. The machine is shared and
noisy, so the variants and CHGNet are timed in interleaved rounds (one call each per round)
and the table reports medians over rounds and the ratio of medians; ``ratio`` is
ours / CHGNet (lower is better). CHGNet's timed call follows an untimed one of its own: timed
right after the ``torch`` variant, whose Si64 call frees about 8 GB, CHGNet's 0.15 s call took
up to 0.27 s on this machine (the memory release lands on whoever runs next).

Our first CPU call makes the whole process keep freed memory for reuse
(:mod:`matris.kernels.heap`), and CHGNet's calls in the same process get that too, so the
ratios compare the two models under one allocator. After the table's rounds, CHGNet's Si64
call is also timed with glibc's limits put back (``heap.set_keep(False)``), as it runs in a
process of its own, interleaved with calls under the setting. It is not a column of the
table: freeing the heap there would make our next call fault all its memory back in.

The op table is torch.profiler's self CPU time of one Si64 call of the default variant,
grouped by family, so the next person sees where the time goes; "fused C++ loops" is the self
time of the chunked kernels' autograd Functions (their native loops and Python glue). It is
taken with the chunk loops (``native.set_whole_calls(False)``): the default path runs the same
GEMMs and loops of a pass inside one library call, where a profiler cannot tell them apart.
Under it, the GEMM floor: the GEMM FLOPs of one Si64 call, their rate inside the call (chunk
loops), this machine's in-cache GEMM rate right after, and the least time those GEMMs need at
that rate; and the same call three ways side by side: every GEMM in MKL, the native GEMM in the
chunk loops, and the default whole passes.

``--train`` also times one training step (energy, force, stress and magmom loss with
``create_graph``, backward) of Si8 (Si64 needs more than 24 GB with the 10M config) for
the tiny config (examples/configs/tiny.yaml) and the 10M architecture, the default kernels
against the composed ops (``torch``). Training calls run the composed ops in both (the
chunked backwards give first derivatives only), so the two columns measure the same code:
the rows show that the CPU fast path leaves training as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.provenance import provenance  # noqa: E402
from matris import MatRIS, MatRISCalculator, MatRISConfig  # noqa: E402
from matris.atomic import write_json  # noqa: E402
from matris.bench.measure import md_speed  # noqa: E402
from matris.bench.structures import standard_structure  # noqa: E402
from matris.kernels import heap, native  # noqa: E402

FAMILIES = {
    "GEMM": ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm"),
    "gather/scatter": ("index_select", "index_add", "index_add_", "scatter_add_", "scatter_reduce_", "scatter_reduce",
                       "scatter_add", "gather", "index", "index_put_", "index_reduce_", "embedding"),
    "copy/alloc": ("cat", "copy_", "fill_", "zero_", "zeros", "empty", "empty_like", "zeros_like", "clone", "stack",
                   "contiguous", "full", "new_zeros", "to", "_to_copy"),
}


FUSED = ("_GatedPhi", "_GatedPhiBackward", "_AttentionPair", "_AttentionPairBackward", "_RefineEdges",
         "_RefineEdgesBackward")
NATIVE_GEMM = "matris::native_gemm"  # the profiler's name for native.Matmul's calls (see op_shares)


def family(op: str) -> str:
    if op == NATIVE_GEMM:
        return "GEMM"
    if op in FUSED:
        return "fused C++ loops"
    name = op.removeprefix("aten::")
    for fam, names in FAMILIES.items():
        if name in names:
            return fam
    return "elementwise/other"


def op_shares(calc, atoms) -> dict:
    """Self CPU time (ms) per op family and the top ops of one E+F+S call."""
    from torch.profiler import ProfilerActivity, profile, record_function

    def recorded(call):  # the native GEMM runs inside the fused Functions: give it an event of its own
        def wrapper(self, x, out, **kwargs):
            with record_function(NATIVE_GEMM):
                return call(self, x, out, **kwargs)
        return wrapper

    # the chunk loops (same GEMMs and loops as the default whole-pass calls, which run them inside
    # one library call each), so the GEMMs show apart from the loops
    previous = native.set_whole_calls(False)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof, _patched(native.Matmul, "__call__", recorded):
            calc.reset()
            calc.calculate(atoms, ["energy", "forces", "stress"])
    finally:
        native.set_whole_calls(previous)
    per_family: dict[str, float] = {}
    ops = []
    for ev in prof.key_averages():
        if not ev.key.startswith("aten::") and ev.key not in FUSED and ev.key != NATIVE_GEMM:
            continue
        ms = ev.self_cpu_time_total / 1e3
        per_family[family(ev.key)] = per_family.get(family(ev.key), 0.0) + ms
        ops.append((ev.key, ms, ev.count))
    total = sum(per_family.values())
    return {"total_ms": total,
            "families": {k: {"ms": v, "share": v / total} for k, v in sorted(per_family.items(), key=lambda x: -x[1])},
            "top_ops": [{"op": k, "ms": ms, "calls": n} for k, ms, n in sorted(ops, key=lambda x: -x[1])[:12]]}


def build_model(variant: str, base: MatRIS) -> MatRIS:
    """A copy of ``base`` set up as ``variant`` (compilation happens on its first call)."""
    import copy

    model = copy.deepcopy(base)
    if variant == "torch":
        model.kernel_backend = "torch"
    elif variant == "compiled":
        model.compile()
    elif variant not in ("chunked", "chunked-ops"):
        raise SystemExit(f"unknown variant {variant!r}; use chunked, chunked-ops, torch or compiled")
    return model


def chgnet_allocator(chgnet, rounds: int) -> dict | None:
    """CHGNet's Si64 E+F+S call with the kept-memory setting of our CPU calls (which covers the
    whole process, :mod:`matris.kernels.heap`) and with glibc's limits put back, as CHGNet runs
    in a process of its own: interleaved rounds, each call after an untimed one in its mode."""
    if not heap.keep_freed_memory():
        return None
    atoms = standard_structure("si", 64).atoms
    times = {"kept": [], "glibc": []}
    try:
        for _ in range(rounds):
            for mode in times:
                heap.set_keep(mode == "kept")
                for timed in (False, True):
                    chgnet.reset()
                    t0 = time.perf_counter()
                    chgnet.calculate(atoms, ["energy", "forces", "stress"])
                    if timed:
                        times[mode].append(time.perf_counter() - t0)
    finally:
        heap.set_keep(True)
    return {"structure": "Si64", "kind": "E+F+S", "seconds": {k: statistics.median(v) for k, v in times.items()},
            "all_seconds": times}


@contextlib.contextmanager
def loops_for(variant: str):
    """The fused C++ loops off for the ``chunked-ops`` variant's calls, on for the others."""
    previous = native.set_enabled(variant != "chunked-ops")
    try:
        yield
    finally:
        native.set_enabled(previous)


def train_steps(rounds: int) -> list[dict]:
    """One optimizer step of E+F+S+magmom loss on Si8, default kernels vs composed ops, interleaved."""
    from matris import GraphBatch
    from matris.structures import to_system
    from matris.train import TrainConfig

    tiny = TrainConfig.from_yaml(Path(__file__).resolve().parents[1] / "examples" / "configs" / "tiny.yaml").model
    configs = {"tiny": tiny, "10M": MatRISConfig(num_layers=10, three_body_cutoff=4.5, reference_energy="mptrj")}
    system = to_system(standard_structure("si", 8).atoms)  # Si64 needs > 24 GB for the 10M config
    out = []
    print(f"\ntraining step, Si8, E+F+S+magmom loss (create_graph + backward + AdamW), {rounds} interleaved rounds")
    for name, cfg in configs.items():
        torch.manual_seed(0)
        model = MatRIS(cfg).train()
        g = GraphBatch.from_systems([system], model.cutoff, model.three_body_cutoff)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

        def step():
            opt.zero_grad(set_to_none=True)
            o = model(g, compute_magmoms=True, create_graph=True)
            loss = (o.energy_per_atom ** 2).mean() + (o.forces ** 2).mean() + (o.stress ** 2).mean() \
                + (o.magmoms ** 2).mean()
            loss.backward()
            opt.step()

        times = {"default": [], "torch": []}
        for r in range(rounds + 1):
            for backend in times:
                model.kernel_backend = None if backend == "default" else "torch"
                t0 = time.perf_counter()
                step()
                if r:  # the first round warms up
                    times[backend].append(time.perf_counter() - t0)
        row = {"config": name, "atoms": 8, "angles": g.num_angles,
               "seconds": {k: statistics.median(v) for k, v in times.items()}}
        print(f"  {name:5s} default {row['seconds']['default']:.3f} s, composed ops {row['seconds']['torch']:.3f} s")
        out.append(row)
    return out


GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm")  # the dispatched ops; matmul and linear reach these


@contextlib.contextmanager
def _patched(owner, name: str, wrap):
    """``owner.name`` replaced by ``wrap(original)`` inside the block."""
    original = getattr(owner, name)
    setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def gemm_floor(calc, atoms, chgnet_seconds: float | None) -> dict:
    """How far the GEMMs alone are from the target: the GEMM FLOPs of one E+F+S call (every
    ``mm``/``addmm``/``bmm`` counted as it is dispatched and every native GEMM of
    :class:`matris.kernels.native.Matmul` as it is called, each also timed there), and this
    machine's GEMM rate right after it on the call's dominant shape (4,096 angle rows × 128 →
    256, operands in cache; MKL's and, where it is on, the native kernel's) and on a 1,024³ GEMM.
    ``floor_seconds`` is the call's GEMM FLOPs at the faster in-cache rate of the dominant shape:
    the least time these GEMMs need on this machine at that moment."""
    from torch.utils._python_dispatch import TorchDispatchMode

    flops, seconds, calls = [0], [0.0], [0]
    native_stats = {"calls": 0, "flops": 0, "seconds": 0.0}
    inside = [False]  # a Matmul that falls back to torch.mm is counted once, by the wrapper

    def counted(call):
        def wrapper(self, x, out, **kwargs):
            inside[0] = True
            t0 = time.perf_counter()
            try:
                return call(self, x, out, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                inside[0] = False
                seconds[0] += dt
                flops[0] += 2 * x.shape[0] * self.k * self.n
                calls[0] += 1
                if self.lib is not None:
                    native_stats["calls"] += 1
                    native_stats["flops"] += 2 * x.shape[0] * self.k * self.n
                    native_stats["seconds"] += dt
        return wrapper

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name not in GEMM_OPS or inside[0]:
                return func(*args, **(kwargs or {}))
            a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
            batch = a.shape[0] if a.dim() == 3 else 1
            t0 = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            seconds[0] += time.perf_counter() - t0
            flops[0] += 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]
            calls[0] += 1
            return out

    def one_call() -> float:
        calc.reset()
        t0 = time.perf_counter()
        with Count(), _patched(native.Matmul, "__call__", counted):
            calc.calculate(atoms, ["energy", "forces", "stress"])
        return time.perf_counter() - t0

    # the same call with the native GEMM off (MKL for every product) first, then as configured
    mkl = None
    if native.gemm_enabled():
        previous = os.environ.get("MATRIS_NATIVE_GEMM")
        os.environ["MATRIS_NATIVE_GEMM"] = "0"
        try:
            mkl_call = one_call()
        finally:
            if previous is None:
                del os.environ["MATRIS_NATIVE_GEMM"]
            else:
                os.environ["MATRIS_NATIVE_GEMM"] = previous
        mkl = {"call_seconds": mkl_call, "gemm_seconds": seconds[0], "gemm_gflops": flops[0] / 1e9 / seconds[0]}
        flops[0], seconds[0], calls[0] = 0, 0.0, 0
    # then with the chunk loops, where every GEMM is a call of its own (counted: the FLOPs and their
    # time), and last the default path (whole passes in one library call each: the same GEMMs)
    previous = native.set_whole_calls(False)
    try:
        chunk_call = one_call()
    finally:
        native.set_whole_calls(previous)
    counted_flops, counted_seconds, counted_calls = flops[0], seconds[0], calls[0]
    counted_native = dict(native_stats)
    call_seconds = one_call()
    flops[0], seconds[0], calls[0] = counted_flops, counted_seconds, counted_calls
    native_stats.update(counted_native)

    def rate(m: int, k: int, n: int, reps: int, use_native: bool = False) -> float:
        x, w, out = torch.randn(m, k), torch.randn(n, k), torch.empty(m, n)
        mm = native.Matmul(w.T) if use_native else (lambda a, out: torch.mm(a, w.T, out=out))
        for _ in range(3):
            mm(x, out=out)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            mm(x, out=out)
            ts.append(time.perf_counter() - t0)
        return 2 * m * k * n / statistics.median(ts) / 1e9

    hot, square = rate(4096, 128, 256, 50), rate(1024, 1024, 1024, 10)
    hot_native = rate(4096, 128, 256, 50, use_native=True) if native.gemm_enabled() else None
    gflop = flops[0] / 1e9
    result = {"gemm_calls": calls[0], "gflop": gflop, "in_call_seconds": seconds[0],
              "in_call_gflops": gflop / seconds[0], "hot_gflops_4096x128x256": hot, "hot_gflops_1024cubed": square,
              "floor_seconds": gflop / max(hot, hot_native or 0.0)}
    result["call_seconds"] = call_seconds
    result["chunk_loops"] = {"call_seconds": chunk_call}
    if mkl:
        result["mkl_only"] = mkl
    if native_stats["calls"]:
        result.update(native_gemm_calls=native_stats["calls"], native_gflop=native_stats["flops"] / 1e9,
                      native_in_call_seconds=native_stats["seconds"],
                      native_in_call_gflops=native_stats["flops"] / 1e9 / native_stats["seconds"],
                      hot_native_gflops_4096x128x256=hot_native)
    if chgnet_seconds:
        result["floor_ratio_vs_chgnet"] = result["floor_seconds"] / chgnet_seconds
    return result


def markdown(path: str, command: bool = True) -> str:
    """The docs' table from a results file (so the numbers are never retyped); ``command``:
    name the command and commit that made it (the docs give them in a line of their own)."""
    import json

    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    names = list(rows[0]["seconds"])
    ours = [k for k in names if k != "CHGNet"]
    head = "| structure | call | " + " | ".join(f"{k} (s)" for k in names) + " | " + \
        " | ".join(f"{k} / CHGNet" for k in ours if "CHGNet" in names) + " |"
    lines = [head, "|" + "---|" * 2 + "---:|" * (head.count("|") - 3)]
    for r in rows:
        ratios = [f"{r['ratio_vs_chgnet'][k]:.1f}×" for k in ours] if "ratio_vs_chgnet" in r else []
        lines.append(f"| {r['structure']} | {r['kind']} | " + " | ".join(f"{r['seconds'][k]:.3g}" for k in names)
                     + " | " + " | ".join(ratios) + " |")
    if data.get("chgnet_allocator"):
        a = data["chgnet_allocator"]["seconds"]
        lines.append(f"\nCHGNet's Si64 E+F+S call, interleaved after the table's rounds: {a['kept']:.3g} s with the "
                     f"kept-memory setting (as in the table), {a['glibc']:.3g} s with glibc's limits put back "
                     f"(as in a process of its own).")
    if data.get("train_steps"):
        lines += ["", "| training step, Si8 | default kernels (s) | composed ops (s) |", "|---|---:|---:|"]
        lines += [f"| {r['config']} config | {r['seconds']['default']:.3g} | {r['seconds']['torch']:.3g} |"
                  for r in data["train_steps"]]
    if data.get("op_shares"):
        fams = data["op_shares"]["families"]
        lines.append("\nOne Si64 call of the default path with the chunk loops (GEMMs and loops as calls of their "
                     "own), torch.profiler self CPU time: " + ", ".join(
                         f"{k} {100 * v['share']:.0f} %" for k, v in fams.items()) + ".")
    if data.get("gemm_floor"):
        g = data["gemm_floor"]
        ratio = (f", {g['floor_ratio_vs_chgnet']:.1f}× CHGNet's median" if "floor_ratio_vs_chgnet" in g else "")
        own = (f" ({g['native_gflop']:.1f} GFLOP of it in the native kernel: {g['native_in_call_seconds']:.2f} s, "
               f"{g['native_in_call_gflops']:.0f} GFLOP/s)" if g.get("native_gemm_calls") else "")
        own_hot = (f", {g['hot_native_gflops_4096x128x256']:.0f} in the native kernel"
                   if g.get("hot_native_gflops_4096x128x256") else "")
        if g.get("mkl_only"):
            m = g["mkl_only"]
            chunk = g.get("chunk_loops", {}).get("call_seconds")
            lines.append(f"\nThe same Si64 call with every GEMM in MKL (`MATRIS_NATIVE_GEMM=0`), just before: "
                         f"{m['call_seconds']:.2f} s, its GEMMs {m['gemm_seconds']:.2f} s ({m['gemm_gflops']:.0f} GFLOP/s); "
                         + (f"with the native kernel in the chunk loops: {chunk:.2f} s, GEMMs "
                            f"{g['in_call_seconds']:.2f} s; as by default (whole passes in one call each): "
                            f"{g['call_seconds']:.2f} s." if chunk else
                            f"with the native kernel: {g['call_seconds']:.2f} s, GEMMs {g['in_call_seconds']:.2f} s."))
        lines.append(f"\nThe GEMMs of one Si64 call: {g['gemm_calls']:,} calls, {g['gflop']:.1f} GFLOP, "
                     f"{g['in_call_seconds']:.2f} s ({g['in_call_gflops']:.0f} GFLOP/s) within the call"
                     f"{' with the chunk loops' if 'chunk_loops' in g else ''}{own}. In cache, "
                     f"right after it, the dominant shape (4,096 × 128 → 256) ran at {g['hot_gflops_4096x128x256']:.0f} "
                     f"GFLOP/s in MKL{own_hot}, and a 1,024³ GEMM at {g['hot_gflops_1024cubed']:.0f}: the GEMMs alone "
                     f"need at least {g['floor_seconds']:.2f} s{ratio}.")
    meta = data["meta"]
    how = f"{data['threads']} threads, {data['rounds']} interleaved rounds (medians)."
    lines.append(f"\n`{meta['command']}` at commit `{(meta['commit'] or '')[:10]}`, {how}" if command else f"\n{how}")
    for k, t in (data.get("compile_seconds") or {}).items():
        lines.append(f"First call of `{k}` (compilation included): {t:.0f} s.")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--markdown", default=None, metavar="JSON", help="print the docs' table of a results file and exit")
    p.add_argument("--sizes", type=int, nargs="*", default=[8, 64, 216], help="Si cells (multiples of 8 atoms)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (median reported)")
    p.add_argument("--variants", nargs="*", default=["chunked", "chunked-ops", "torch"],
                   help="chunked, chunked-ops, torch, compiled")
    p.add_argument("--md-steps", type=int, default=5, help="VelocityVerlet steps of Si64 per variant (0: skip)")
    p.add_argument("--no-chgnet", action="store_true", help="do not compare with CHGNet")
    p.add_argument("--no-profile", action="store_true", help="skip the op-family table and the GEMM floor")
    p.add_argument("--train", action="store_true", help="also time a training step (tiny and 10M configs)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(args.markdown))
        return 0

    torch.manual_seed(0)
    base = MatRIS(MatRISConfig(num_layers=10, three_body_cutoff=4.5, reference_energy="mptrj")).eval()
    calcs = {}
    compile_times = {}
    compile_errors = {}
    for v in args.variants:
        model = build_model(v, base)
        calcs[v] = MatRISCalculator(model, device="cpu", dtype=torch.float32)
    chgnet = None
    if not args.no_chgnet:
        try:
            from matris.bench.runners import CHGNetRunner, NotAvailable

            runner = CHGNetRunner()
            runner.load(torch.device("cpu"), "float32")
            chgnet = runner.calculator()
        except (ImportError, NotAvailable) as exc:
            print(f"CHGNet not compared: {exc}", file=sys.stderr)
    names = list(calcs) + (["CHGNet"] if chgnet is not None else [])
    allcalcs = dict(calcs, **({"CHGNet": chgnet} if chgnet is not None else {}))

    print(f"MatRIS 10-block width-128 ({base.num_parameters():,} parameters), float32, CPU, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.rounds} interleaved rounds, medians")
    rows = []
    for n in args.sizes:
        atoms = standard_structure("si", n).atoms
        for k in list(names):  # warm-up; the first call of "compiled" is its compile
            t0 = time.perf_counter()
            allcalcs[k].reset()
            try:
                with loops_for(k):
                    allcalcs[k].calculate(atoms, ["energy", "forces", "stress"])
            except Exception as exc:  # noqa: BLE001 - a compiler failure is a result, not the end of the run
                if k != "compiled":
                    raise
                print(f"compiled variant dropped: {type(exc).__name__}: {str(exc)[:300]}")
                compile_errors[k] = f"{type(exc).__name__}: {str(exc)[:1000]}"
                names.remove(k)
                del calcs[k]
                continue
            if k == "compiled" and n == args.sizes[0]:
                compile_times[k] = time.perf_counter() - t0
        times = {k: [] for k in names}
        for _ in range(args.rounds):
            for k in names:
                c = allcalcs[k]
                with loops_for(k):
                    if k == "CHGNet":  # settle: see the module docstring
                        c.reset()
                        c.calculate(atoms, ["energy", "forces", "stress"])
                    c.reset()
                    t0 = time.perf_counter()
                    c.calculate(atoms, ["energy", "forces", "stress"])
                    times[k].append(time.perf_counter() - t0)
        row = {"structure": f"Si{n}", "atoms": n, "kind": "E+F+S",
               "seconds": {k: statistics.median(v) for k, v in times.items()}, "all_seconds": times}
        rows.append(row)
    if args.md_steps > 0:
        atoms = standard_structure("si", 64).atoms
        times = {k: [] for k in names}
        for _ in range(max(1, args.rounds // 2)):
            for k in names:
                calc = allcalcs[k]
                if k in calcs:  # MD asks for forces only, as `matris md` does
                    calc = MatRISCalculator(calcs[k].model, device="cpu", dtype=torch.float32, compute_stress=False)
                with loops_for(k):
                    times[k].append(md_speed(atoms, calc, args.md_steps).seconds / args.md_steps)
        rows.append({"structure": "Si64", "atoms": 64, "kind": "MD step",
                     "seconds": {k: statistics.median(v) for k, v in times.items()}, "all_seconds": times})

    width = {k: max(15, len(k) + 8) for k in names}
    head = f"{'structure':10s} {'call':8s}" + "".join(f"{k + ' (s)':>{width[k]}s}" for k in names)
    if chgnet is not None:
        head += "".join(f"{k + '/CHGNet':>{width[k] + 4}s}" for k in calcs)
    print(head)
    print("-" * len(head))
    for row in rows:
        s = row["seconds"]
        line = f"{row['structure']:10s} {row['kind']:8s}" + "".join(f"{s[k]:{width[k]}.4f}" for k in names)
        if chgnet is not None:
            row["ratio_vs_chgnet"] = {k: s[k] / s["CHGNet"] for k in calcs}
            line += "".join(f"{row['ratio_vs_chgnet'][k]:{width[k] + 3}.1f}×" for k in calcs)
        print(line)
    for k, t in compile_times.items():
        print(f"{k}: first call (compile included) {t:.1f} s")

    def save(train_rows, shares):
        if args.json:
            write_json(args.json, {"meta": provenance(argv, model_name="MatRIS 10-block width-128, random weights"),
                                   "threads": torch.get_num_threads(), "rounds": args.rounds, "rows": rows,
                                   "native_loops": native.library() is not None,
                                   "compile_seconds": compile_times, "compile_errors": compile_errors,
                                   "op_shares": shares, "train_steps": train_rows, "chgnet_allocator": alloc,
                                   "gemm_floor": floor})

    alloc = chgnet_allocator(chgnet, args.rounds) if chgnet is not None else None
    if alloc:
        print(f"CHGNet Si64 E+F+S: {alloc['seconds']['kept']:.4f} s with the kept-memory setting (as above), "
              f"{alloc['seconds']['glibc']:.4f} s with glibc's limits put back")
    floor = None
    save([], None)  # what is measured so far survives a later failure
    train_rows = train_steps(args.rounds) if args.train else []

    shares = None
    if not args.no_profile:
        default = args.variants[0]
        shares = op_shares(calcs[default], standard_structure("si", 64).atoms)
        print(f"\nwhere the time goes: one Si64 E+F+S call, variant {default!r} with the chunk loops, torch.profiler "
              f"self CPU time (profiler overhead included: {shares['total_ms']:.0f} ms)")
        for fam, v in shares["families"].items():
            print(f"  {fam:20s} {v['ms']:9.1f} ms  {100 * v['share']:5.1f} %")
        print("  top ops: " + ", ".join(f"{o['op'].removeprefix('aten::')} {o['ms']:.0f} ms" for o in shares["top_ops"]))
        si64 = next((r for r in rows if r["structure"] == "Si64" and r["kind"] == "E+F+S"), None)
        floor = gemm_floor(calcs[default], standard_structure("si", 64).atoms,
                           si64["seconds"].get("CHGNet") if si64 else None)
        if floor.get("mkl_only"):
            m = floor["mkl_only"]
            print(f"  one Si64 call, every GEMM in MKL: {m['call_seconds']:.2f} s (GEMMs {m['gemm_seconds']:.2f} s, "
                  f"{m['gemm_gflops']:.0f} GFLOP/s); native GEMM in the chunk loops: "
                  f"{floor['chunk_loops']['call_seconds']:.2f} s (GEMMs {floor['in_call_seconds']:.2f} s); "
                  f"default (whole passes): {floor['call_seconds']:.2f} s")
        if floor.get("native_gemm_calls"):
            print(f"  native GEMM: {floor['native_gemm_calls']} calls, {floor['native_gflop']:.1f} GFLOP, "
                  f"{floor['native_in_call_seconds']:.2f} s in the call ({floor['native_in_call_gflops']:.0f} GFLOP/s); "
                  f"in cache {floor['hot_native_gflops_4096x128x256']:.0f} GFLOP/s (4096x128->256)")
        print(f"  GEMMs: {floor['gemm_calls']} calls, {floor['gflop']:.1f} GFLOP, {floor['in_call_seconds']:.2f} s in the "
              f"call ({floor['in_call_gflops']:.0f} GFLOP/s); MKL in cache {floor['hot_gflops_4096x128x256']:.0f} GFLOP/s "
              f"(4096x128->256), {floor['hot_gflops_1024cubed']:.0f} GFLOP/s (1024^3): floor "
              f"{floor['floor_seconds']:.2f} s" + (f" = {floor['floor_ratio_vs_chgnet']:.1f}x CHGNet"
                                                    if "floor_ratio_vs_chgnet" in floor else ""))

    save(train_rows, shares)
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
