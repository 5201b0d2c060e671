"""The whole gated Φ of an edge update (spec §5), fused for the CPU: first layer, gathers,
activation, second layers and the gated epilogue, processed in row chunks that stay in cache.

    pre  = R·W_rᵀ + Σ_k P_k[idx_k] + b₁                 [E, 2H]  (core ‖ gate halves)
    hid  = silu(pre)
    core = hid_c·W_cᵀ + b_c,   gate = hid_g·W_gᵀ + b_g  [E, d]
    out  = silu(RMS(core)·w_c) ⊙ σ(RMS(gate)·w_g)       [E, d]

R ``[E, d_r]`` is the per-row term (the angle features on the line graph; None when every
term is gathered), ``P_k [n_k, 2H]`` the per-node projections of the projection rewrite
(``matris.model.layers``) and ``RMS(x) = x / sqrt(mean(x²) + eps)``. This is
``GatedMLP.forward_terms`` for the published configuration (SiLU, RMSNorm); the Triton kernels
:func:`gather_sum_activate` and :func:`gated_epilogue` compute the same quantities on GPU.

Why: on a CPU these tensors (29k angles × 256 floats for Si64) do not fit in cache, and the
composed PyTorch ops make about fifteen passes over them in each direction, each allocating
a fresh tensor. Here each chunk of rows goes through every step while it is in cache, into
preallocated buffers. The forward keeps ``pre`` (the fused loops keep ``silu'(pre)`` in its place,
so the backward multiplies by it instead of recomputing it), ``core``, ``gate``, ``σ(gn)`` and the
two row statistics (4H + d + 2 floats per row, less than the composed ops keep); the backward
reads them once per chunk:

    G_cn = silu'(cn) ⊙ σ(gn) ⊙ G,       G_gn = σ'(gn) ⊙ silu(cn) ⊙ G
    G_core = r_c·(w_c⊙G_cn) − core·r_c³·mean(w_c⊙G_cn⊙core)      (likewise gate)
    G_pre = silu'(pre) ⊙ [G_core·W_c ‖ G_gate·W_g]
    G_R = G_pre·W_r,   G_{P_k} = index_add(idx_k, G_pre)

In float32 with the native GEMM (:class:`.native.Matmul`) the whole pass is one library call
(``phi_fwd``/``phi_bwd``): each thread runs every step above on blocks of 24 of its rows while
they are in L2, instead of each step over a 4,096-row chunk; per row the same operations in the
same order, so the same bits as the chunk loop (``native.set_whole_calls(False)``; the benchmark
``benchmarks/cpu_speed.py`` times a Si64 call both ways).

The fused backward gives input gradients only (the weights are frozen at inference, see
``MatRIS.forward``). When weight gradients or a graph of the backward are wanted (training
on forces), it recomputes the PyTorch reference under autograd: exact second derivatives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from .backend import recompute_backward

Term = tuple[torch.Tensor, "torch.Tensor | None"]
# Rows per chunk: a [chunk, 2H] buffer of 4 MiB (4,096 float32 rows for H = 128): measured fastest
# on a 2-core EPYC (1 MiB L2 per core, 32 MiB L3) against 0.25-32 MiB.
CHUNK_BYTES = 4 << 20

_aten = torch.ops.aten


def gated_phi_reference(rows: torch.Tensor | None, row_weight: torch.Tensor | None, terms: list[Term],
                        bias1: torch.Tensor, core_weight: torch.Tensor, core_bias: torch.Tensor,
                        gate_weight: torch.Tensor, gate_bias: torch.Tensor, core_norm: torch.Tensor,
                        gate_norm: torch.Tensor, eps: float) -> torch.Tensor:
    """PyTorch reference of the formula in the module docstring → ``[E, d]``.

    rows ``[E, d_r]`` and row_weight ``[2H, d_r]`` (or both None); terms ``(P_k [n_k, 2H],
    idx_k [E])``; bias1 ``[2H]``; core/gate weight ``[d, H]`` and bias ``[d]``; core/gate
    norm ``[d]`` (the RMSNorm weights); eps the RMSNorm epsilon.
    """
    pre = bias1
    if rows is not None:
        pre = pre + rows @ row_weight.T
    for proj, index in terms:
        pre = pre + proj.index_select(0, index)
    hid = F.silu(pre)
    h = core_weight.shape[1]
    core = F.linear(hid[:, :h], core_weight, core_bias)
    gate = F.linear(hid[:, h:], gate_weight, gate_bias)
    d = core.shape[-1]
    return F.silu(F.rms_norm(core, (d,), core_norm, eps)) * torch.sigmoid(F.rms_norm(gate, (d,), gate_norm, eps))


def gated_phi(rows, row_weight, terms, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm, gate_norm,
              eps: float, chunk: int | None = None) -> torch.Tensor:
    """The chunked fused Φ (same arguments as :func:`gated_phi_reference`; ``chunk``: rows per
    chunk, default sized to the cache). At least one term or ``rows`` must be given."""
    n = rows.shape[0] if rows is not None else terms[0][1].shape[0]
    if n == 0:
        return gated_phi_reference(rows, row_weight, terms, bias1, core_weight, core_bias, gate_weight, gate_bias,
                                   core_norm, gate_norm, eps)
    if chunk is None:
        chunk = max(64, CHUNK_BYTES // (bias1.shape[0] * bias1.element_size()))
    flat = [t for term in terms for t in term]
    return _GatedPhi.apply(rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm,
                           gate_norm, float(eps), int(chunk), *flat)


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``[c, d]`` → ``[c, 1]``: 1 / sqrt(mean(x²) + eps), as F.rms_norm computes it."""
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))


class _GatedPhi(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, eps, chunk, *flat):
        projs, indices = list(flat[0::2]), list(flat[1::2])
        n = rows.shape[0] if rows is not None else indices[0].shape[0]
        two_h, h, d = bias1.shape[0], wc.shape[1], wc.shape[0]
        like = dict(dtype=bias1.dtype, device=bias1.device)
        pre = torch.empty(n, two_h, **like)
        core = torch.empty(n, d, **like)
        gate = torch.empty(n, d, **like)
        r_c = torch.empty(n, 1, **like)
        r_g = torch.empty(n, 1, **like)
        out = torch.empty(n, d, **like)
        sig = torch.empty(n, d, **like)  # σ(gn), kept for the backward
        ctx.slope = native.usable(bias1, *projs, *indices)  # pre holds silu'(pre)
        whole = ctx.slope and _forward_whole(rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, eps, projs, indices,
                                             pre, core, gate, r_c, r_g, sig, out)
        hid = None if whole else torch.empty(min(chunk, n), two_h, **like)
        if ctx.slope and not whole:
            _forward_native(native.library(), rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, eps, chunk, projs,
                            indices, pre, hid, core, gate, r_c, r_g, sig, out)
        elif not ctx.slope:
            tmp = torch.empty(min(chunk, n), two_h, **like)
            for s in range(0, n, chunk):
                e = min(s + chunk, n)
                p, hd, t = pre[s:e], hid[: e - s], tmp[: e - s]
                k0 = 0
                if rows is not None:
                    torch.addmm(bias1, rows[s:e], row_weight.T, out=p)
                else:
                    torch.index_select(projs[0], 0, indices[0][s:e], out=p)
                    p.add_(bias1)
                    k0 = 1
                for proj, index in zip(projs[k0:], indices[k0:]):
                    torch.index_select(proj, 0, index[s:e], out=t)
                    p.add_(t)
                _aten.silu.out(p, out=hd)
                c, g = core[s:e], gate[s:e]
                torch.addmm(bc, hd[:, :h], wc.T, out=c)
                torch.addmm(bg, hd[:, h:], wg.T, out=g)
                rc, rg = _rms(c, eps), _rms(g, eps)
                r_c[s:e], r_g[s:e] = rc, rg
                cn = torch.mul(c, rc, out=t[:, :d]).mul_(nc)
                sg = torch.mul(g, rg, out=sig[s:e]).mul_(ng).sigmoid_()
                o = _aten.silu.out(cn, out=out[s:e])
                o.mul_(sg)
        ctx.save_for_backward(rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, pre, core, gate, r_c, r_g, sig,
                              *projs, *indices)
        ctx.eps, ctx.chunk, ctx.n_terms = eps, chunk, len(projs)
        return out

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, pre, core, gate, r_c, r_g, sig = saved[:15]
        projs, indices = list(saved[15 : 15 + ctx.n_terms]), list(saved[15 + ctx.n_terms :])
        eps, chunk = ctx.eps, ctx.chunk
        needs = ctx.needs_input_grad
        weights_need = any(needs[1:9])
        if torch.is_grad_enabled() or weights_need:
            # create_graph or weight gradients: the reference under autograd (exact second order)
            k = ctx.n_terms

            def ref(*xs):
                r = xs[0] if rows is not None else None
                rw = xs[1] if rows is not None else None
                return gated_phi_reference(r, rw, list(zip(xs[9 : 9 + k], indices)), *xs[2:9], eps)

            inputs = (rows if rows is not None else bias1.new_zeros(0), row_weight if rows is not None else
                      bias1.new_zeros(0), bias1, wc, bc, wg, bg, nc, ng, *projs)
            g = recompute_backward(ref, inputs, grad)
            g_rows, g_rw = (g[0], g[1]) if rows is not None else (None, None)
            return (g_rows, g_rw, *g[2:9], None, None, *[x for gp in g[9:] for x in (gp, None)])

        n, d, h = pre.shape[0], wc.shape[0], wc.shape[1]
        grad = grad.contiguous()
        g_rows = torch.empty_like(rows) if rows is not None and needs[0] else None
        g_projs = [torch.zeros_like(p) if needs[11 + 2 * k] else None for k, p in enumerate(projs)]
        like = dict(dtype=pre.dtype, device=pre.device)
        m = min(chunk, n)
        if ctx.slope and native.usable(grad, pre, *indices) and _backward_whole(
                grad, row_weight, wc, wg, nc, ng, pre, core, gate, r_c, r_g, sig, indices, g_rows, g_projs, chunk):
            return (g_rows, None, None, None, None, None, None, None, None, None, None,
                    *[x for gp in g_projs for x in (gp, None)])
        g_hid = torch.empty(m, pre.shape[1], **like)
        if native.usable(grad, pre, *indices):
            _backward_native(native.library(), grad, rows, row_weight, wc, wg, nc, ng, pre, ctx.slope, core, gate,
                             r_c, r_g, sig, indices, g_rows, g_projs, g_hid, chunk)
            return (g_rows, None, None, None, None, None, None, None, None, None, None,
                    *[x for gp in g_projs for x in (gp, None)])
        ta, tb, tc, td = (torch.empty(m, d, **like) for _ in range(4))
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            c, gt, rc, rg, gr, sg = core[s:e], gate[s:e], r_c[s:e], r_g[s:e], grad[s:e], sig[s:e]
            a, b, cc, dd = ta[: e - s], tb[: e - s], tc[: e - s], td[: e - s]
            cn = torch.mul(c, rc, out=a).mul_(nc)  # normalised core, weighted
            # G_gn = σ'(gn) ⊙ silu(cn) ⊙ G
            _aten.silu.out(cn, out=cc)
            g_gn = _aten.sigmoid_backward.grad_input(cc.mul_(gr), sg, grad_input=cc)
            # G_cn = silu'(cn) ⊙ σ(gn) ⊙ G
            g_cn = _aten.silu_backward.grad_input(torch.mul(gr, sg, out=dd), cn, grad_input=a)
            gh = g_hid[: e - s]
            torch.mm(_rms_backward(g_cn.mul_(nc), c, rc, b, d), wc, out=gh[:, :h])
            torch.mm(_rms_backward(g_gn.mul_(ng), gt, rg, b, d), wg, out=gh[:, h:])
            g_pre = gh.mul_(pre[s:e]) if ctx.slope else _aten.silu_backward.grad_input(gh, pre[s:e], grad_input=gh)
            if g_rows is not None:
                torch.mm(g_pre, row_weight, out=g_rows[s:e])
            for gp, index in zip(g_projs, indices):
                if gp is not None:
                    gp.index_add_(0, index[s:e], g_pre)
        return (g_rows, None, None, None, None, None, None, None, None, None, None,
                *[x for gp in g_projs for x in (gp, None)])


def _forward_whole(rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, eps, projs, indices, pre, core, gate, r_c, r_g,
                   sig, out) -> bool:
    """The whole forward in one call of the library's ``phi_fwd`` (float32 with the native GEMM:
    every row goes through the chunked form's steps, in the same order, while it is in L2).
    False, with nothing written, where it does not apply."""
    if pre.dtype != torch.float32 or not native.whole_calls() or (rows is not None and (
            rows.dtype != torch.float32 or rows.stride(1) != 1)):
        return False
    by_row = native.Matmul(row_weight.T) if rows is not None else None
    by_core, by_gate = native.Matmul(wc.T), native.Matmul(wg.T)
    if any(mm is not None and mm.lib is None for mm in (by_row, by_core, by_gate)):
        return False
    n, h, d = pre.shape[0], wc.shape[1], wc.shape[0]
    bias, bc, bg, nc, ng = (t.contiguous() for t in (bias1, bc, bg, nc, ng))
    dr = rows.shape[1] if rows is not None else 0
    by_core.lib.phi_fwd(rows.data_ptr() if rows is not None else None, rows.stride(0) if rows is not None else 0, dr,
                        by_row.packed.data_ptr() if by_row is not None else None, n, h, bias.data_ptr(), len(projs),
                        native.ptr_array(projs), native.ptr_array(indices), by_core.packed.data_ptr(),
                        by_gate.packed.data_ptr(), d, bc.data_ptr(), bg.data_ptr(), nc.data_ptr(), ng.data_ptr(), eps,
                        pre.data_ptr(), core.data_ptr(), gate.data_ptr(), r_c.data_ptr(), r_g.data_ptr(),
                        sig.data_ptr(), out.data_ptr(), native.threads())
    return True


def _backward_whole(grad, row_weight, wc, wg, nc, ng, pre, core, gate, r_c, r_g, sig, indices, g_rows, g_projs,
                    chunk) -> bool:
    """The whole input-gradient pass in one call of the library's ``phi_bwd`` (float32 with the
    native GEMM, ``pre`` holding silu'(pre)); False, with nothing written, where it does not apply."""
    if pre.dtype != torch.float32 or not native.whole_calls() or (g_rows is not None and not g_rows.is_contiguous()):
        return False
    by_core, by_gate = native.Matmul(wc), native.Matmul(wg)
    by_row = native.Matmul(row_weight) if g_rows is not None else None
    if any(mm is not None and mm.lib is None for mm in (by_row, by_core, by_gate)):
        return False
    n, d, h = pre.shape[0], wc.shape[0], wc.shape[1]
    nc, ng = nc.contiguous(), ng.contiguous()
    wanted = [(gp, ix) for gp, ix in zip(g_projs, indices) if gp is not None]
    by_core.lib.phi_bwd(grad.data_ptr(), core.data_ptr(), gate.data_ptr(), r_c.data_ptr(), r_g.data_ptr(),
                        sig.data_ptr(), nc.data_ptr(), ng.data_ptr(), pre.data_ptr(), n, d, h,
                        by_core.packed.data_ptr(), by_gate.packed.data_ptr(),
                        by_row.packed.data_ptr() if by_row is not None else None,
                        by_row.n if by_row is not None else 0, native.ptr(g_rows), len(wanted),
                        native.ptr_array([gp for gp, _ in wanted]), native.ptr_array([ix for _, ix in wanted]), chunk,
                        native.threads())
    return True


def _forward_native(lib, rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, eps, chunk, projs, indices, pre, hid,
                    core, gate, r_c, r_g, sig, out):
    """The forward's chunk loop with the fused loops of :mod:`.native` between the GEMMs."""
    n, two_h, h, d = pre.shape[0], pre.shape[1], wc.shape[1], wc.shape[0]
    gather, epilogue = lib("gather_silu", pre.dtype), lib("gated_fwd", pre.dtype)
    nt = native.threads()
    proj_ptrs = native.ptr_array(projs)
    bias, bc, bg, nc, ng = (t.contiguous() for t in (bias1, bc, bg, nc, ng))
    by_row = native.Matmul(row_weight.T) if rows is not None else None
    by_core, by_gate = native.Matmul(wc.T), native.Matmul(wg.T)
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        k = e - s
        p, hd = pre[s:e], hid[:k]
        if rows is not None:  # biases are added in the fused loops, not copied into GEMM outputs
            by_row(rows[s:e], out=p)
        idx_ptrs = native.ptr_array([ix[s:e] for ix in indices])
        gather(p.data_ptr(), hd.data_ptr(), k, two_h, bias.data_ptr(), int(rows is None), len(projs), proj_ptrs,
               idx_ptrs, 1, nt)
        c, g = core[s:e], gate[s:e]
        by_core(hd[:, :h], out=c)
        by_gate(hd[:, h:], out=g)
        epilogue(c.data_ptr(), g.data_ptr(), k, d, bc.data_ptr(), bg.data_ptr(), nc.data_ptr(), ng.data_ptr(), eps,
                 r_c[s:e].data_ptr(), r_g[s:e].data_ptr(), sig[s:e].data_ptr(), out[s:e].data_ptr(), nt)


def _backward_native(lib, grad, rows, row_weight, wc, wg, nc, ng, pre, slope, core, gate, r_c, r_g, sig, indices,
                     g_rows, g_projs, g_hid, chunk):
    """The backward's chunk loop with the fused loops of :mod:`.native` between the GEMMs; each
    chunk's ∂L/∂pre is scattered to the projections while it is in cache. ``slope``: ``pre``
    holds silu'(pre) (a forward with the fused loops), else the pre-activation itself."""
    n, two_h, h, d = pre.shape[0], pre.shape[1], wc.shape[1], wc.shape[0]
    dt = pre.dtype
    gated, scatter, scale_scatter = lib("gated_bwd", dt), lib("scatter_add", dt), lib("scale_scatter_add", dt)
    nt = native.threads()
    m = g_hid.shape[0]
    g_core, g_gate = torch.empty(m, d, dtype=dt), torch.empty(m, d, dtype=dt)
    nc, ng = nc.contiguous(), ng.contiguous()
    wanted = [(gp, ix) for gp, ix in zip(g_projs, indices) if gp is not None]
    out_ptrs = native.ptr_array([gp for gp, _ in wanted])
    by_core, by_gate = native.Matmul(wc), native.Matmul(wg)
    by_row = native.Matmul(row_weight) if g_rows is not None else None
    in_gemm = slope and by_core.lib is not None and by_gate.lib is not None
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        k = e - s
        gc, gg, gh = g_core[:k], g_gate[:k], g_hid[:k]
        gated(grad[s:e].data_ptr(), core[s:e].data_ptr(), gate[s:e].data_ptr(), r_c[s:e].data_ptr(),
              r_g[s:e].data_ptr(), sig[s:e].data_ptr(), nc.data_ptr(), ng.data_ptr(), k, d, gc.data_ptr(),
              gg.data_ptr(), nt)
        idx_ptrs = native.ptr_array([ix[s:e] for _, ix in wanted]) if wanted else None
        # ∂L/∂pre = silu'(pre) ⊙ [G_core·W_c ‖ G_gate·W_g]: with the native GEMM the factor is
        # applied to its tiles in registers and the scatter only reads the product
        by_core(gc, out=gh[:, :h], scale=pre[s:e, :h] if in_gemm else None)
        by_gate(gg, out=gh[:, h:], scale=pre[s:e, h:] if in_gemm else None)
        if in_gemm:
            if wanted:
                scatter(gh.data_ptr(), k, two_h, len(wanted), out_ptrs, idx_ptrs, nt)
        elif slope and wanted:  # ∂L/∂pre = silu'(pre) ⊙ gh, scattered in the same pass
            scale_scatter(gh.data_ptr(), pre[s:e].data_ptr(), k, two_h, len(wanted), out_ptrs, idx_ptrs, nt)
        elif slope:
            gh.mul_(pre[s:e])
        else:
            _aten.silu_backward.grad_input(gh, pre[s:e], grad_input=gh)
            if wanted:
                scatter(gh.data_ptr(), k, two_h, len(wanted), out_ptrs, idx_ptrs, nt)
        if g_rows is not None:
            by_row(gh, out=g_rows[s:e])


def _rms_backward(g_xn: torch.Tensor, x: torch.Tensor, r: torch.Tensor, scratch: torch.Tensor, d: int) -> torch.Tensor:
    """Gradient through ``x·r`` with ``r = rsqrt(mean(x²) + eps)`` given ``g_xn`` = ∂L/∂(x·r):
    ``r·g_xn − x·r³·mean(g_xn ⊙ x)``, written over ``g_xn``."""
    dot = torch.mul(g_xn, x, out=scratch).sum(-1, keepdim=True)
    coef = dot.mul_(r.pow(3)).div_(d)
    return g_xn.mul_(r).addcmul_(x, coef, value=-1)
