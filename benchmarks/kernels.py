"""CPU checks of the Triton kernels: run them in the interpreter and compile them for GPUs.

    python -m benchmarks.kernels --check
    TRITON_INTERPRET=1 python -m benchmarks.kernels --memory   # what the Φ fusions save
    python -m benchmarks.kernels --resources                   # registers and spills on sm_90

1. Under ``TRITON_INTERPRET=1`` the basis kernels run on CPU tensors and are compared with
   their PyTorch references: forward, backward (the fused first-order kernels) and second
   order (the create_graph path), float32 and float64, with gradcheck and gradgradcheck in
   float64. The fused operators' kernels (``matris::gated_phi``, ``attention_pair``,
   ``refine_edges``) are compared with their references, interpreted the same way, by
   ``tests/test_operators.py`` and ``tests/test_chunked.py``.
2. Every kernel is compiled to a cubin for sm_80 and sm_90 in every specialisation the model
   launches by default (float32 and float64) with
   ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cap, 32))``. No GPU is needed.

``--resources`` compiles every specialisation for sm_90 and reports, from the ptxas that
ships with triton, the registers per thread and the spilled bytes (no GPU needed).

``--memory`` measures, for one gated Φ of the line graph (the refine layout, width 128),
the edge-sized bytes the forward pass writes and the bytes it saves for the backward,
with the fused operator ``matris::gated_phi`` (its Triton kernels) against the composed
PyTorch ops (interpreter on CPU: the counts do not depend on the device).

Exits non-zero if any check fails. Each phase runs in its own process, because
TRITON_INTERPRET is read when the kernels are defined.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import traceback

from benchmarks.common import ROOT, write_json

FAILURES: list[str] = []
# every check's outcome, for --json (tests read these, not the printed text)
RESULTS: list[dict] = []


def check(name, ok, detail=""):
    print(f"  {'ok  ' if ok else 'FAIL'} {name} {detail}")
    RESULTS.append({"name": name, "ok": bool(ok), "detail": detail})
    if not ok:
        FAILURES.append(name)


def close(a, b, dtype):
    import torch

    if a is None and b is None:
        return True, "no gradient"
    if a is None or b is None:  # an input one side does not use: the other must give zeros
        present = a if a is not None else b
        return bool((present == 0).all()), "gradient only on one side"
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    err = (a - b).abs().max().item() if a.numel() else 0.0
    scale = max(1.0, b.abs().max().item() if b.numel() else 0.0)
    return err <= tol * scale, f"max|Δ| {err:.1e}"


def compare_paths(name, fn, ref, inputs, dtype):
    """Forward, first-order backward and second order of ``fn`` against ``ref``."""
    import torch

    out, want = fn(*inputs), ref(*inputs)
    check(f"{name} forward", *close(out, want, dtype))
    grad = torch.randn_like(want)
    got = torch.autograd.grad(fn(*inputs), inputs, grad, allow_unused=True)
    exp = torch.autograd.grad(ref(*inputs), inputs, grad, allow_unused=True, create_graph=True)
    for k, (g, e) in enumerate(zip(got, exp)):
        check(f"{name} backward[{k}]", *close(g, e.detach() if e is not None else None, dtype))
    got2 = torch.autograd.grad(fn(*inputs), inputs, grad, create_graph=True, allow_unused=True)
    loss_got = sum((g * g).sum() for g in got2 if g is not None)
    loss_exp = sum((e * e).sum() for e in exp if e is not None)
    h_got = torch.autograd.grad(loss_got, inputs, allow_unused=True)
    h_exp = torch.autograd.grad(loss_exp, inputs, allow_unused=True)
    for k, (g, e) in enumerate(zip(h_got, h_exp)):
        if e is not None:
            check(f"{name} second order[{k}]", *close(g, e, dtype))


def interpret_checks():
    import torch

    from matris.kernels import basis as B

    torch.manual_seed(0)
    print("basis functions (interpreter)")
    factor = torch.tensor(math.sqrt(2 / 6.0**3), dtype=torch.float32)
    for dtype in (torch.float64, torch.float32):
        tag = str(dtype)[6:]
        r = torch.cat([torch.rand(40, dtype=dtype) * 6.5 + 0.4, torch.tensor([5.0, 6.0, 6.2], dtype=dtype)])
        r.requires_grad_()
        for k, p, rc in ((7, 8, 6.0), (5, 6, 3.8)):
            freq = (torch.arange(1, k + 1, dtype=dtype) * math.pi + 0.01 * torch.randn(k, dtype=dtype)).requires_grad_()
            compare_paths(f"[{tag}] bessel K={k} p={p} r_c={rc}", lambda a, b: B.bessel(a, b, rc, p),
                          lambda a, b: B.bessel_reference(a, b, rc, p), (r, freq), dtype)
        theta = (torch.rand(37, dtype=dtype) * 3.1).requires_grad_()
        for m in (3, 2, 1):
            freq = (torch.arange(1, m + 1, dtype=dtype) + 0.05).requires_grad_()
            compare_paths(f"[{tag}] fourier m={m}", B.fourier, B.fourier_reference, (theta, freq), dtype)
        rho = (torch.full((37,), 1 / 6.0, dtype=dtype) + 0.01 * torch.rand(37, dtype=dtype)).requires_grad_()
        for max_l, max_n in ((4, 4), (3, 2), (1, 1), (2, 4)):
            compare_paths(f"[{tag}] SH max_l={max_l} max_n={max_n}",
                          lambda a, b: B.spherical(a, b, factor, max_l, max_n),
                          lambda a, b: B.sh_reference(a, b, factor.to(dtype), max_l, max_n), (theta, rho), dtype)
    r = (torch.rand(6, dtype=torch.float64) * 5 + 0.5).requires_grad_()
    freq = (torch.arange(1, 4, dtype=torch.float64) * math.pi).requires_grad_()
    f = lambda a, b: B.bessel(a, b, 6.0, 8)  # noqa: E731
    check("bessel gradcheck", torch.autograd.gradcheck(f, (r, freq)))
    check("bessel gradgradcheck", torch.autograd.gradgradcheck(f, (r, freq)))
    theta = (torch.rand(3, dtype=torch.float64) * 3).requires_grad_()
    rho = torch.full((3,), 1 / 6.0, dtype=torch.float64, requires_grad=True)
    f = lambda a, b: B.spherical(a, b, factor, 3, 2)  # noqa: E731  (4×4 is compared with the reference above)
    check("SH gradcheck", torch.autograd.gradcheck(f, (theta, rho)))
    check("SH gradgradcheck", torch.autograd.gradgradcheck(f, (theta, rho)))


def kernel_specs():
    """(name, kernel, signature, constexprs) for every specialisation the package launches."""
    from matris.kernels import attention as S
    from matris.kernels import basis as B
    from matris.kernels import gather as GA
    from matris.kernels import phi as PHI
    from matris.kernels import refine as RF

    specs = []
    # the gathers of gated_phi's first layer (SiLU and its slope): the three term layouts of the
    # model, float32, and float64 for the atom graph's
    layouts = {"atom graph": (1, 1, 1, 0), "line attention": (0, 1, 1, 0), "line refine": (0, 1, 1, 1)}
    gvariants = [("fp32", name) for name in layouts] + [("fp64", "atom graph")]
    for fp, name in gvariants:
        ptr = f"*{fp}"
        flags = layouts[name]
        sig = {}
        for k in range(GA.MAX_TERMS):
            sig[f"p{k}"] = ptr
            sig[f"i{k}"] = "*i64" if flags[k] else ptr
        sig.update(bias_ptr=ptr, out_ptr=ptr, slope_ptr=ptr, n_rows="i32", H="i32")
        sig.update({k: "constexpr" for k in ("N_TERMS", "IDX0", "IDX1", "IDX2", "IDX3", "HAS_BIAS", "BLOCK_R",
                                             "BLOCK_H")})
        specs.append((f"gather_sum[{fp}, {name}]", GA.gather_sum_kernel, sig,
                      dict(N_TERMS=4 if flags[3] else 3, IDX0=bool(flags[0]), IDX1=True, IDX2=True,
                           IDX3=bool(flags[3]), HAS_BIAS=True, BLOCK_R=GA.BLOCK_ROWS, BLOCK_H=GA.BLOCK_COLS)))
    # the operators' CUDA kernels (matris::attention_pair: the online softmax once per direction and
    # the backward; gated_phi's epilogue; refine_edges) and the bases'
    for fp in ("fp32", "fp64"):
        ptr = f"*{fp}"
        specs.append((f"softmax_aggregate_fwd[{fp}]", S.softmax_aggregate_fwd_kernel,
                      dict(logits_ptr=ptr, msg_ptr=ptr, order_ptr="*i64", offsets_ptr="*i64", out_ptr=ptr,
                           lse_ptr=ptr, C="i32", stride_a="i32", BLOCK_E="constexpr", BLOCK_C="constexpr"),
                      dict(BLOCK_E=S.FWD_BLOCK_E, BLOCK_C=S.FWD_BLOCK_C)))
        specs.append((f"attention_pair_bwd[{fp}]", S.attention_pair_bwd_kernel,
                      dict(logits_ptr=ptr, msg_ptr=ptr, tgt_ptr="*i64", src_ptr="*i64", out_t_ptr=ptr, out_s_ptr=ptr,
                           lse_t_ptr=ptr, lse_s_ptr=ptr, gt_ptr=ptr, gs_ptr=ptr, gy_ptr=ptr, galpha_ptr=ptr,
                           gm_ptr=ptr, E="i32", C="i32", stride_a="i32", HAS_GY="constexpr", BLOCK_E="constexpr",
                           BLOCK_C="constexpr"),
                      dict(HAS_GY=True, BLOCK_E=S.BWD_BLOCK_E, BLOCK_C=S.BWD_BLOCK_C)))
        for layer in (False, True):
            # the backward with KEEP: the weight gradients' ∂L/∂cn and ∂L/∂gn written too (training)
            for backward, keep in ((False, False), (True, False), (True, True)):
                specs.append((f"phi_epilogue[{fp}, {'layer' if layer else 'rms'}, "
                              f"{'backward' if backward else 'forward'}{', keep' if keep else ''}]",
                              PHI.phi_epilogue_kernel,
                              dict(core_ptr=ptr, gate_ptr=ptr, nc_ptr=ptr, ng_ptr=ptr, nbc_ptr=ptr, nbg_ptr=ptr,
                                   eps_ptr=ptr, grad_ptr=ptr, out_ptr=ptr, rc_ptr=ptr, rg_ptr=ptr,
                                   gcore_ptr=ptr, ggate_ptr=ptr, gcn_ptr=ptr, ggn_ptr=ptr, n_rows="i32", D="i32",
                                   LAYER="constexpr", BACKWARD="constexpr", KEEP="constexpr", BLOCK_R="constexpr",
                                   BLOCK_D="constexpr"),
                              dict(LAYER=layer, BACKWARD=backward, KEEP=keep, BLOCK_R=PHI.EPILOGUE_ROWS,
                                   BLOCK_D=128)))
        for backward in (False, True):
            specs.append((f"refine_edges[{fp}, {'backward' if backward else 'forward'}]", RF.refine_edges_kernel,
                          dict(u_ptr=ptr, q_ptr=ptr, src_ptr="*i64", tgt_ptr="*i64", ug_ptr=ptr, gagg_ptr=ptr,
                               gin_ptr=ptr, gu_ptr=ptr, tosrc_ptr=ptr, totgt_ptr=ptr, E="i32", C="i32",
                               BACKWARD="constexpr", HAS_GIN="constexpr", SMOOTH="constexpr", WANT_U="constexpr",
                               WANT_Q="constexpr", BLOCK_R="constexpr", BLOCK_C="constexpr"),
                          dict(BACKWARD=backward, HAS_GIN=backward, SMOOTH=False, WANT_U=backward, WANT_Q=backward,
                               BLOCK_R=RF.BLOCK_ROWS, BLOCK_C=RF.BLOCK_COLS)))
        for backward in (False, True):
            tag = f"{fp}, {'backward' if backward else 'forward'}"
            specs.append((f"bessel[{tag}]", B.bessel_kernel,
                          dict(r_ptr=ptr, f_ptr=ptr, out_ptr=ptr, grad_ptr=ptr, grad_r_ptr=ptr, consts_ptr=ptr,
                               n_rows="i32", K="constexpr", KP="constexpr", P="constexpr", BACKWARD="constexpr",
                               FREQ_GRAD="constexpr", BLOCK="constexpr"),
                          dict(K=7, KP=8, P=8, BACKWARD=backward, FREQ_GRAD=backward, BLOCK=B.BLOCK_ROWS)))
            specs.append((f"fourier[{tag}]", B.fourier_kernel,
                          dict(t_ptr=ptr, f_ptr=ptr, out_ptr=ptr, grad_ptr=ptr, grad_t_ptr=ptr, consts_ptr=ptr,
                               n_rows="i32", M="constexpr", MP="constexpr", BACKWARD="constexpr",
                               FREQ_GRAD="constexpr", BLOCK="constexpr"),
                          dict(M=3, MP=4, BACKWARD=backward, FREQ_GRAD=backward, BLOCK=B.BLOCK_ROWS)))
            specs.append((f"sh[{tag}]", B.sh_kernel,
                          dict(t_ptr=ptr, rho_ptr=ptr, coef_ptr=ptr, out_ptr=ptr, grad_ptr=ptr, grad_t_ptr=ptr,
                               grad_rho_ptr=ptr, consts_ptr=ptr, n_rows="i32", MAX_L="constexpr",
                               MAX_N="constexpr", BACKWARD="constexpr", BLOCK="constexpr"),
                          dict(MAX_L=4, MAX_N=4, BACKWARD=backward, BLOCK=B.BLOCK_ROWS)))
    return specs


def compile_checks():
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    print(f"compile for GPUs (triton {triton.__version__})")
    for name, kernel, signature, constexprs in kernel_specs():
        for cap in (80, 90):
            try:
                compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                          target=GPUTarget("cuda", cap, 32))
                size = len(compiled.asm["cubin"])
                check(f"{name} sm_{cap}", size > 0, f"cubin {size} bytes")
            except Exception as exc:  # noqa: BLE001 - reported as a failure
                check(f"{name} sm_{cap}", False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def resources_report(cap=90):
    """Registers per thread and spills of every specialisation, from ``ptxas -v``."""
    import re
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    rows = []
    print(f"{'kernel':56s} {'warps':>5s} {'registers':>9s} {'spill stores':>12s} {'spill loads':>11s}")
    for name, kernel, signature, constexprs in kernel_specs():
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", cap, 32))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.ptx")
            with open(path, "w") as f:
                f.write(compiled.asm["ptx"])
            res = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{cap}a" if cap >= 90 else f"--gpu-name=sm_{cap}",
                                  path, "-o", os.devnull], capture_output=True, text=True)
        # the first entry is the kernel itself (later ones are device functions it calls)
        regs = re.search(r"Used (\d+) registers", res.stderr)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
        row = dict(kernel=name, warps=compiled.metadata.num_warps, registers=int(regs.group(1)) if regs else None,
                   spill_stores=int(spills.group(1)) if spills else None,
                   spill_loads=int(spills.group(2)) if spills else None)
        rows.append(row)
        print(f"{name:56s} {row['warps']:5d} {row['registers'] or -1:9d} {row['spill_stores'] or 0:12d} "
              f"{row['spill_loads'] or 0:11d}")
    return rows


def memory_report(rows=2048, width=128):
    """Edge-sized bytes written by the forward and bytes saved for the backward, one gated Φ."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from matris.model.attention import GatedMLP

    class EdgeWrites(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            flat = [*args, *(kwargs or {}).values()]
            reads = {x.untyped_storage().data_ptr() for x in flat if isinstance(x, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else (out,):
                # new edge-sized storage only: views and in-place results are not writes of a new tensor
                if (isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == rows
                        and t.untyped_storage().data_ptr() not in reads):
                    self.bytes += t.numel() * t.element_size()
            return out

    torch.manual_seed(0)
    phi = GatedMLP(4 * width, width, width, "silu", "rms", 0.0)
    n_bonds, n_atoms = rows // 16, rows // 64
    a = torch.randn(rows, width, requires_grad=True)  # angle features, one row per edge
    h = torch.randn(n_atoms, width, requires_grad=True)
    e = torch.randn(n_bonds, width, requires_grad=True)
    terms = [(a, None), (h, torch.randint(0, n_atoms, (rows,))), (e, torch.randint(0, n_bonds, (rows,))),
             (e, torch.randint(0, n_bonds, (rows,)))]
    report = {}
    for fused in (False, True):
        saved = {}

        def pack(t):
            saved[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
            return t

        writes = EdgeWrites()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), writes:
            out = phi.forward_terms(terms, fused=fused)
        params = sum(p.numel() * p.element_size() for p in phi.parameters())
        inputs = sum(t.numel() * t.element_size() for t in (a, h, e))
        kept = sum(saved.values())
        report["fused" if fused else "reference"] = {"edge_bytes_written": writes.bytes, "saved_bytes": kept,
                                                     "saved_bytes_excluding_weights_and_inputs": kept - params - inputs}
        out.sum().backward()
    ref, fus = report["reference"], report["fused"]
    print(f"one gated Φ, {rows} edges, width {width} (line-graph refine layout), float32, bytes per edge:")
    print(f"  {'':34s} {'reference':>10s} {'fused':>10s} {'ratio':>7s}")
    for key, label in (("edge_bytes_written", "edge-sized writes in the forward"),
                       ("saved_bytes_excluding_weights_and_inputs", "activations saved for the backward")):
        print(f"  {label:34s} {ref[key] / rows:10.0f} {fus[key] / rows:10.0f} {ref[key] / max(fus[key], 1):6.2f}×")
    return report


def start_phase(flag, interpret, log, results):
    """The phase in its own process (TRITON_INTERPRET is read at import), output to ``log``, its
    checks to the JSON file ``results``."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
        env["MATRIS_INTERPRET_TILES"] = "gpu"  # the device's tiles: many programs, partial sums
    return subprocess.Popen([sys.executable, "-m", "benchmarks.kernels", flag, "--json", str(results)], env=env,
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def run_phases():
    """Both phases side by side (each is single-threaded work), their outputs printed in order;
    returns their exit codes and their checks (each phase writes them to a JSON file)."""
    import json
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile("w+") as log_i, \
            tempfile.TemporaryFile("w+") as log_c:
        phases = [("--interpret-checks", True, log_i), ("--compile-checks", False, log_c)]
        files = [Path(tmp) / f"{flag.strip('-')}.json" for flag, _, _ in phases]
        procs = [start_phase(flag, interpreted, log, out) for (flag, interpreted, log), out in zip(phases, files)]
        codes = [proc.wait() for proc in procs]
        for log in (log_i, log_c):
            log.seek(0)
            sys.stdout.write(log.read())
        checks = [c for f in files if f.is_file() for c in json.loads(f.read_text())]
    return codes, checks


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="run all CPU checks (both phases)")
    p.add_argument("--interpret-checks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compile-checks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--memory", action="store_true", help="bytes written and saved by one gated Φ, fused vs "
                   "reference (needs TRITON_INTERPRET=1 on a machine without a GPU)")
    p.add_argument("--resources", action="store_true", help="registers and spills per kernel on sm_90 (ptxas)")
    p.add_argument("--rows", type=int, default=2048, help="with --memory: edges of the Φ (default 2048)")
    p.add_argument("--json", default=None, help="with --check, --memory or --resources: write the results here")
    args = p.parse_args(argv)
    if args.check:
        codes, checks = run_phases()
        if args.json:
            write_json(args.json, {"exit_codes": codes, "checks": checks})
        print("all kernel checks passed" if not any(codes) else "kernel checks FAILED")
        return 1 if any(codes) else 0
    try:
        if args.resources:
            rows = resources_report()
            if args.json:
                write_json(args.json, rows)
        elif args.memory:
            report = memory_report(args.rows)
            if args.json:
                write_json(args.json, report)
        elif args.interpret_checks:
            interpret_checks()
        elif args.compile_checks:
            compile_checks()
        else:
            p.print_help()
            return 0
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        FAILURES.append("exception")
    if args.json and (args.interpret_checks or args.compile_checks):
        write_json(args.json, RESULTS, indent=None)
    print(f"{len(FAILURES)} failed" if FAILURES else "passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    raise SystemExit(main())
