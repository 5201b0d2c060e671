"""CPU checks of the Triton kernels: run them in the interpreter and compile them for GPUs.

    python benchmarks/kernels.py --check

1. Under ``TRITON_INTERPRET=1`` every kernel runs on CPU tensors and is compared with its
   PyTorch reference: forward, backward (the fused first-order kernels) and second order
   (the create_graph path), with gradcheck and gradgradcheck in float64. Cases cover odd
   sizes, empty and single-edge segments, segments longer than a block, channels wider
   than a block, and float32 and float64.
2. Every kernel and specialisation is compiled to a cubin for sm_80 and sm_90 with
   ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cap, 32))``. No GPU is needed.

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

FAILURES: list[str] = []


def check(name, ok, detail=""):
    print(f"  {'ok  ' if ok else 'FAIL'} {name} {detail}")
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
    from matris.kernels import softmax_aggregate, softmax_aggregate_reference

    torch.manual_seed(0)
    print("softmax aggregation (interpreter)")
    cases = [  # (edges, channels, segments, note)
        (37, 5, 9, "odd sizes, empty segments"),
        (1, 1, 1, "single edge"),
        (0, 3, 4, "no edges"),
        (90, 40, 3, "segments longer than a block, channels wider than a block"),
        (25, 7, 25, "single-edge segments"),
    ]
    for dtype in (torch.float64, torch.float32):
        for e, c, n, note in cases:
            index = torch.randint(0, max(1, n - 1), (e,)) if n > 1 else torch.zeros(e, dtype=torch.long)
            if note == "single-edge segments":
                index = torch.randperm(n)[:e]
            logits = (torch.randn(e, c, dtype=dtype) * 5).requires_grad_()
            msgs = torch.randn(e, c, dtype=dtype, requires_grad=True)
            compare_paths(
                f"[{str(dtype)[6:]} E={e} C={c} n={n}: {note}]",
                lambda a, m: softmax_aggregate(a, m, index, n, backend="triton"),
                lambda a, m: softmax_aggregate_reference(a, m, index, n),
                (logits, msgs), dtype)
    index = torch.tensor([0, 0, 1, 1, 1, 3, 3, 3, 3, 4, 0, 1])
    x = torch.randn(12, 3, dtype=torch.float64, requires_grad=True)
    m = torch.randn(12, 3, dtype=torch.float64, requires_grad=True)
    f = lambda a, b: softmax_aggregate(a, b, index, 6, backend="triton")  # noqa: E731
    check("softmax aggregation gradcheck", torch.autograd.gradcheck(f, (x, m)))
    check("softmax aggregation gradgradcheck", torch.autograd.gradgradcheck(f, (x, m)))

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
    theta = (torch.rand(5, dtype=torch.float64) * 3).requires_grad_()
    rho = torch.full((5,), 1 / 6.0, dtype=torch.float64, requires_grad=True)
    f = lambda a, b: B.spherical(a, b, factor, 4, 4)  # noqa: E731
    check("SH gradcheck", torch.autograd.gradcheck(f, (theta, rho)))
    check("SH gradgradcheck", torch.autograd.gradgradcheck(f, (theta, rho)))


def kernel_specs():
    """(name, kernel, signature, constexprs) for every specialisation the package launches."""
    from matris.kernels import basis as B
    from matris.kernels import aggregate as S

    specs = []
    for fp in ("fp32", "fp64"):
        ptr = f"*{fp}"
        specs.append((f"softmax_aggregate_fwd[{fp}]", S.softmax_aggregate_fwd_kernel,
                      dict(logits_ptr=ptr, msg_ptr=ptr, order_ptr="*i32", offsets_ptr="*i32", out_ptr=ptr,
                           lse_ptr=ptr, C="i32", BLOCK_E="constexpr", BLOCK_C="constexpr"),
                      dict(BLOCK_E=S.FWD_BLOCK_E, BLOCK_C=S.FWD_BLOCK_C)))
        specs.append((f"softmax_aggregate_bwd[{fp}]", S.softmax_aggregate_bwd_kernel,
                      dict(logits_ptr=ptr, msg_ptr=ptr, index_ptr="*i64", out_ptr=ptr, lse_ptr=ptr, gout_ptr=ptr,
                           glse_ptr=ptr, glogits_ptr=ptr, gmsg_ptr=ptr, E="i32", C="i32", BLOCK_E="constexpr",
                           BLOCK_C="constexpr"),
                      dict(BLOCK_E=S.BWD_BLOCK_E, BLOCK_C=S.BWD_BLOCK_C)))
        for backward in (False, True):
            tag = f"{fp}, {'backward' if backward else 'forward'}"
            specs.append((f"bessel[{tag}]", B.bessel_kernel,
                          dict(r_ptr=ptr, f_ptr=ptr, out_ptr=ptr, grad_ptr=ptr, grad_r_ptr=ptr, consts_ptr=ptr,
                               n_rows="i32", K="constexpr", KP="constexpr", P="constexpr", BACKWARD="constexpr",
                               BLOCK="constexpr"),
                          dict(K=7, KP=8, P=8, BACKWARD=backward, BLOCK=B.BLOCK_ROWS)))
            specs.append((f"fourier[{tag}]", B.fourier_kernel,
                          dict(t_ptr=ptr, f_ptr=ptr, out_ptr=ptr, grad_ptr=ptr, grad_t_ptr=ptr, consts_ptr=ptr,
                               n_rows="i32", M="constexpr", MP="constexpr", BACKWARD="constexpr", BLOCK="constexpr"),
                          dict(M=3, MP=4, BACKWARD=backward, BLOCK=B.BLOCK_ROWS)))
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


def run_phase(flag, interpret):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, __file__, flag], env=env).returncode


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="run all CPU checks (both phases)")
    p.add_argument("--interpret-checks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compile-checks", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.check:
        codes = [run_phase("--interpret-checks", True), run_phase("--compile-checks", False)]
        print("all kernel checks passed" if not any(codes) else "kernel checks FAILED")
        return 1 if any(codes) else 0
    try:
        if args.interpret_checks:
            interpret_checks()
        elif args.compile_checks:
            compile_checks()
        else:
            p.print_help()
            return 0
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        FAILURES.append("exception")
    print(f"{len(FAILURES)} failed" if FAILURES else "passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    raise SystemExit(main())
