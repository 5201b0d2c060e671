"""CPU speed of the published architecture against CHGNet and the official MatRIS 1.0.0, side by side.

    python -m benchmarks.cpu_speed                      # Si 8/64/216, MD of Si64, op shares
    python -m benchmarks.cpu_speed --official SITE --json benchmarks/results/cpu_speed.json
    python -m benchmarks.cpu_speed --sizes 8 64 --rounds 3 --variants fused torch
    python -m benchmarks.cpu_speed --markdown benchmarks/results/cpu_speed.json   # the docs' table

Model: the published MatRIS-10M architecture (``MatRISConfig.published_10m()``: 10 blocks of width
128, Fourier three-body basis, LayerNorm, no Linear biases, energy head (256, 128, 128), r_c 6 Å,
r_3 4.5 Å; 10,443,505 parameters), random weights (speed does not depend on their values),
float32. Every call is an ASE calculator call for energy, forces and stress on a freshly rattled
diamond-Si cell (``matris.bench``'s standard structures), graph construction included, as a
user's script sees it.

Columns: ``fused`` (the default CPU path: the fused operators of :mod:`matris.kernels`, C++
kernels in ``kernels/csrc/cpu``), ``torch`` (the composed PyTorch reference ops), ``compiled``
(``model.compile()``: Inductor, dynamic shapes; its compile time is reported apart), CHGNet 0.3.0
in the same process when installed, and, with ``--official SITE``, the official MatRIS 1.0.0 (the
unpacked PyPI wheel at SITE) on the same weights in a process of its own
(``benchmarks/official.py``), in its fastest CPU setting (``mode="torch"``,
``activation_checkpoint=False``) and in its default one (activation checkpointing), the time of its
calculator call measured inside its process. The machine is shared and noisy, so every column is
timed in interleaved rounds (one call each per round) and the table reports medians over rounds
and ratios of medians: ``ratio`` is ours / CHGNet (lower is better), ``speed-up`` official / ours.
CHGNet's timed call follows an untimed one of its own (the memory another call released lands on
whoever runs next).

``heap``: the same Si64 call of ours with glibc's malloc as it is (the default) and with
:func:`matris.heap.keep_freed_memory` (opt-in), interleaved: the measured gain of that
setting. The JSON records the CPU model and its widest instruction set (``meta.cpu``) and the
fused operators' float32 GEMM kernel that ran (``native``: ``avx512``, ``avx2`` or ``portable``).

The op table is torch.profiler's self CPU time of one Si64 call of the default variant,
grouped by family, so the next person sees where the time goes; "fused operators" is the self
time of ``torch.ops.matris.*`` (each a whole formula: its GEMMs, gathers, scatters and
elementwise steps in one pass). Under it, the GEMM floor against plain MKL: the GEMM FLOPs of one
Si64 call (counted on the composed reference ops, which run the same products as MKL GEMMs, with
their time there), this machine's in-cache MKL rate right after, and the least time those GEMMs
need at that rate (``benchmarks.common.gemm_gflops``, the measurement of every benchmark's GEMM rate).

``--train`` also times one training step (energy, force, stress and magmom loss with
``create_graph``, backward) of Si8 (Si64 needs more than 20 GB with the 10M architecture) for
the tiny config (examples/configs/tiny.yaml) and the published 10M architecture, the default
kernels against the composed ops (``torch``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, command_now, cpu_description, gemm_gflops, provenance, write_json
from matris import MatRIS, MatRISCalculator, MatRISConfig, heap
from matris.bench.measure import md_speed
from matris.bench.structures import standard_structure
from matris.kernels import native

FAMILIES = {
    "GEMM": ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm"),
    "gather/scatter": ("index_select", "index_add", "index_add_", "scatter_add_", "scatter_reduce_", "scatter_reduce",
                       "scatter_add", "gather", "index", "index_put_", "index_reduce_", "embedding"),
    "copy/alloc": ("cat", "copy_", "fill_", "zero_", "zeros", "empty", "empty_like", "zeros_like", "clone", "stack",
                   "contiguous", "full", "new_zeros", "to", "_to_copy"),
}


def fused_key(key: str) -> bool:
    """A fused operator as the profiler names it: ``matris::gated_phi``, …, and the autograd
    wrappers under whose names the forward kernels' own time is recorded
    (``GeneratedBackwardFor_matris_gated_phi_default``; the operator's node keeps its dispatch)."""
    return key.startswith(("matris::", "GeneratedBackwardFor_matris_"))


def counted(key: str) -> bool:
    """Whether a profiler key is an op's own time (ATen ops and the fused operators)."""
    return key.startswith("aten::") or fused_key(key)


def family(op: str) -> str:
    if fused_key(op):
        return "fused operators"
    name = op.removeprefix("aten::")
    for fam, names in FAMILIES.items():
        if name in names:
            return fam
    return "elementwise/other"


def op_shares(calc, atoms) -> dict:
    """Self CPU time (ms) per op family and the top ops of one E+F+S call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        calc.reset()
        calc.calculate(atoms, ["energy", "forces", "stress"])
    per_family: dict[str, float] = {}
    ops = []
    for ev in prof.key_averages():
        if not counted(ev.key):
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
        model.options.kernels = "torch"
    elif variant == "compiled":
        model.compile()
    elif variant != "fused":
        raise SystemExit(f"unknown variant {variant!r}; use fused, torch or compiled")
    return model


def heap_gain(calc, rounds: int, size: int = 64) -> dict:
    """Our Si``size`` E+F+S call with glibc's malloc as the process has it (the default) and with
    :func:`matris.heap.keep_freed_memory` (opt-in), interleaved: each timed call follows an
    untimed one in its mode. glibc's behaviour is put back at the end."""
    atoms = standard_structure("si", size).atoms
    times = {"glibc": [], "kept": []}
    if not heap.set_keep(True):
        return {"available": False}
    try:
        for _ in range(rounds):
            for mode in times:
                heap.set_keep(mode == "kept")
                for timed in (False, True):
                    calc.reset()
                    t0 = time.perf_counter()
                    calc.calculate(atoms, ["energy", "forces", "stress"])
                    if timed:
                        times[mode].append(time.perf_counter() - t0)
    finally:
        heap.set_keep(False)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"available": True, "structure": f"Si{size}", "kind": "E+F+S", "seconds": med, "all_seconds": times,
            "gain": med["glibc"] / med["kept"]}


def train_steps(rounds: int) -> list[dict]:
    """One optimizer step of E+F+S+magmom loss on Si8, default kernels vs composed ops, interleaved."""
    from matris import GraphBatch
    from matris.structures import to_system
    from matris.train import TrainConfig

    tiny = TrainConfig.from_yaml(ROOT / "examples" / "configs" / "tiny.yaml").model
    configs = {"tiny": tiny, "10M": MatRISConfig.published_10m()}
    system = to_system(standard_structure("si", 8).atoms)  # Si64 needs > 20 GB for the 10M config
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
                model.options.kernels = None if backend == "default" else "torch"
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


def gemm_floor(calc, atoms, chgnet_seconds: float | None) -> dict:
    """How far the GEMMs alone are from the target, against plain MKL: the GEMM FLOPs of one E+F+S
    call of the composed reference ops (every ``mm``/``addmm``/``bmm`` counted and timed as it is
    dispatched: the products the fused operators compute, as MKL GEMMs), the default path's time
    of the same call, and this machine's MKL rate right after on the call's dominant shape (4,096
    angle rows × 128 → 256, operands in cache) and on a 1,024³ GEMM. ``floor_seconds`` is the
    call's GEMM FLOPs at the in-cache rate of the dominant shape: the least time these GEMMs need
    in MKL on this machine at that moment."""
    from torch.utils._python_dispatch import TorchDispatchMode

    flops, seconds, calls = [0], [0.0], [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name not in GEMM_OPS:
                return func(*args, **(kwargs or {}))
            a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
            batch = a.shape[0] if a.dim() == 3 else 1
            t0 = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            seconds[0] += time.perf_counter() - t0
            flops[0] += 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]
            calls[0] += 1
            return out

    model = calc.model
    previous = model.options.kernels
    model.options.kernels = "torch"
    try:
        calc.reset()
        with Count():
            calc.calculate(atoms, ["energy", "forces", "stress"])
    finally:
        model.options.kernels = previous
    calc.reset()
    t0 = time.perf_counter()
    calc.calculate(atoms, ["energy", "forces", "stress"])
    call_seconds = time.perf_counter() - t0

    hot, square = gemm_gflops(4096, 128, 256, 50), gemm_gflops(1024, 1024, 1024, 10)
    gflop = flops[0] / 1e9
    result = {"gemm_calls": calls[0], "gflop": gflop, "reference_gemm_seconds": seconds[0],
              "reference_gemm_gflops": gflop / seconds[0], "hot_gflops_4096x128x256": hot,
              "hot_gflops_1024cubed": square, "floor_seconds": gflop / hot, "call_seconds": call_seconds}
    if chgnet_seconds:
        result["floor_ratio_vs_chgnet"] = result["floor_seconds"] / chgnet_seconds
    return result


def markdown_rows(rows: list[dict]) -> str:
    """The table of timed calls: seconds per column, ours / CHGNet and the official code's time / ours."""
    names = list(dict.fromkeys(k for r in rows for k in r["seconds"]))
    ours = [k for k in names if k != "CHGNet" and k not in OFFICIAL]
    has_chgnet = any("ratio_vs_chgnet" in r for r in rows)
    officials = [o for o in OFFICIAL if any(o in r.get("speedup_vs_official", {}) for r in rows)]
    head = ("| structure | call | " + " | ".join(f"{k} (s)" for k in names) + " |"
            + "".join(f" {k} / CHGNet |" for k in ours if has_chgnet)
            + "".join(f" {o} / {ours[0]} |" for o in officials))
    lines = [head, "|---|---|" + "---:|" * (head.count("|") - 3)]
    for r in rows:
        cells = [f"{r['seconds'][k]:.3g}" if k in r["seconds"] else "–" for k in names]
        if has_chgnet:
            cells += [f"{r['ratio_vs_chgnet'][k]:.1f}×" if "ratio_vs_chgnet" in r else "–" for k in ours]
        for o in officials:  # how many times longer the official call takes than our default path's
            sp = r.get("speedup_vs_official", {}).get(o)
            cells.append(f"{sp[ours[0]]:.2f}×" if sp else "–")
        lines.append(f"| {r['structure']} | {r['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(path: str, command: bool = True) -> str:
    """The docs' table from a results file (so the numbers are never retyped); ``command``:
    name the command and commit that made it (the docs give them in a line of their own)."""
    import json

    data = json.loads(Path(path).read_text())
    lines = [markdown_rows(data["rows"])]
    cpu = data["meta"].get("cpu")
    if cpu:
        kernel = (data.get("native") or {}).get("instruction_set")
        lines.append(f"\nCPU: {cpu['model']} ({cpu['isa']})"
                     + (f"; the fused operators' float32 GEMM kernel: {kernel}." if kernel else "."))
    if data.get("official"):
        o = data["official"]
        lines.append(f"\n`official`: MatRIS {o.get('matris', '1.0.0')} on the same weights, `mode=\"torch\"`, "
                     "`activation_checkpoint=False` (its fastest CPU setting); `official-ckpt`: its default "
                     "(activation checkpointing); each timed inside its own process.")
    if data.get("heap", {}).get("available"):
        h = data["heap"]
        lines.append(f"\nMemory reuse (opt-in `matris.heap.keep_freed_memory()` or glibc's `GLIBC_TUNABLES`): "
                     f"{h['structure']} E+F+S {h['seconds']['glibc']:.3g} s with glibc's malloc as it is, "
                     f"{h['seconds']['kept']:.3g} s with it ({h['gain']:.2f}×), interleaved.")
    if data.get("train_steps"):
        lines += ["", "| training step, Si8 | default kernels (s) | composed ops (s) |", "|---|---:|---:|"]
        lines += [f"| {r['config']} config | {r['seconds']['default']:.3g} | {r['seconds']['torch']:.3g} |"
                  for r in data["train_steps"]]
    if data.get("op_shares"):
        fams = data["op_shares"]["families"]
        lines.append("\nOne Si64 call of the default path, torch.profiler self CPU time: " + ", ".join(
            f"{k} {100 * v['share']:.0f} %" for k, v in fams.items()) + ".")
    if (data.get("gemm_floor") or {}).get("reference_gemm_seconds"):  # (older result files have another form)
        g = data["gemm_floor"]
        ratio = (f", {g['floor_ratio_vs_chgnet']:.1f}× CHGNet's median" if "floor_ratio_vs_chgnet" in g else "")
        lines.append(f"\nThe GEMMs of one Si64 call: {g['gflop']:.1f} GFLOP ({g['gemm_calls']:,} MKL calls in the "
                     f"composed reference ops, {g['reference_gemm_seconds']:.2f} s there). In cache, right after, the "
                     f"dominant shape (4,096 × 128 → 256) ran at {g['hot_gflops_4096x128x256']:.0f} GFLOP/s in MKL "
                     f"and a 1,024³ GEMM at {g['hot_gflops_1024cubed']:.0f}: the GEMMs alone need at least "
                     f"{g['floor_seconds']:.2f} s in MKL{ratio}; the whole call of the fused path took "
                     f"{g['call_seconds']:.2f} s.")
    meta = data["meta"]
    how = f"{data['threads']} threads, {data['rounds']} interleaved rounds (medians)."
    run = f"`{command_now(meta['command'])}` at commit `{(meta['commit'] or '')[:10]}`, "
    lines.append(f"\n{run}{how}" if command else f"\n{how}")
    for k, t in (data.get("compile_seconds") or {}).items():
        lines.append(f"First call of `{k}` (compilation included): {t:.0f} s.")
    return "\n".join(lines)


def official_worker(site: str, base: MatRIS, folder: Path):
    """The official 1.0.0 code in a process of its own on ``base``'s weights (float32, our thread
    count), or None with a message when it cannot run."""
    from benchmarks.official import OfficialWorker, OfficialWorkerError, save_official_checkpoint

    path = save_official_checkpoint(base, folder / "published-10m-random.pth.tar")
    worker = OfficialWorker(site=site)
    try:
        info = worker.load(path, mode="torch", activation_checkpoint=False, dtype="float32",
                           threads=torch.get_num_threads())
    except OfficialWorkerError as exc:
        worker.close()
        print(f"the official MatRIS is not compared: {exc}", file=sys.stderr)
        return None, None
    return worker, info


OFFICIAL = {"official": False, "official-ckpt": True}  # column -> its activation_checkpoint setting


def main(argv=None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--markdown", default=None, metavar="JSON", help="print the docs' table of a results file and exit")
    p.add_argument("--sizes", type=int, nargs="*", default=[8, 64, 216], help="Si cells (multiples of 8 atoms)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (median reported)")
    p.add_argument("--variants", nargs="*", default=["fused", "torch"], help="fused, torch, compiled")
    p.add_argument("--md-steps", type=int, default=5, help="VelocityVerlet steps of Si64 per variant (0: skip)")
    p.add_argument("--no-chgnet", action="store_true", help="do not compare with CHGNet")
    p.add_argument("--official", default=None, metavar="SITE",
                   help="compare with the official MatRIS 1.0.0 unpacked at SITE (see benchmarks/official.py)")
    p.add_argument("--official-max-atoms", type=int, default=64, help="largest cell the official code is timed on")
    p.add_argument("--heap-size", type=int, default=64, help="Si cell of the heap setting's measurement (0: skip)")
    p.add_argument("--no-profile", action="store_true", help="skip the op-family table and the GEMM floor")
    p.add_argument("--train", action="store_true", help="also time a training step (tiny and 10M configs)")
    p.add_argument("--no-avx512", action="store_true",
                   help="build the fused operators without AVX-512 (-mno-avx512f, a cache folder of its own): "
                        "the AVX2 kernels, timed on this CPU")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(args.markdown))
        return 0
    if args.no_avx512:  # before the first build; the flags are part of the library's hash
        native.FLAGS.append("-mno-avx512f")

    torch.manual_seed(0)
    base = MatRIS(MatRISConfig.published_10m()).eval()
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
    tmp = tempfile.TemporaryDirectory(prefix="matris-cpu-speed-")
    official, official_info = official_worker(args.official, base, Path(tmp.name)) if args.official else (None, None)
    names = list(calcs) + (["CHGNet"] if chgnet is not None else [])
    allcalcs = dict(calcs, **({"CHGNet": chgnet} if chgnet is not None else {}))

    def timed_call(k: str, atoms) -> float:
        if k in OFFICIAL:  # its calculator call, timed inside its process
            official.configure(activation_checkpoint=OFFICIAL[k])
            return official.evaluate(atoms)["seconds"]
        c = allcalcs[k]
        if k == "CHGNet":  # settle: see the module docstring
            c.reset()
            c.calculate(atoms, ["energy", "forces", "stress"])
        c.reset()
        t0 = time.perf_counter()
        c.calculate(atoms, ["energy", "forces", "stress"])
        return time.perf_counter() - t0

    isa = cpu_description()
    print(f"MatRIS published 10M architecture ({sum(p.numel() for p in base.parameters()):,} parameters), float32, "
          f"CPU {isa['model']} ({isa['isa']}), torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.rounds} interleaved rounds, medians")
    rows = []
    for n in args.sizes:
        atoms = standard_structure("si", n).atoms
        columns = names + ([k for k in OFFICIAL] if official is not None and n <= args.official_max_atoms else [])
        for k in list(columns):  # warm-up; the first call of "compiled" is its compile
            t0 = time.perf_counter()
            try:
                timed_call(k, atoms)
            except Exception as exc:  # noqa: BLE001 - a compiler failure is a result, not the end of the run
                if k != "compiled":
                    raise
                print(f"compiled variant dropped: {type(exc).__name__}: {str(exc)[:300]}")
                compile_errors[k] = f"{type(exc).__name__}: {str(exc)[:1000]}"
                names.remove(k)
                columns.remove(k)
                del calcs[k]
                continue
            if k == "compiled" and n == args.sizes[0]:
                compile_times[k] = time.perf_counter() - t0
        times = {k: [] for k in columns}
        for _ in range(args.rounds):
            for k in columns:
                times[k].append(timed_call(k, atoms))
        rows.append({"structure": f"Si{n}", "atoms": n, "kind": "E+F+S",
                     "seconds": {k: statistics.median(v) for k, v in times.items()}, "all_seconds": times})
    if args.md_steps > 0:
        atoms = standard_structure("si", 64).atoms
        times = {k: [] for k in names}
        for _ in range(max(1, args.rounds // 2)):
            for k in names:
                calc = allcalcs[k]
                if k in calcs:  # MD asks for forces only, as `matris md` does
                    calc = MatRISCalculator(calcs[k].model, device="cpu", dtype=torch.float32, compute_stress=False)
                times[k].append(md_speed(atoms, calc, args.md_steps).seconds / args.md_steps)
        rows.append({"structure": "Si64", "atoms": 64, "kind": "MD step",
                     "seconds": {k: statistics.median(v) for k, v in times.items()}, "all_seconds": times})

    for row in rows:
        s = row["seconds"]
        if "CHGNet" in s:
            row["ratio_vs_chgnet"] = {k: s[k] / s["CHGNet"] for k in calcs}
        if "official" in s:
            row["speedup_vs_official"] = {o: {k: s[o] / s[k] for k in calcs} for o in OFFICIAL if o in s}
    print(markdown_rows(rows))
    for k, t in compile_times.items():
        print(f"{k}: first call (compile included) {t:.1f} s")

    native_paths = {"library": native.library() is not None,
                    "instruction_set": native.instruction_set() if native.library() is not None else None}

    def save(train_rows, shares):
        if args.json:
            write_json(args.json, {"meta": provenance(argv, model_name="MatRIS published 10M architecture "
                                                                       "(MatRISConfig.published_10m()), "
                                                                       "random weights"),
                                   "threads": torch.get_num_threads(), "rounds": args.rounds, "rows": rows,
                                   "native": native_paths, "official": official_info,
                                   "compile_seconds": compile_times, "compile_errors": compile_errors,
                                   "op_shares": shares, "train_steps": train_rows, "heap": gain,
                                   "gemm_floor": floor})

    if official is not None:
        official.close()
    tmp.cleanup()
    gain = heap_gain(calcs[args.variants[0]], args.rounds, args.heap_size) if args.heap_size else {"available": False}
    if gain.get("available"):
        print(f"heap: {gain['structure']} E+F+S {gain['seconds']['glibc']:.3f} s with glibc's malloc as it is, "
              f"{gain['seconds']['kept']:.3f} s with keep_freed_memory(): {gain['gain']:.2f}x")
    floor = None
    save([], None)  # what is measured so far survives a later failure
    train_rows = train_steps(args.rounds) if args.train else []

    shares = None
    if not args.no_profile:
        default = args.variants[0]
        shares = op_shares(calcs[default], standard_structure("si", 64).atoms)
        print(f"\nwhere the time goes: one Si64 E+F+S call, variant {default!r}, torch.profiler "
              f"self CPU time (profiler overhead included: {shares['total_ms']:.0f} ms)")
        for fam, v in shares["families"].items():
            print(f"  {fam:20s} {v['ms']:9.1f} ms  {100 * v['share']:5.1f} %")
        print("  top ops: " + ", ".join(f"{o['op'].removeprefix('aten::')} {o['ms']:.0f} ms"
                                        for o in shares["top_ops"]))
        si64 = next((r for r in rows if r["structure"] == "Si64" and r["kind"] == "E+F+S"), None)
        floor = gemm_floor(calcs[default], standard_structure("si", 64).atoms,
                           si64["seconds"].get("CHGNet") if si64 else None)
        print(f"  GEMMs: {floor['gflop']:.1f} GFLOP ({floor['gemm_calls']} MKL calls in the reference ops, "
              f"{floor['reference_gemm_seconds']:.2f} s there); MKL in cache {floor['hot_gflops_4096x128x256']:.0f} "
              f"GFLOP/s (4096x128->256), {floor['hot_gflops_1024cubed']:.0f} GFLOP/s (1024^3): floor "
              f"{floor['floor_seconds']:.2f} s" + (f" = {floor['floor_ratio_vs_chgnet']:.1f}x CHGNet"
                                                    if "floor_ratio_vs_chgnet" in floor else "")
              + f"; the fused call {floor['call_seconds']:.2f} s")

    save(train_rows, shares)
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
