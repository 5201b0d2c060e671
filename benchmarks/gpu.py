"""GPU check and benchmark of the Triton path against the PyTorch reference path, in one call.

    python -m benchmarks.gpu --quick     # correctness + one E+F+S size, < 3 min (benchmarks/results/gpu-quick.json)
    python -m benchmarks.gpu             # everything, < 10 min on one H200 (benchmarks/results/gpu.json)
    TRITON_INTERPRET=1 python -m benchmarks.gpu --smoke      # CPU dry run of every code path (tiny sizes)

A run always reports: the JSON is rewritten (atomically) after every check, each check
catches its own errors (recorded with the last frame of the traceback), and every section
has a time budget after which its remaining checks are recorded as skipped.

Needs torch and triton only: structures are built here, graphs use vesin when installed and
a PyTorch neighbour search otherwise, and the fixtures are read without ase.

Sections (each check fails on its own, with the error recorded, without stopping the others):
1. correctness on the device: the fused operators (``gated_phi``, ``attention_pair``,
   ``refine_edges``) and the bases vs their references, and fixture parity in float64 through
   the Triton path;
2. kernels: median time (CUDA events) of the fused attention and gated Φ (forward, and forward
   with input gradients) and of the bases vs their references;
3. energy+forces+stress of the published 10M architecture (``MatRISConfig.published_10m()``:
   Fourier, LayerNorm), 64 to 8,192 atoms, Triton vs reference, with peak memory and time per atom;
4. one training step with a force loss (energy + forces, create_graph), Triton vs reference;
5. the largest bcc Fe cell whose E+F+S fits, within a time budget;
6. training throughput (structures/s, atoms/s) of the Lightning pipeline, tiny and 10M configs
   (needs lightning and pyyaml, both on the device image);
7. batched relaxation with torch-sim against the one-by-one ASE loop, structures/s
   (benchmarks/simulate.py; needs ase and torch-sim-atomistic, so without them it is
   skipped with the reason recorded);
8. MD steps/s of 64-atom Si, positions kept on the device and the graph rebuilt there
   every step (GraphBatch.from_tensors; on the host when vesin-torch is missing);
9. model.compile() and TF32: E+F+S of the 10M model at 1k-8k atoms eager vs compiled vs
   compiled+TF32 vs compiled with CUDA graphs (``mode="reduce-overhead"``) (compile time apart;
   dynamic shapes, so one compilation serves every size),
   and the accuracy cost of TF32: float32 energy and force errors against the float64
   fixture references with and without it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import ROOT, command, commit, synchronize, write_json
from matris import AtomicSystem, GraphBatch, MatRIS, MatRISConfig, memory
from matris.kernels import (
    attention_pair,
    attention_pair_reference,
    gated_phi,
    gated_phi_reference,
    refine_edges,
    refine_edges_reference,
)
from matris.kernels import basis as B
from matris.kernels.attention import Segments

RESULTS: dict = {}


# ---------------------------------------------------------------------------- helpers
def log(msg=""):
    print(msg, flush=True)


class Report:
    """Results by section and check, written to ``path`` after every check (temp + rename)."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None

    def write(self):
        if self.path is not None:
            write_json(self.path, RESULTS, default=str)


REPORT = Report(None)
BUDGETS: dict[str, float] = {}  # section number → seconds


def last_frame(exc: BaseException) -> str:
    """``file:line in function`` of the innermost traceback frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f"{Path(f.filename).name}:{f.lineno} in {f.name}: {f.line}"


class Section:
    """One section's results; :meth:`check` runs one measurement with its own error handling."""

    def __init__(self, name: str, budget_s: float):
        self.name, self.budget_s, self.t0 = name, budget_s, time.perf_counter()
        self.results = RESULTS.setdefault(name, {})

    def over_budget(self) -> bool:
        return time.perf_counter() - self.t0 > self.budget_s

    def check(self, key: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` stored under ``key``; errors and budget overruns recorded."""
        if self.over_budget():
            self.results[key] = {"skipped": f"section time budget of {self.budget_s:.0f} s spent"}
            log(f"   {key}: skipped (section budget of {self.budget_s:.0f} s spent)")
        else:
            try:
                self.results[key] = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - recorded; the other checks go on
                traceback.print_exc()
                self.results[key] = {"error": f"{type(exc).__name__}: {str(exc)[:1000]}", "where": last_frame(exc)}
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        REPORT.write()
        return self.results[key]


def section(name):
    def wrap(fn):
        def run(*a, **k):
            log(f"\n== {name}")
            sec = Section(name, BUDGETS.get(name.split(".")[0], 600.0))
            t0 = time.perf_counter()
            value = sec.check("_section", fn, sec, *a, **k)  # an error outside the checks lands here
            sec.results.pop("_section", None)
            if isinstance(value, dict):
                sec.results.update(value)
            sec.results["seconds"] = time.perf_counter() - t0
            REPORT.write()
            log(f"   ({time.perf_counter() - t0:.1f} s)")
        return run
    return wrap


SMOKE = False  # --smoke: one untimed-quality call per measurement (the interpreter is slow)


def median_time(fn, device, repeat=5, warmup=1):
    """Median seconds per call: CUDA events on a GPU, perf_counter elsewhere."""
    if SMOKE:
        repeat, warmup = 1, 0
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_mem_gb(device):
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def diamond_si(k, rattle=0.02, seed=0):
    a = 5.43
    basis = np.array([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0],
                      [.25, .25, .25], [.25, .75, .75], [.75, .25, .75], [.75, .75, .25]])
    return _supercell(basis, a, k, 14, rattle, seed, f"Si{8 * k**3}")


def bcc_fe(k, rattle=0.02, seed=0):
    return _supercell(np.array([[0, 0, 0], [.5, .5, .5]]), 2.87, k, 26, rattle, seed, f"Fe{2 * k**3}")


def _supercell(basis, a, k, z, rattle, seed, name):
    grid = np.stack(np.meshgrid(*[np.arange(k)] * 3, indexing="ij"), -1).reshape(-1, 1, 3)
    frac = ((grid + basis[None]) / k).reshape(-1, 3)
    cell = np.eye(3) * a * k
    pos = frac @ cell + np.random.default_rng(seed).normal(scale=rattle, size=frac.shape)
    return AtomicSystem(pos, cell, True, np.full(len(pos), z), name)


def read_extxyz(path):
    """The fixtures' simple extxyz (Lattice, species, pos) without ase."""
    from matris.graph.system import _SYMBOLS

    lines = Path(path).read_text().splitlines()
    out, k = [], 0
    while k < len(lines):
        n = int(lines[k])
        header = lines[k + 1]
        cell = np.array(re.search(r'Lattice="([^"]+)"', header).group(1).split(), float).reshape(3, 3)
        pbc = [c == "T" for c in re.search(r'pbc="([^"]+)"', header).group(1).split()]
        rows = [ln.split() for ln in lines[k + 2 : k + 2 + n]]
        numbers = [_SYMBOLS.index(r[0]) for r in rows]
        pos = np.array([r[1:4] for r in rows], float)
        out.append(AtomicSystem(pos, cell, pbc, numbers))
        k += n + 2
    return out


def graph_of(model, system, device, dtype):
    return GraphBatch.from_systems([system], model.cutoff, model.three_body_cutoff, dtype=dtype, device=device)


def published_model(device, dtype, smoke):
    """The published MatRIS-10M architecture (``MatRISConfig.published_10m()``: Fourier, LayerNorm),
    random weights; for ``--smoke`` a 1-block, width-16 model of the same family."""
    torch.manual_seed(0)
    cfg = (MatRISConfig.published_10m(num_layers=1, node_feat_dim=16, edge_feat_dim=16, three_body_feat_dim=16,
                                      mlp_hidden_dims=(16,), pairwise_cutoff=3.0, three_body_cutoff=2.5)
           if smoke else MatRISConfig.published_10m())
    return MatRIS(cfg).to(device=device, dtype=dtype).eval()


def close(a, b, tol):
    err = (a - b).abs().max().item() if a.numel() else 0.0
    return err <= tol * max(1.0, b.abs().max().item() if b.numel() else 0.0), err


# ---------------------------------------------------------------------------- sections
def _report(tag, checks):
    """Log ``{name: (ok, err)}`` and return it as JSON-ready dicts."""
    for k, (ok, err) in checks.items():
        log(f"   {tag:8s} {k:24s} {'ok' if ok else 'FAIL'}  max|Δ| {err:.2e}")
    return {k: {"ok": bool(ok), "max_abs_err": err} for k, (ok, err) in checks.items()}


def _operator_checks(e, c, n, device, dtype, tol):
    """The fused operators (matris::gated_phi, attention_pair, refine_edges: their CUDA kernels) against
    their references: forward and input gradients, both norms and the attention's three forms."""
    def r(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, dtype=dtype) * scale).requires_grad_()

    def compare(name, fn, ref, inputs):
        got, want = fn(), ref()
        got = (got,) if isinstance(got, torch.Tensor) else got
        want = (want,) if isinstance(want, torch.Tensor) else want
        for k, (a, b) in enumerate(zip(got, want)):
            checks[f"{name}_out{k}"] = close(a, b, tol)
        grads = [torch.randn_like(w) for w in want]
        ga = torch.autograd.grad(got, inputs, grads)
        gb = torch.autograd.grad(want, inputs, grads)
        for k, (a, b) in enumerate(zip(ga, gb)):
            checks[f"{name}_grad{k}"] = close(a, b, tol)

    checks = {}
    h, b = c, max(8, n // 2)
    idx = [torch.randint(0, b, (e,), device=device) for _ in range(3)]
    for norm in ("rms", "layer"):
        rows, projs = r(e, c), [r(b, 2 * h) for _ in range(3)]
        w = [r(2 * h, c, scale=0.1).detach(), r(2 * h).detach(), r(c, h, scale=0.1).detach(), r(c).detach(),
             r(c, h, scale=0.1).detach(), r(c).detach(), (r(c).abs() + 0.5).detach(), (r(c).abs() + 0.5).detach()]
        kw = dict(norm=norm, core_norm_bias=r(c).detach() if norm == "layer" else None,
                  gate_norm_bias=r(c).detach() if norm == "layer" else None)
        eps = 1e-5 if norm == "layer" else torch.finfo(dtype).eps
        terms = list(zip(projs, idx))
        compare(f"gated_phi_{norm}", lambda: gated_phi(rows, w[0], terms, *w[1:], eps, **kw),
                lambda: gated_phi_reference(rows, w[0], terms, *w[1:], eps, **kw), [rows, *projs])
    tgt, src = torch.randint(0, n - 3, (e,), device=device), torch.randint(0, n, (e,), device=device)
    m, y, weight, res = r(e, c), r(e, c), r(2 * c, c, scale=0.3).detach(), r(1, c).detach()
    compare("attention_line", lambda: attention_pair(y, weight, None, m, tgt, src, n, res),
            lambda: attention_pair_reference(y, weight, None, m, tgt, src, n, res), [y, m])
    proj, d2u = r(b, 2 * c), torch.randint(0, b, (e,), device=device)
    compare("attention_atom", lambda: attention_pair(proj, None, d2u, m, tgt, src, n),
            lambda: attention_pair_reference(proj, None, d2u, m, tgt, src, n), [proj, m])
    u, q = r(e, c), r(n, c)  # q per bond: the line graph's nodes
    ffn = [res, r(c, c, scale=0.3).detach(), r(c).detach(), r(c, c, scale=0.3).detach(), r(c).detach()]
    compare("refine_edges", lambda: refine_edges(u, q, src, tgt, n, y, *ffn),
            lambda: refine_edges_reference(u, q, src, tgt, n, y, *ffn), [u, q, y])
    compare("refine_sum", lambda: refine_edges(u, q, src, tgt, n), lambda: refine_edges_reference(u, q, src, tgt, n),
            [u, q])
    return checks


def _basis_checks(rows, device, dtype, tol):
    checks = {}
    r = (torch.rand(rows, device=device, dtype=dtype) * 6 + 0.5).requires_grad_()
    f = (torch.arange(1, 8, device=device, dtype=dtype) * math.pi).requires_grad_()
    checks["bessel"] = close(B.bessel(r, f, 6.0, 8), B.bessel_reference(r, f, 6.0, 8), tol)
    th = (torch.rand(rows, device=device, dtype=dtype) * 3).requires_grad_()
    rho = torch.full_like(th, 1 / 6)
    fac = torch.tensor(math.sqrt(2 / 216), dtype=torch.float32, device=device)
    checks["sh"] = close(B.spherical(th, rho, fac, 4, 4), B.sh_reference(th, rho, fac.to(dtype), 4, 4), tol)
    gt = torch.randn(rows, 16, device=device, dtype=dtype)
    checks["sh_backward"] = close(torch.autograd.grad(B.spherical(th, rho, fac, 4, 4), th, gt)[0],
                                  torch.autograd.grad(B.sh_reference(th, rho, fac.to(dtype), 4, 4), th, gt)[0], tol)
    ff = (torch.arange(1, 4, device=device, dtype=dtype) + 0.1)
    checks["fourier"] = close(B.fourier(th, ff), B.fourier_reference(th, ff), tol)
    return checks


def _parity(folder, device):
    base = ROOT / "tests" / "fixtures" / "official-v0.9" / folder
    ref = json.loads((base / "reference.json").read_text())
    model = MatRIS.from_checkpoint(base / "checkpoint.pth.tar").to(device=device, dtype=torch.float64)
    model.options.kernels = "triton"
    worst = {"energy_per_atom": 0.0, "forces": 0.0, "stress": 0.0}
    pairs = list(zip(read_extxyz(base / "structures.extxyz"), ref["structures"]))
    for system, r in pairs[:1] if SMOKE else pairs:  # the interpreter is slow: one structure in a dry run
        o = model(graph_of(model, system, device, torch.float64))
        worst["energy_per_atom"] = max(worst["energy_per_atom"], abs(o.energy_per_atom.item() - r["energy_per_atom"]))
        worst["forces"] = max(worst["forces"], float(np.abs(o.forces.cpu().numpy() - r["forces"]).max()))
        worst["stress"] = max(worst["stress"], float(np.abs(o.stress[0].cpu().numpy() - r["stress_GPa"]).max()))
    ok = worst["energy_per_atom"] <= 1e-7 and worst["forces"] <= 1e-6 and worst["stress"] <= 1e-5
    log(f"   parity {folder:22s} {'ok' if ok else 'FAIL'}  " + "  ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return {"ok": ok, **worst}


def _sync_free(device, smoke):
    """The model's forward and force/stress backward under torch.cuda.set_sync_debug_mode("error")
    (the graph and its CSR layouts are built first: graph construction may synchronise)."""
    model = published_model(device, torch.float32, smoke)
    g = graph_of(model, diamond_si(1 if smoke else 2), device, torch.float32)
    g.segments()
    model(g)  # warm-up: kernel compilation and autotuning read the device
    synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = model(g)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ok = bool(torch.isfinite(out.forces).all())
    log(f"   forward + forces + stress without a host synchronisation: {'ok' if ok else 'FAIL'}")
    return {"ok": ok}


@section("1. correctness on the device")
def correctness(sec, device, smoke):
    torch.manual_seed(1)
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 2e-4)):
        tag = str(dtype)[6:]
        e, c, n = (300, 37, 41) if smoke else (100_003, 128, 6_007)
        sec.check(f"{tag}/operators", lambda: _report(tag, _operator_checks(e, c, n, device, dtype, tol)))
        sec.check(f"{tag}/bases", lambda: _report(tag, _basis_checks(99 if smoke else 50_001, device, dtype, tol)))
    for folder in ("small_sh_float64", "small_fourier_float64", "mixed_widths_float64"):
        sec.check(f"parity_float64_triton/{folder}", _parity, folder, device)
    if device.type == "cuda":
        sec.check("no_host_sync", _sync_free, device, smoke)


@section("2. kernels: time")
def kernels(sec, device, smoke):
    sec.results["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    e, c = (300, 32) if smoke else (2_000_000, 128)  # ≥ 1M angles
    n = e // 30

    def with_input_grads(fn, inputs):
        """Forward, then the input gradients (the force path: weights frozen)."""
        def run():
            out = fn()
            out = (out,) if isinstance(out, torch.Tensor) else out
            torch.autograd.grad(out, inputs, [torch.ones_like(o) for o in out])
        return run

    # the line graph's attention: both aggregations with their logits and the angles' residual update
    tgt, src = torch.randint(0, n, (e,), device=device), torch.randint(0, n, (e,), device=device)
    segs = (Segments.from_index(tgt, n), Segments.from_index(src, n))
    y, m = torch.randn(e, c, device=device), torch.randn(e, c, device=device)
    w_st, res = 0.3 * torch.randn(2 * c, c, device=device), torch.randn(1, c, device=device)
    sec.check("attention_pair_forward", _pair, lambda: attention_pair(y, w_st, None, m, tgt, src, n, res, segs),
              lambda: attention_pair_reference(y, w_st, None, m, tgt, src, n, res), device)
    y2, m2 = y.clone().requires_grad_(True), m.clone().requires_grad_(True)
    sec.check("attention_pair_forward_backward", _pair,
              with_input_grads(lambda: attention_pair(y2, w_st, None, m2, tgt, src, n, res, segs), (y2, m2)),
              with_input_grads(lambda: attention_pair_reference(y2, w_st, None, m2, tgt, src, n, res), (y2, m2)),
              device)
    # the gated Φ of a line-graph refine (one per-row term, three gathered, RMSNorm + SiLU), H = c
    b = max(8, n // 2)
    rows = torch.randn(e, c, device=device)
    projs = [torch.randn(b, 2 * c, device=device) for _ in range(3)]
    idx = [torch.randint(0, b, (e,), device=device) for _ in range(3)]
    w = [0.1 * torch.randn(2 * c, c, device=device), torch.randn(2 * c, device=device),
         0.1 * torch.randn(c, c, device=device), torch.randn(c, device=device), 0.1 * torch.randn(c, c, device=device),
         torch.randn(c, device=device), torch.rand(c, device=device) + 0.5, torch.rand(c, device=device) + 0.5]
    eps = torch.finfo(torch.float32).eps
    sec.check("gated_phi_forward", _pair, lambda: gated_phi(rows, w[0], list(zip(projs, idx)), *w[1:], eps),
              lambda: gated_phi_reference(rows, w[0], list(zip(projs, idx)), *w[1:], eps), device)
    rows2, projs2 = rows.clone().requires_grad_(True), [p.clone().requires_grad_(True) for p in projs]
    sec.check("gated_phi_forward_backward", _pair,
              with_input_grads(lambda: gated_phi(rows2, w[0], list(zip(projs2, idx)), *w[1:], eps), (rows2, *projs2)),
              with_input_grads(lambda: gated_phi_reference(rows2, w[0], list(zip(projs2, idx)), *w[1:], eps),
                               (rows2, *projs2)), device)
    nb = 200 if smoke else 1_000_000
    r = torch.rand(nb, device=device) * 6 + 0.5
    f = torch.arange(1, 8, device=device, dtype=torch.float32) * math.pi
    sec.check("bessel", _pair, lambda: B.bessel(r, f, 6.0, 8), lambda: B.bessel_reference(r, f, 6.0, 8), device)
    th = torch.rand(2 * nb, device=device) * 3
    rho = torch.full_like(th, 1 / 6)
    fac = torch.tensor(math.sqrt(2 / 216), dtype=torch.float32, device=device)
    sec.check("sh", _pair, lambda: B.spherical(th, rho, fac, 4, 4), lambda: B.sh_reference(th, rho, fac, 4, 4), device)
    ff = torch.arange(1, 4, device=device, dtype=torch.float32)
    sec.check("fourier", _pair, lambda: B.fourier(th, ff), lambda: B.fourier_reference(th, ff), device)
    log(f"   {'kernel':32s} {'triton (ms)':>12s} {'reference (ms)':>15s} {'speedup':>8s}")
    for k, v in sec.results.items():
        if isinstance(v, dict) and "triton_s" in v:
            log(f"   {k:32s} {1e3 * v['triton_s']:12.3f} {1e3 * v['reference_s']:15.3f} {v['speedup']:8.2f}")


def _pair(tri, ref, device):
    t, r = median_time(tri, device), median_time(ref, device)
    return {"triton_s": t, "reference_s": r, "speedup": r / t}


def _efs_row(model, system, device):
    g = graph_of(model, system, device, torch.float32)
    row = {"structure": system.name, "atoms": system.num_atoms, "angles": g.num_angles}
    for backend in ("triton", "torch"):
        model.options.kernels = backend
        reset_peak(device)
        try:
            t = median_time(lambda: model(g), device, repeat=3)
            row[backend] = {"s": t, "peak_gb": peak_mem_gb(device), "level": memory.inference_level(model, g)}
        except torch.OutOfMemoryError:
            row[backend] = {"s": None, "error": "out of memory"}
    model.options.kernels = None
    tt, tr = row["triton"].get("s"), row["torch"].get("s")
    row["speedup"] = tr / tt if tt and tr else None
    row["us_per_atom_triton"] = 1e6 * tt / system.num_atoms if tt else None
    log(f"   {system.name:10s} {system.num_atoms:6d} {g.num_angles:9d} {1e3 * (tt or float('nan')):12.1f} "
        f"{1e3 * (tr or float('nan')):10.1f} {row['speedup'] or float('nan'):8.2f} "
        f"{row['us_per_atom_triton'] or float('nan'):8.1f} {row['triton'].get('peak_gb', float('nan')):8.1f} "
        f"{row['triton'].get('level', -1):4d}")
    return row


@section("3. energy+forces+stress, Triton vs reference")
def efs(sec, device, smoke, quick=False):
    model = published_model(device, torch.float32, smoke)
    if smoke:
        systems = [diamond_si(1)]
    elif quick:
        systems = [bcc_fe(8)]  # 1,024 atoms
    else:
        systems = [diamond_si(2), bcc_fe(4), bcc_fe(6), bcc_fe(8), bcc_fe(10), bcc_fe(13), bcc_fe(16)]
    log(f"   {'structure':10s} {'atoms':>6s} {'angles':>9s} {'triton (ms)':>12s} {'ref (ms)':>10s} {'speedup':>8s} "
        f"{'µs/atom':>8s} {'peak GB':>8s} {'ckpt':>4s}")
    for system in systems:
        sec.check(system.name, _efs_row, model, system, device)
    rows = [v for v in sec.results.values() if isinstance(v, dict) and "atoms" in v]
    per_atom = [r["us_per_atom_triton"] for r in rows if r["atoms"] >= 1000 and r["us_per_atom_triton"]]
    spread = (max(per_atom) / min(per_atom) - 1) if len(per_atom) > 1 else None
    if spread is not None:
        log(f"   time per atom from 1,000 atoms up: spread {100 * spread:.1f}%")
    sec.results["per_atom_spread_from_1000"] = spread


@section("4. training step with force loss, Triton vs reference")
def training(sec, device, smoke):
    model = published_model(device, torch.float32, smoke).train()
    systems = [diamond_si(1, seed=s) for s in range(2)] if smoke else [diamond_si(2, seed=s) for s in range(4)]
    g = GraphBatch.from_systems(systems, model.cutoff, model.three_body_cutoff, dtype=torch.float32, device=device)
    target_e = torch.zeros(len(systems), device=device)
    target_f = torch.zeros(g.num_atoms, 3, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(g, compute_stress=False, create_graph=True)
        loss = ((out.energy_per_atom - target_e) ** 2).mean() + ((out.forces - target_f) ** 2).mean()
        loss.backward()
        opt.step()

    res = {"structures": len(systems), "atoms": g.num_atoms, "angles": g.num_angles}
    for backend in ("triton", "torch"):
        model.options.kernels = backend
        reset_peak(device)
        res[backend] = {"s": median_time(step, device, repeat=3), "peak_gb": peak_mem_gb(device)}
    res["speedup"] = res["torch"]["s"] / res["triton"]["s"]
    log(f"   batch of {len(systems)} ({g.num_atoms} atoms, {g.num_angles} angles): "
        f"triton {1e3 * res['triton']['s']:.1f} ms, "
        f"reference {1e3 * res['torch']['s']:.1f} ms, speedup {res['speedup']:.2f}×, "
        f"peak {res['triton']['peak_gb']:.1f} / {res['torch']['peak_gb']:.1f} GB")
    # the recompute modes of training (MatRIS.options.training_recompute), Triton path: peak memory
    # (torch.cuda.max_memory_allocated) and time, against the memory model
    model.options.kernels = "triton"
    res["recompute"] = {}
    for mode in ("none", "blocks", "rows"):
        model.options.training_recompute = mode
        reset_peak(device)
        took, peak = median_time(step, device, repeat=3), peak_mem_gb(device)
        need = (memory.training_fixed_bytes(model, ema=False) + int(memory.training_bytes(model,
            g.num_atoms, g.num_bonds, g.num_angles))) / 2**30
        res["recompute"][mode] = {"s": took, "peak_gb": peak, "model_gb": need}
        log(f"   recompute {mode:6s}: {1e3 * took:.1f} ms, peak {peak:.2f} GB (memory model {need:.2f} GB)")
    model.options.training_recompute = None
    return res


def _measured_call(model, system, device):
    """One E+F+S call of ``model`` on ``system`` from a reset peak: its graph and seconds."""
    reset_peak(device)
    g = graph_of(model, system, device, torch.float32)
    t1 = time.perf_counter()
    model(g)
    synchronize(device)
    return g, time.perf_counter() - t1


def _levels_per_angle(model, device, smoke):
    """Peak device memory (``max_memory_allocated`` above the model's own) of one E+F+S call per
    memory level on diamond Si cells, and a straight line through each level's peaks: bytes per
    angle (the GPU counterpart of benchmarks/system_size.py)."""
    rows, fits = [], {}
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    for k in ((1, 2) if smoke else (3, 4, 5)):
        system = diamond_si(k)
        for level in memory.INFERENCE_ORDER:
            model.options.memory_level = level
            try:
                g, seconds = _measured_call(model, system, device)
                peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else float("nan")
                rows.append({"atoms": system.num_atoms, "angles": g.num_angles, "level": level,
                             "s": seconds, "peak_bytes": peak})
                log(f"   Si{system.num_atoms:5d} level {level}: {rows[-1]['s']:.2f} s, peak {peak / 2**30:.2f} GiB")
                del g
            except torch.OutOfMemoryError:
                log(f"   Si{system.num_atoms:5d} level {level}: out of memory")
    model.options.memory_level = None
    for level in memory.INFERENCE_ORDER:
        pts = [(r["angles"], r["peak_bytes"]) for r in rows if r["level"] == level]
        if len(pts) >= 2 and device.type == "cuda":
            slope, fixed = np.polyfit(*zip(*pts), 1)
            fits[str(level)] = {"bytes_per_angle": float(slope), "fixed_bytes": float(fixed)}
            log(f"   level {level}: {slope / 1024:.2f} KiB per angle")
    return {"rows": rows, "fits": fits}


@section("5. memory per angle at each level, and the largest cell that fits (E+F+S, Triton path)")
def largest(sec, device, smoke, budget_s):
    model = published_model(device, torch.float32, smoke)
    model.options.kernels = "triton"
    per_level = _levels_per_angle(model, device, smoke)
    t0, best, k = time.perf_counter(), None, (1 if smoke else 16)
    while time.perf_counter() - t0 < min(budget_s, sec.budget_s):
        k = int(math.ceil(k * 1.25))
        system = bcc_fe(k)
        try:
            g, seconds = _measured_call(model, system, device)
            best = {"atoms": system.num_atoms, "angles": g.num_angles, "s": seconds,
                    "peak_gb": peak_mem_gb(device), "level": memory.inference_level(model, g)}
            log(f"   Fe {system.num_atoms:7d} atoms fits: {best['s']:.1f} s, peak {best['peak_gb']:.1f} GB, "
                f"level {best['level']}")
            del g
        except torch.OutOfMemoryError:
            log(f"   Fe {system.num_atoms:7d} atoms: out of memory")
            break
        if smoke:
            break
    return {"largest_fitting": best, "levels": per_level}


@section("6. training throughput, Lightning pipeline (tiny and 10M configs)")
def train_throughput(sec, device, smoke):
    from benchmarks.train_throughput import run as run_training

    configs = ["tiny.yaml"] if smoke else ["tiny.yaml", "matris-10m.yaml"]
    def one(name):
        r = run_training(ROOT / "examples" / "configs" / name, str(device), steps=3 if smoke else 30,
                         warmup=1 if smoke else 5, n_structures=32 if smoke else 512, atoms=(4, 32),
                         batch=4 if smoke else 32, precision="32")
        log(f"   {name:16s} {r['parameters']:11,d} params: {r['ms_per_step']:8.1f} ms/step, "
            f"{r['structures_per_s']:8.1f} structures/s, {r['atoms_per_s']:9.0f} atoms/s "
            f"(model {100 * r['model_share']:.0f}%)")
        return r

    for name in configs:
        sec.check(name, one, name)


@section("7. batched relaxation (torch-sim) vs one-by-one ASE, structures/s")
def simulate(sec, device, smoke):
    import importlib.util

    missing = [m for m in ("ase", "torch_sim") if importlib.util.find_spec(m) is None]
    if missing:
        log(f"   skipped: {', '.join(missing)} not installed (pip install 'matris-mlip[sim]')")
        return {"skipped": f"{', '.join(missing)} not installed"}
    from benchmarks.simulate import print_table
    from benchmarks.simulate import run as run_simulate

    runs = [dict(n=4, repeat=1, steps=10)] if smoke else [dict(n=64, repeat=1), dict(n=256, repeat=2, ase=False),
                                                           dict(n=32, repeat=2)]
    def one(kw):
        r = run_simulate(device=str(device), **kw)
        print_table(r)
        return r

    for k, kw in enumerate(runs):
        sec.check(f"run{k}", one, kw)


@section("8. MD of 64-atom Si on the device (velocity Verlet, graph rebuilt every step)")
def md_on_device(sec, device, smoke):
    from matris.graph.batch import device_builder_available

    model = published_model(device, torch.float32, smoke)
    system = diamond_si(1 if smoke else 2)
    on_device = device_builder_available()
    pos = torch.as_tensor(system.positions, dtype=torch.float32, device=device)
    cell = torch.as_tensor(system.cell, dtype=torch.float32, device=device).unsqueeze(0)
    pbc = torch.ones(3, dtype=torch.bool, device=device)
    z = torch.as_tensor(system.atomic_numbers, device=device)
    mass = torch.full((system.num_atoms, 1), 28.0855, device=device)
    vel = torch.zeros_like(pos)
    dt = 1.0 * 0.09822694788464063  # 1 fs in ASE time units (Å·sqrt(amu/eV))

    def forces(p):
        if on_device:
            g = GraphBatch.from_tensors(p, cell, pbc, z, [system.num_atoms], model.cutoff, model.three_body_cutoff)
        else:
            g = graph_of(model, AtomicSystem(p.cpu().numpy(), system.cell, True, system.atomic_numbers), device,
                         torch.float32)
        return model(g, compute_stress=False).forces

    def run(steps):
        nonlocal pos, vel
        f = forces(pos)
        for _ in range(steps):
            vel = vel + 0.5 * dt * f / mass
            pos = pos + dt * vel
            f = forces(pos)
            vel = vel + 0.5 * dt * f / mass
        synchronize(device)

    def measure():
        steps = 2 if smoke else 50
        run(2)  # warm-up
        t0 = time.perf_counter()
        run(steps)
        dt_s = (time.perf_counter() - t0) / steps
        res = {"atoms": system.num_atoms, "graph_on_device": on_device, "s_per_step": dt_s,
               "steps_per_s": 1 / dt_s, "ns_per_day": 86400 / dt_s * 1e-6}
        log(f"   Si{system.num_atoms}: {res['steps_per_s']:.1f} steps/s, {res['ns_per_day']:.2f} ns/day at 1 fs "
            f"(graph built on {'the device' if on_device else 'the host'})")
        return res

    for backend in ("triton", "torch"):
        model.options.kernels = backend
        sec.check(backend, measure)
    model.options.kernels = None


@section("9. compiled and TF32 variants")
def compiled_variants(sec, device, smoke):
    import copy

    eager = published_model(device, torch.float32, smoke)
    # a dry run on the CPU checks the code path without code generation (minutes in the interpreter)
    options = {"backend": "aot_eager"} if smoke else {}
    compiled = copy.deepcopy(eager).compile(**options)
    compiled_tf32 = copy.deepcopy(eager).compile(**options)
    compiled_tf32.options.tf32 = True
    # CUDA graphs (mode="reduce-overhead"): possible since every fused kernel is a registered operator
    graphs = copy.deepcopy(eager).compile(mode="reduce-overhead") if device.type == "cuda" and not smoke else None
    systems = [diamond_si(1)] if smoke else [bcc_fe(8), bcc_fe(13), bcc_fe(16)]  # 1,024 / 4,394 / 8,192 atoms

    def first_call():
        g = graph_of(compiled, systems[0], device, torch.float32)
        t0 = time.perf_counter()
        compiled(g)
        compiled_tf32(g)
        synchronize(device)
        out = {"compile_s_both": time.perf_counter() - t0}
        if graphs is not None:
            t0 = time.perf_counter()
            graphs(g)
            synchronize(device)
            out["compile_s_reduce_overhead"] = time.perf_counter() - t0
        return out

    sec.check("compile", first_call)
    log(f"   {'structure':10s} {'atoms':>6s} {'eager (ms)':>11s} {'compiled':>10s} {'+TF32':>10s} {'speedup':>8s}")

    def row(system):
        g = graph_of(eager, system, device, torch.float32)
        out = {"atoms": system.num_atoms}
        variants = [("eager", eager), ("compiled", compiled), ("compiled_tf32", compiled_tf32)]
        if graphs is not None:
            variants.append(("compiled_cudagraphs", graphs))
        for name, m in variants:
            out[name + "_s"] = median_time(lambda: m(g), device, repeat=3)
        if graphs is not None:
            out["speedup_compiled_cudagraphs"] = out["eager_s"] / out["compiled_cudagraphs_s"]
        ref, c = eager(g), compiled(g)
        out["compiled_force_rel_err"] = ((c.forces - ref.forces).abs().max() / ref.forces.abs().max()).item()
        out["speedup_compiled"] = out["eager_s"] / out["compiled_s"]
        out["speedup_compiled_tf32"] = out["eager_s"] / out["compiled_tf32_s"]
        log(f"   {system.name:10s} {system.num_atoms:6d} {1e3 * out['eager_s']:11.1f} {1e3 * out['compiled_s']:10.1f} "
            f"{1e3 * out['compiled_tf32_s']:10.1f} {out['speedup_compiled_tf32']:7.2f}×")
        return out

    for system in systems:
        sec.check(system.name, row, system)

    def tf32_accuracy():
        """float32 errors against the float64 fixture references, without and with TF32."""
        base = ROOT / "tests" / "fixtures" / "official-v0.9" / "small_sh_float64"
        ref = json.loads((base / "reference.json").read_text())
        model = MatRIS.from_checkpoint(base / "checkpoint.pth.tar").to(device=device, dtype=torch.float32)
        out = {}
        for tf32 in (False, True):
            model.options.tf32 = tf32
            e_err = f_err = 0.0
            for system, r in zip(read_extxyz(base / "structures.extxyz"), ref["structures"]):
                o = model(graph_of(model, system, device, torch.float32))
                e_err = max(e_err, abs(o.energy_per_atom.item() - r["energy_per_atom"]))
                f_err = max(f_err, float(np.abs(o.forces.cpu().numpy() - r["forces"]).max()))
            out["tf32" if tf32 else "fp32"] = {"energy_per_atom_max_err_eV": e_err, "force_max_err_eV_A": f_err}
            log(f"   {'TF32' if tf32 else 'FP32'}: max |ΔE| {1e3 * e_err:.4f} meV/atom, "
                f"max |ΔF| {1e3 * f_err:.4f} meV/Å")
        return out

    sec.check("tf32_accuracy", tf32_accuracy)


FULL_BUDGETS = {"1": 90, "2": 60, "3": 100, "4": 30, "5": 45, "6": 45, "7": 45, "8": 30, "9": 120}  # s: < 10 min
QUICK_BUDGETS = {"1": 100, "3": 60}  # --quick: correctness and one E+F+S size, < 3 min


def failures(node, path=""):
    """Paths of every check that errored or reported ok: false."""
    out = []
    if isinstance(node, dict):
        if "error" in node or node.get("ok") is False:
            out.append(path or "/")
        for k, v in node.items():
            if k not in ("error", "where"):
                out += failures(v, f"{path}/{k}")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="write all results here, after every check (default "
                   "benchmarks/results/gpu.json, gpu-quick.json with --quick; --smoke: a temporary folder)")
    p.add_argument("--quick", action="store_true", help="correctness and one E+F+S size only (< 3 minutes)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and model, any device (a dry run)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--largest-budget", type=float, default=90.0, help="seconds for the largest-cell search")
    p.add_argument("--skip", nargs="*", default=[], help="section numbers to skip (1-9)")
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every section's time budget")
    args = p.parse_args(argv)
    global SMOKE, REPORT
    SMOKE = args.smoke
    if args.json is None:  # results next to the others; a dry run's numbers are not results
        results = Path(__file__).resolve().parent / "results"
        args.json = (str(Path(tempfile.mkdtemp(prefix="matris-gpu-smoke-")) / "gpu-smoke.json") if args.smoke
                     else str(results / ("gpu-quick.json" if args.quick else "gpu.json")))
    REPORT = Report(args.json)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and not args.smoke:
        p.error("no CUDA device: run with --smoke (and TRITON_INTERPRET=1) for a CPU dry run")
    import triton

    budgets = QUICK_BUDGETS if args.quick else FULL_BUDGETS
    BUDGETS.update({k: v * args.budget_scale * (20 if args.smoke else 1) for k, v in budgets.items()})
    RESULTS["meta"] = {"torch": torch.__version__, "triton": triton.__version__, "device": str(device),
                       "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       "smoke": args.smoke, "quick": args.quick, "commit": commit(),
                       "command": command(argv),
                       "budgets_s": BUDGETS, "finished": False}
    REPORT.write()
    log(f"matris GPU benchmark: {RESULTS['meta']}")
    t0 = time.perf_counter()
    steps = {"1": lambda: correctness(device, args.smoke), "2": lambda: kernels(device, args.smoke),
             "3": lambda: efs(device, args.smoke, quick=args.quick), "4": lambda: training(device, args.smoke),
             "5": lambda: largest(device, args.smoke, args.largest_budget),
             "6": lambda: train_throughput(device, args.smoke), "7": lambda: simulate(device, args.smoke),
             "8": lambda: md_on_device(device, args.smoke), "9": lambda: compiled_variants(device, args.smoke)}
    for key, fn in steps.items():
        if key in budgets and key not in args.skip:
            fn()
    RESULTS["meta"]["total_s"] = time.perf_counter() - t0
    failed = failures({k: v for k, v in RESULTS.items() if k != "meta"})
    RESULTS["meta"].update(finished=True, failed=failed)
    REPORT.write()
    log(f"\nwrote {args.json} ({RESULTS['meta']['total_s']:.0f} s)"
        + (f"; {len(failed)} failed: {', '.join(failed)}" if failed else "; every check passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
