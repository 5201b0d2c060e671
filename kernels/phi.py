"""The whole gated Φ of an edge update (spec §5), fused for the CPU: first layer, gathers,
activation, second layers and the gated epilogue, processed in row chunks that stay in cache.

    pre  = R·W_rᵀ + Σ_k P_k[idx_k] + b₁                 [E, 2H]  (core ‖ gate halves)
    hid  = silu(pre)
    core = hid_c·W_cᵀ + b_c,   gate = hid_g·W_gᵀ + b_g  [E, d]
    out  = silu(N_c(core)) ⊙ σ(N_g(gate))               [E, d]

R ``[E, d_r]`` is the per-row term (the angle features on the line graph; None when every
term is gathered), ``P_k [n_k, 2H]`` the per-node projections of the projection rewrite
(``matris.model.layers``) and N the norm: RMSNorm ``N(x) = x·r·w``, ``r = 1/sqrt(mean(x²) + eps)``,
or LayerNorm ``N(x) = x̄·r·w + b`` with ``x̄ = x − mean(x)`` and ``r = 1/sqrt(mean(x̄²) + eps)``
(the published 10M models). This is ``GatedMLP.forward_terms`` with SiLU; the Triton kernels
:func:`gather_sum_activate` and :func:`gated_epilogue` compute the same quantities on GPU.

Why: on a CPU these tensors (29k angles × 256 floats for Si64) do not fit in cache, and the
composed PyTorch ops make about fifteen passes over them in each direction, each allocating
a fresh tensor. Here each chunk of rows goes through every step while it is in cache, into
preallocated buffers. The forward keeps ``silu'(pre)`` in place of ``pre`` (so the backward
multiplies by it instead of recomputing it), ``core`` and ``gate`` (centred for LayerNorm),
``σ(gn)`` and the two row statistics r (4H + d + 2 floats per row, less than the composed ops
keep); the backward reads them once per chunk:

    G_cn = silu'(cn) ⊙ σ(gn) ⊙ G,       G_gn = σ'(gn) ⊙ silu(cn) ⊙ G,      X_c = w_c ⊙ G_cn
    G_core = r_c·X_c − core·r_c³·mean(X_c ⊙ core) [− r_c·mean(X_c) for LayerNorm]   (likewise gate)
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


def gated_phi_reference(rows: torch.Tensor | None, row_weight: torch.Tensor | None, terms: list[Term],
                        bias1: torch.Tensor, core_weight: torch.Tensor, core_bias: torch.Tensor,
                        gate_weight: torch.Tensor, gate_bias: torch.Tensor, core_norm: torch.Tensor,
                        gate_norm: torch.Tensor, eps: float, *, norm: str = "rms",
                        core_norm_bias: torch.Tensor | None = None,
                        gate_norm_bias: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch reference of the formula in the module docstring → ``[E, d]``.

    rows ``[E, d_r]`` and row_weight ``[2H, d_r]`` (or both None); terms ``(P_k [n_k, 2H],
    idx_k [E])``; bias1 ``[2H]``; core/gate weight ``[d, H]`` and bias ``[d]``; core/gate
    norm ``[d]`` (the norms' weights); eps the norms' epsilon. ``norm``: ``"rms"`` (RMSNorm) or
    ``"layer"`` (LayerNorm, with the biases ``core_norm_bias``/``gate_norm_bias [d]``, None for none).
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
    if norm == "layer":
        cn = F.layer_norm(core, (d,), core_norm, core_norm_bias, eps)
        gn = F.layer_norm(gate, (d,), gate_norm, gate_norm_bias, eps)
    else:
        cn, gn = F.rms_norm(core, (d,), core_norm, eps), F.rms_norm(gate, (d,), gate_norm, eps)
    return F.silu(cn) * torch.sigmoid(gn)


NORMS = ("rms", "layer")


def gated_phi(rows, row_weight, terms, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm, gate_norm,
              eps: float, chunk: int | None = None, *, norm: str = "rms", core_norm_bias=None,
              gate_norm_bias=None) -> torch.Tensor:
    """The fused Φ (same arguments as :func:`gated_phi_reference`; ``chunk``: rows per chunk of the
    backward's scatter, default sized to the cache). At least one term or ``rows`` must be given.
    Runs the fused C++ loops of :mod:`.native`; where they cannot run (no compiler, tensors that are
    not contiguous float32/float64 CPU tensors) the reference, with the same numbers."""
    if norm not in NORMS:
        raise ValueError(f"gated_phi: norm must be one of {NORMS}, got {norm!r}")
    n = rows.shape[0] if rows is not None else terms[0][1].shape[0]
    projs, indices = [p for p, _ in terms], [i for _, i in terms]
    if n == 0 or not native.usable(bias1, *projs, *indices):
        return gated_phi_reference(rows, row_weight, terms, bias1, core_weight, core_bias, gate_weight, gate_bias,
                                   core_norm, gate_norm, eps, norm=norm, core_norm_bias=core_norm_bias,
                                   gate_norm_bias=gate_norm_bias)
    if chunk is None:
        chunk = max(64, CHUNK_BYTES // (bias1.shape[0] * bias1.element_size()))
    layer = norm == "layer"
    if layer:  # the loops read both biases: zeros stand in for a missing one
        core_norm_bias = core_norm_bias if core_norm_bias is not None else torch.zeros_like(core_norm)
        gate_norm_bias = gate_norm_bias if gate_norm_bias is not None else torch.zeros_like(gate_norm)
    else:
        core_norm_bias = gate_norm_bias = None
    return torch.ops.matris.gated_phi(rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias,
                                      core_norm, gate_norm, core_norm_bias, gate_norm_bias, projs, indices,
                                      float(eps), layer, int(chunk))[0]


# ---------------------------------------------------------------------------- registered operators
# matris::gated_phi (forward: the output and what the backward reads) and matris::gated_phi_backward
# (input gradients), CPU kernels in the fused C++ loops, fake kernels for shapes, and autograd: the
# backward operator where only input gradients are wanted (inference), else the reference under
# autograd (weight gradients, create_graph: exact second order).
@torch.library.custom_op("matris::gated_phi", mutates_args=(), device_types="cpu")
def gated_phi_op(rows: torch.Tensor | None, row_weight: torch.Tensor | None, bias1: torch.Tensor,
                 core_weight: torch.Tensor, core_bias: torch.Tensor, gate_weight: torch.Tensor,
                 gate_bias: torch.Tensor, core_norm: torch.Tensor, gate_norm: torch.Tensor,
                 core_norm_bias: torch.Tensor | None, gate_norm_bias: torch.Tensor | None,
                 projections: list[torch.Tensor], indices: list[torch.Tensor], eps: float, layer: bool,
                 chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor, torch.Tensor]:
    """``(out [E, d], silu'(pre) [E, 2H], core [E, d], gate [E, d], r_c [E, 1], r_g [E, 1], σ(gn) [E, d])``:
    Φ and what its backward reads (core and gate centred for LayerNorm); ``layer``: LayerNorm (with
    both norm biases given), else RMSNorm."""
    out, pre, core, gate, r_c, r_g, sig = _phi_buffers(rows, indices, bias1, core_weight)
    norms = (core_norm, gate_norm, core_norm_bias, gate_norm_bias, int(layer))
    if not _forward_whole(rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias, norms, eps,
                          projections, indices, pre, core, gate, r_c, r_g, sig, out):
        _forward_native(native.library(), rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias,
                        norms, eps, chunk, projections, indices, pre, core, gate, r_c, r_g, sig, out)
    return out, pre, core, gate, r_c, r_g, sig


def _phi_buffers(rows, indices, bias1, core_weight):
    n = rows.shape[0] if rows is not None else indices[0].shape[0]
    two_h, d = bias1.shape[0], core_weight.shape[0]
    shapes = ((n, d), (n, two_h), (n, d), (n, d), (n, 1), (n, 1), (n, d))
    return tuple(bias1.new_empty(shape) for shape in shapes)


@gated_phi_op.register_fake
def _(rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm, gate_norm, core_norm_bias,
      gate_norm_bias, projections, indices, eps, layer, chunk):
    return _phi_buffers(rows, indices, bias1, core_weight)


@torch.library.custom_op("matris::gated_phi_backward", mutates_args=(), device_types="cpu")
def gated_phi_backward_op(grad: torch.Tensor, row_weight: torch.Tensor | None, core_weight: torch.Tensor,
                          gate_weight: torch.Tensor, core_norm: torch.Tensor, gate_norm: torch.Tensor,
                          core_norm_bias: torch.Tensor | None, slope: torch.Tensor, core: torch.Tensor,
                          gate: torch.Tensor, r_c: torch.Tensor, r_g: torch.Tensor, sig: torch.Tensor,
                          indices: list[torch.Tensor], projection_rows: list[int], want_rows: bool,
                          want_projections: list[bool], layer: bool, chunk: int) -> list[torch.Tensor]:
    """``[∂L/∂rows, ∂L/∂P_1, …]`` from the forward's saved tensors; a gradient that is not wanted is
    an empty tensor."""
    g_rows, g_projs = _phi_grad_buffers(grad, row_weight, slope, projection_rows, want_rows, want_projections)
    grad = grad.contiguous()
    wanted = [g if w else None for g, w in zip(g_projs, want_projections)]
    norms = (core_norm, gate_norm, core_norm_bias, None, int(layer))
    rows_out = g_rows if want_rows else None
    if not _backward_whole(grad, row_weight, core_weight, gate_weight, norms, slope, core, gate, r_c, r_g, sig,
                           indices, rows_out, wanted, chunk):
        _backward_native(native.library(), grad, row_weight, core_weight, gate_weight, norms, slope, core, gate, r_c,
                         r_g, sig, indices, rows_out, wanted, chunk)
    return [g_rows, *g_projs]


def _phi_grad_buffers(grad, row_weight, slope, projection_rows, want_rows, want_projections):
    """∂L/∂rows ``[E, d_r]`` and ∂L/∂P_k ``[n_k, 2H]`` (zeroed: they are scattered into), or empty
    tensors where a gradient is not wanted."""
    g_rows = grad.new_empty((grad.shape[0], row_weight.shape[1]) if want_rows else (0,))
    g_projs = [slope.new_zeros((rows, slope.shape[1])) if want else slope.new_empty((0,))
               for rows, want in zip(projection_rows, want_projections)]
    return g_rows, g_projs


@gated_phi_backward_op.register_fake
def _(grad, row_weight, core_weight, gate_weight, core_norm, gate_norm, core_norm_bias, slope, core, gate, r_c, r_g,
      sig, indices, projection_rows, want_rows, want_projections, layer, chunk):
    g_rows, g_projs = _phi_grad_buffers(grad, row_weight, slope, projection_rows, want_rows, want_projections)
    return [g_rows, *g_projs]


def _phi_setup(ctx, inputs, output):
    (rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, projs, indices, eps, layer, chunk) = inputs
    _, slope, core, gate, r_c, r_g, sig = output
    ctx.set_materialize_grads(False)  # only the first output is differentiable; the others get None
    ctx.save_for_backward(rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, slope, core, gate, r_c, r_g,
                          sig, *projs, *indices)
    ctx.eps, ctx.layer, ctx.chunk, ctx.n_terms = eps, layer, chunk, len(projs)
    ctx.want_rows = rows is not None and rows.requires_grad
    ctx.want_weights = any(t is not None and t.requires_grad for t in (row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc,
                                                                       nbg))
    ctx.want_projections = [p.requires_grad for p in projs]


def _phi_backward(ctx, grad, *_unused):
    saved = ctx.saved_tensors
    rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, slope, core, gate, r_c, r_g, sig = saved[:17]
    projs, indices = list(saved[17 : 17 + ctx.n_terms]), list(saved[17 + ctx.n_terms :])
    eps, layer = ctx.eps, ctx.layer
    if grad is None:  # Φ's output reaches no loss
        return (None, None, *[None] * 9, [None] * len(projs), [None] * len(indices), None, None, None)
    if torch.is_grad_enabled() or ctx.want_weights:
        # create_graph or weight gradients: the reference under autograd (exact second order)
        k = ctx.n_terms
        none = bias1.new_zeros(0)

        def ref(*xs):
            r = xs[0] if rows is not None else None
            rw = xs[1] if rows is not None else None
            return gated_phi_reference(r, rw, list(zip(xs[11 : 11 + k], indices)), *xs[2:9], eps,
                                       norm="layer" if layer else "rms", core_norm_bias=xs[9] if layer else None,
                                       gate_norm_bias=xs[10] if layer else None)

        inputs = (rows if rows is not None else none, row_weight if rows is not None else none, bias1, wc, bc, wg,
                  bg, nc, ng, nbc if layer else none, nbg if layer else none, *projs)
        g = recompute_backward(ref, inputs, grad)
        g_rows, g_rw = (g[0], g[1]) if rows is not None else (None, None)
        g_nb = (g[9], g[10]) if layer else (None, None)
        return (g_rows, g_rw, *g[2:9], *g_nb, list(g[11:]), [None] * k, None, None, None)
    grads = gated_phi_backward_op(grad, row_weight, wc, wg, nc, ng, nbc, slope, core, gate, r_c, r_g, sig, indices,
                                  [p.shape[0] for p in projs], ctx.want_rows, ctx.want_projections, layer, ctx.chunk)
    g_rows = grads[0] if ctx.want_rows else None
    g_projs = [g if want else None for g, want in zip(grads[1:], ctx.want_projections)]
    return (g_rows, *[None] * 10, g_projs, [None] * len(indices), None, None, None)


gated_phi_op.register_autograd(_phi_backward, setup_context=_phi_setup)


def _forward_whole(rows, row_weight, bias1, wc, bc, wg, bg, norms, eps, projs, indices, pre, core, gate, r_c, r_g,
                   sig, out) -> bool:
    """The whole forward in one call of the library's ``phi_fwd`` (float32 with the native GEMM:
    every row goes through the chunk loop's steps, in the same order, while it is in L2).
    False, with nothing written, where it does not apply. ``norms``: (w_c, w_g, b_c, b_g, layer)."""
    if pre.dtype != torch.float32 or not native.whole_calls() or (rows is not None and (
            rows.dtype != torch.float32 or rows.stride(1) != 1)):
        return False
    by_row = native.Matmul(row_weight.T) if rows is not None else None
    by_core, by_gate = native.Matmul(wc.T), native.Matmul(wg.T)
    if any(mm is not None and mm.lib is None for mm in (by_row, by_core, by_gate)):
        return False
    n, h, d = pre.shape[0], wc.shape[1], wc.shape[0]
    bias, bc, bg = (t.contiguous() for t in (bias1, bc, bg))
    nc, ng, nbc, nbg, layer = _norm_args(norms)
    dr = rows.shape[1] if rows is not None else 0
    by_core.lib.phi_fwd(rows.data_ptr() if rows is not None else None, rows.stride(0) if rows is not None else 0, dr,
                        by_row.packed.data_ptr() if by_row is not None else None, n, h, bias.data_ptr(), len(projs),
                        native.ptr_array(projs), native.ptr_array(indices), by_core.packed.data_ptr(),
                        by_gate.packed.data_ptr(), d, bc.data_ptr(), bg.data_ptr(), nc.data_ptr(), ng.data_ptr(),
                        native.ptr(nbc), native.ptr(nbg), layer, eps, pre.data_ptr(), core.data_ptr(),
                        gate.data_ptr(), r_c.data_ptr(), r_g.data_ptr(), sig.data_ptr(), out.data_ptr(),
                        native.threads())
    return True


def _backward_whole(grad, row_weight, wc, wg, norms, pre, core, gate, r_c, r_g, sig, indices, g_rows, g_projs,
                    chunk) -> bool:
    """The whole input-gradient pass in one call of the library's ``phi_bwd`` (float32 with the
    native GEMM); False, with nothing written, where it does not apply."""
    if pre.dtype != torch.float32 or not native.whole_calls() or (g_rows is not None and not g_rows.is_contiguous()):
        return False
    by_core, by_gate = native.Matmul(wc), native.Matmul(wg)
    by_row = native.Matmul(row_weight) if g_rows is not None else None
    if any(mm is not None and mm.lib is None for mm in (by_row, by_core, by_gate)):
        return False
    n, d, h = pre.shape[0], wc.shape[0], wc.shape[1]
    nc, ng, nbc, _, layer = _norm_args(norms)
    wanted = [(gp, ix) for gp, ix in zip(g_projs, indices) if gp is not None]
    by_core.lib.phi_bwd(grad.data_ptr(), core.data_ptr(), gate.data_ptr(), r_c.data_ptr(), r_g.data_ptr(),
                        sig.data_ptr(), nc.data_ptr(), ng.data_ptr(), native.ptr(nbc), layer, pre.data_ptr(), n, d, h,
                        by_core.packed.data_ptr(), by_gate.packed.data_ptr(),
                        by_row.packed.data_ptr() if by_row is not None else None,
                        by_row.n if by_row is not None else 0, native.ptr(g_rows), len(wanted),
                        native.ptr_array([gp for gp, _ in wanted]), native.ptr_array([ix for _, ix in wanted]), chunk,
                        native.threads())
    return True


def _norm_args(norms):
    """(w_c, w_g, b_c, b_g, layer) made contiguous (the biases None for RMSNorm)."""
    nc, ng, nbc, nbg, layer = norms
    return (*(t.contiguous() if t is not None else None for t in (nc, ng, nbc, nbg)), layer)


def _forward_native(lib, rows, row_weight, bias1, wc, bc, wg, bg, norms, eps, chunk, projs, indices, pre, core, gate,
                    r_c, r_g, sig, out):
    """The forward's chunk loop with the fused loops of :mod:`.native` between the GEMMs."""
    n, two_h, h, d = pre.shape[0], pre.shape[1], wc.shape[1], wc.shape[0]
    hid = torch.empty(min(chunk, n), two_h, dtype=pre.dtype)
    gather, epilogue = lib("gather_silu", pre.dtype), lib("gated_fwd", pre.dtype)
    nt = native.threads()
    proj_ptrs = native.ptr_array(projs)
    bias, bc, bg = (t.contiguous() for t in (bias1, bc, bg))
    nc, ng, nbc, nbg, layer = _norm_args(norms)
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
        epilogue(c.data_ptr(), g.data_ptr(), k, d, bc.data_ptr(), bg.data_ptr(), nc.data_ptr(), ng.data_ptr(),
                 native.ptr(nbc), native.ptr(nbg), layer, eps, r_c[s:e].data_ptr(), r_g[s:e].data_ptr(),
                 sig[s:e].data_ptr(), out[s:e].data_ptr(), nt)


def _backward_native(lib, grad, row_weight, wc, wg, norms, pre, core, gate, r_c, r_g, sig, indices, g_rows, g_projs,
                     chunk):
    """The backward's chunk loop with the fused loops of :mod:`.native` between the GEMMs; each
    chunk's ∂L/∂pre is scattered to the projections while it is in cache (``pre`` holds silu'(pre))."""
    n, two_h, h, d = pre.shape[0], pre.shape[1], wc.shape[1], wc.shape[0]
    dt = pre.dtype
    gated, scatter, scale_scatter = lib("gated_bwd", dt), lib("scatter_add", dt), lib("scale_scatter_add", dt)
    nt = native.threads()
    m = min(chunk, n)
    g_hid = torch.empty(m, two_h, dtype=dt)
    g_core, g_gate = torch.empty(m, d, dtype=dt), torch.empty(m, d, dtype=dt)
    nc, ng, nbc, _, layer = _norm_args(norms)
    wanted = [(gp, ix) for gp, ix in zip(g_projs, indices) if gp is not None]
    out_ptrs = native.ptr_array([gp for gp, _ in wanted])
    by_core, by_gate = native.Matmul(wc), native.Matmul(wg)
    by_row = native.Matmul(row_weight) if g_rows is not None else None
    in_gemm = by_core.lib is not None and by_gate.lib is not None
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        k = e - s
        gc, gg, gh = g_core[:k], g_gate[:k], g_hid[:k]
        gated(grad[s:e].data_ptr(), core[s:e].data_ptr(), gate[s:e].data_ptr(), r_c[s:e].data_ptr(),
              r_g[s:e].data_ptr(), sig[s:e].data_ptr(), nc.data_ptr(), ng.data_ptr(), native.ptr(nbc), layer, k, d,
              gc.data_ptr(), gg.data_ptr(), nt)
        idx_ptrs = native.ptr_array([ix[s:e] for _, ix in wanted]) if wanted else None
        # ∂L/∂pre = silu'(pre) ⊙ [G_core·W_c ‖ G_gate·W_g]: with the native GEMM the factor is
        # applied to its tiles in registers and the scatter only reads the product
        by_core(gc, out=gh[:, :h], scale=pre[s:e, :h] if in_gemm else None)
        by_gate(gg, out=gh[:, h:], scale=pre[s:e, h:] if in_gemm else None)
        if in_gemm:
            if wanted:
                scatter(gh.data_ptr(), k, two_h, len(wanted), out_ptrs, idx_ptrs, nt)
        elif wanted:  # ∂L/∂pre = silu'(pre) ⊙ gh, scattered in the same pass
            scale_scatter(gh.data_ptr(), pre[s:e].data_ptr(), k, two_h, len(wanted), out_ptrs, idx_ptrs, nt)
        else:
            gh.mul_(pre[s:e])
        if g_rows is not None:
            by_row(gh, out=g_rows[s:e])
