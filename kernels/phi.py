"""The whole gated Φ of an edge update (spec §5) as one operator, ``matris::gated_phi`` (C++ kernel in
``csrc/cpu/phi.cpp``, Triton kernels below for CUDA): first layer, gathers, activation, second layers, gated epilogue.

    pre  = R·W_rᵀ + Σ_k P_k[idx_k] + b₁,   hid = silu(pre)    [E, 2H]  (core ‖ gate halves)
    core = hid_c·W_cᵀ + b_c,   gate = hid_g·W_gᵀ + b_g       [E, d]
    out  = silu(N_c(core)) ⊙ σ(N_g(gate))                    [E, d]

R ``[E, d_r]``: per-row term (angle features; None when all terms are gathered); ``P_k [n_k, 2H]``: per-node
projections (``matris.model.attention``); N: RMSNorm ``N(x) = x·r·w``, ``r = 1/sqrt(mean(x²) + eps)``, or LayerNorm
``N(x) = x̄·r·w + b``, ``x̄ = x − mean(x)``, ``r = 1/sqrt(mean(x̄²) + eps)`` (the published 10M models); this is
``GatedMLP.forward_terms`` with SiLU. On a CPU these tensors (29k angles × 256 floats for Si64) overflow the cache and
composed ops make ~15 passes each way, so each thread runs every step on blocks of 24 rows while in L2 (GEMMs in a
register kernel, weights packed once per call). The forward keeps ``silu'(pre)``, ``core``, ``gate`` (centred for
LayerNorm) and the row statistics r; the backward reads them once per block, summing ∂L/∂P_k every ``chunk`` rows
(threads own channels: the same sums for any thread count):

    G_cn = silu'(cn) ⊙ σ(gn) ⊙ G,       G_gn = σ'(gn) ⊙ silu(cn) ⊙ G,      X_c = w_c ⊙ G_cn
    G_core = r_c·X_c − core·r_c³·mean(X_c ⊙ core) [− r_c·mean(X_c) for LayerNorm]   (likewise gate)
    G_pre = silu'(pre) ⊙ [G_core·W_c ‖ G_gate·W_g],   G_R = G_pre·W_r,   G_{P_k} = index_add(idx_k, G_pre)

Where weights train (first-order passes) the forward also keeps ``hid`` and the backward writes G_pre, G_core, G_gate,
∂L/∂cn, ∂L/∂gn for :func:`_phi_weight_grads`; with ``create_graph`` it recomputes the reference under autograd.

On CUDA: a Triton pass for the gathers, bias and SiLU (:func:`.gather.activate_with_slope`, after one GEMM ``R·W_rᵀ``),
cuBLAS for the second layers and the epilogue kernel below, whose backward gives ``G_core``, ``G_gate``; GEMMs and
``index_add`` give the rest. Both forms return the same tensors (the tests compare them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import LIB, device_constants, operators_run, recompute_backward, register_triton, tile, triton_available
from .gather import activate, activate_with_slope, gather_sum_activate_reference

Term = tuple[torch.Tensor, "torch.Tensor | None"]
# Rows per chunk of the backward's scatter: a [chunk, 2H] buffer of 4 MiB, the fastest of 0.25-32 MiB on a 2-core EPYC
CHUNK_BYTES = 4 << 20


def gated_phi_reference(rows: torch.Tensor | None, row_weight: torch.Tensor | None, terms: list[Term],
                        bias1: torch.Tensor, core_weight: torch.Tensor, core_bias: torch.Tensor,
                        gate_weight: torch.Tensor, gate_bias: torch.Tensor, core_norm: torch.Tensor,
                        gate_norm: torch.Tensor, eps: float, *, norm: str = "rms",
                        core_norm_bias: torch.Tensor | None = None, gate_norm_bias: torch.Tensor | None = None,
                        act: str = "silu", dropout=None) -> torch.Tensor:
    """PyTorch reference of the module docstring's formula → ``[E, d]`` for every model configuration: any ``act`` of
    :data:`.gather.ACTIVATIONS` for both SiLUs, ``dropout`` (a module, or None) on ``hid``. rows ``[E, d_r]`` and
    row_weight ``[2H, d_r]`` (or both None); terms ``(P_k [n_k, 2H], idx_k [E])``; bias1 ``[2H]``; core/gate weight
    ``[d, H]``, bias and norm weight ``[d]``; ``norm`` ``"rms"`` or ``"layer"`` (biases ``*_norm_bias [d]`` or None)."""
    if rows is not None and not terms:  # Φ of one input (a concatenation): its two Linears, as nn.Linear computes
        h = bias1.shape[0] // 2
        hid = torch.cat([activate(F.linear(rows, row_weight[k:k + h], bias1[k:k + h]), act) for k in (0, h)], dim=1)
    else:
        first = ([(rows @ row_weight.T, None)] if rows is not None else []) + list(terms)
        hid = gather_sum_activate_reference(first, bias1, act)
    if dropout is not None:
        hid = dropout(hid)
    h = core_weight.shape[1]
    core = F.linear(hid[:, :h], core_weight, core_bias)
    gate = F.linear(hid[:, h:], gate_weight, gate_bias)
    d = core.shape[-1]
    if norm == "layer":
        cn = F.layer_norm(core, (d,), core_norm, core_norm_bias, eps)
        gn = F.layer_norm(gate, (d,), gate_norm, gate_norm_bias, eps)
    else:
        cn, gn = F.rms_norm(core, (d,), core_norm, eps), F.rms_norm(gate, (d,), gate_norm, eps)
    return activate(cn, act) * torch.sigmoid(gn)


NORMS = ("rms", "layer")


def gated_phi(rows, row_weight, terms, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm, gate_norm,
              eps: float, chunk: int | None = None, *, norm: str = "rms", core_norm_bias=None,
              gate_norm_bias=None, act: str = "silu", dropout=None, fused: bool = True) -> torch.Tensor:
    """Φ (arguments of :func:`gated_phi_reference`; ``chunk``: rows per chunk of the backward's scatter, default
    sized to the cache); needs a term or ``rows``. Runs ``matris::gated_phi`` (:mod:`.native`) where it applies (SiLU,
    no active dropout), has a kernel (:func:`.backend.operators_run`) and ``fused`` asks for it; else the reference."""
    if norm not in NORMS:
        raise ValueError(f"gated_phi: norm must be one of {NORMS}, got {norm!r}")
    n = rows.shape[0] if rows is not None else terms[0][1].shape[0]
    projs, indices = [p for p, _ in terms], [i for _, i in terms]
    applies = act == "silu" and (dropout is None or not dropout.training or dropout.p == 0)
    if not (fused and applies) or n == 0 or not operators_run(rows, bias1, *projs, *indices):
        return gated_phi_reference(rows, row_weight, terms, bias1, core_weight, core_bias, gate_weight, gate_bias,
                                   core_norm, gate_norm, eps, norm=norm, core_norm_bias=core_norm_bias,
                                   gate_norm_bias=gate_norm_bias, act=act, dropout=dropout)
    if chunk is None:
        chunk = max(64, CHUNK_BYTES // (bias1.shape[0] * bias1.element_size()))
    layer = norm == "layer"
    if layer:  # the loops read both biases: zeros stand in for a missing one
        core_norm_bias = core_norm_bias if core_norm_bias is not None else torch.zeros_like(core_norm)
        gate_norm_bias = gate_norm_bias if gate_norm_bias is not None else torch.zeros_like(gate_norm)
    else:
        core_norm_bias = gate_norm_bias = None
    weights = (row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm, gate_norm,
               core_norm_bias, gate_norm_bias)
    keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in weights)
    return torch.ops.matris.gated_phi(rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias,
                                      core_norm, gate_norm, core_norm_bias, gate_norm_bias, projs, indices,
                                      float(eps), layer, int(chunk), keep)[0]


# ---------------------------------------------------------------------------- registered operators
# matris::gated_phi → out, slope = silu'(pre), core, gate, r_c, r_g (σ(gn) recomputed), hid (with keep_hidden);
# matris::gated_phi_backward → the input gradients and, with want_weights, :func:`_phi_weight_buffers`' terms.
LIB.define("gated_phi(Tensor? rows, Tensor? row_weight, Tensor bias1, Tensor core_weight, Tensor core_bias, "
           "Tensor gate_weight, Tensor gate_bias, Tensor core_norm, Tensor gate_norm, Tensor? core_norm_bias, "
           "Tensor? gate_norm_bias, Tensor[] projections, Tensor[] indices, float eps, bool layer, SymInt chunk, "
           "bool keep_hidden) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
LIB.define("gated_phi_backward(Tensor grad, Tensor? row_weight, Tensor core_weight, Tensor gate_weight, "
           "Tensor core_norm, Tensor gate_norm, Tensor? core_norm_bias, Tensor? gate_norm_bias, Tensor slope, "
           "Tensor core, Tensor gate, Tensor r_c, Tensor r_g, Tensor[] indices, SymInt[] projection_rows, "
           "bool want_rows, bool[] want_projections, bool layer, SymInt chunk, bool want_weights) -> Tensor[]")


def _phi_buffers(rows, indices, bias1, core_weight, keep_hidden=False):
    n = rows.shape[0] if rows is not None else indices[0].shape[0]
    two_h, d = bias1.shape[0], core_weight.shape[0]
    shapes = ((n, d), (n, two_h), (n, d), (n, d), (n, 1), (n, 1), (n, two_h) if keep_hidden else (0,))
    return tuple(bias1.new_empty(shape) for shape in shapes)


def _phi_fake(rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm, gate_norm,
              core_norm_bias, gate_norm_bias, projections, indices, eps, layer, chunk, keep_hidden=False):
    return _phi_buffers(rows, indices, bias1, core_weight, keep_hidden)


def _phi_grad_buffers(grad, row_weight, slope, projection_rows, want_rows, want_projections):
    """∂L/∂rows ``[E, d_r]`` and ∂L/∂P_k ``[n_k, 2H]``, or empty tensors where a gradient is not wanted."""
    g_rows = grad.new_empty((grad.shape[0], row_weight.shape[1]) if want_rows else (0,))
    g_projs = [slope.new_empty((rows, slope.shape[1])) if want else slope.new_empty((0,))
               for rows, want in zip(projection_rows, want_projections)]
    return g_rows, g_projs


def _phi_backward_fake(grad, row_weight, core_weight, gate_weight, core_norm, gate_norm, core_norm_bias, gate_norm_bias,
                       slope, core, gate, r_c, r_g, indices, projection_rows, want_rows, want_projections, layer,
                       chunk, want_weights=False):
    g_rows, g_projs = _phi_grad_buffers(grad, row_weight, slope, projection_rows, want_rows, want_projections)
    return [g_rows, *g_projs, *(_phi_weight_buffers(slope, core) if want_weights else [])]


def _phi_weight_buffers(slope, core):
    """G_pre ``[E, 2H]``, G_core, G_gate, ∂L/∂cn, ∂L/∂gn ``[E, d]``: what the weight gradients are made of."""
    return [torch.empty_like(slope), *[torch.empty_like(core) for _ in range(4)]]


def _phi_setup(ctx, inputs, output):
    (rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, projs, indices, eps, layer, chunk) = inputs[:16]
    _, slope, core, gate, r_c, r_g, hid = output
    ctx.set_materialize_grads(False)  # only the first output is differentiable; the others get None
    ctx.save_for_backward(rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, slope, core, gate, r_c, r_g, hid,
                          *projs, *indices)
    ctx.eps, ctx.layer, ctx.chunk, ctx.n_terms = eps, layer, chunk, len(projs)
    ctx.want_rows = rows is not None and rows.requires_grad
    ctx.want_weights = any(t is not None and t.requires_grad for t in (row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc,
                                                                       nbg))
    ctx.want_projections = [p.requires_grad for p in projs]


def _phi_backward(ctx, grad, *_unused):
    saved = ctx.saved_tensors
    rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, slope, core, gate, r_c, r_g, hid = saved[:17]
    projs, indices = list(saved[17 : 17 + ctx.n_terms]), list(saved[17 + ctx.n_terms :])
    eps, layer = ctx.eps, ctx.layer
    tail = (None, None, None, None)  # eps, layer, chunk, keep_hidden
    if grad is None:  # Φ's output reaches no loss
        return (None, None, *[None] * 9, [None] * len(projs), [None] * len(indices), *tail)
    if torch.is_grad_enabled() or (ctx.want_weights and hid.numel() == 0 and slope.shape[0] > 0):
        # create_graph (or weight gradients without the forward's hid): the reference under autograd
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
        return (g_rows, g_rw, *g[2:9], *g_nb, list(g[11:]), [None] * k, *tail)
    want_w = ctx.want_weights
    grads = torch.ops.matris.gated_phi_backward(grad, row_weight, wc, wg, nc, ng, nbc, nbg, slope, core, gate, r_c, r_g,
                                                indices, [p.shape[0] for p in projs], ctx.want_rows,
                                                ctx.want_projections, layer, ctx.chunk, want_w)
    k = ctx.n_terms
    g_rows = grads[0] if ctx.want_rows else None
    g_projs = [g if want else None for g, want in zip(grads[1 : 1 + k], ctx.want_projections)]
    g_w = [None] * 10
    if want_w:
        g_w = _phi_weight_grads(rows, hid, core, gate, r_c, r_g, layer, *grads[1 + k :])
        if rows is None:
            g_w[0] = None
    return (g_rows, *g_w, g_projs, [None] * len(indices), *tail)


def _phi_weight_grads(rows, hid, core, gate, r_c, r_g, layer, g_pre, g_core, g_gate, g_cn, g_gn):
    """The weights' gradients (in argument order) from the backward's row terms; ``core·r_c`` is the normalised row."""
    h = hid.shape[1] // 2
    g_rw = g_pre.T @ rows if rows is not None else None
    g_wc, g_wg = g_core.T @ hid[:, :h], g_gate.T @ hid[:, h:]
    g_nc = ((g_cn * core).T @ r_c).squeeze(1)
    g_ng = ((g_gn * gate).T @ r_g).squeeze(1)
    g_nbc, g_nbg = (g_cn.sum(0), g_gn.sum(0)) if layer else (None, None)
    return [g_rw, g_pre.sum(0), g_wc, g_core.sum(0), g_wg, g_gate.sum(0), g_nc, g_ng, g_nbc, g_nbg]


torch.library.register_fake("matris::gated_phi")(_phi_fake)
torch.library.register_fake("matris::gated_phi_backward")(_phi_backward_fake)
torch.library.register_autograd("matris::gated_phi", _phi_backward, setup_context=_phi_setup)


# ---------------------------------------------------------------------------- CUDA (Triton)
EPILOGUE_ROWS = 4  # rows per program of the epilogue kernel (4 × 128 tiles)


def _phi_triton(rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm, gate_norm,
                core_norm_bias, gate_norm_bias, projections, indices, eps, layer, chunk, keep_hidden=False):
    """The CUDA kernel of ``matris::gated_phi``: the outputs of the C++ kernel, from Triton and cuBLAS."""
    n = rows.shape[0] if rows is not None else indices[0].shape[0]
    two_h = bias1.shape[0]
    h = two_h // 2
    terms = [(p.contiguous(), i.contiguous()) for p, i in zip(projections, indices)]
    if rows is not None:  # the per-row term, one GEMM; the kernel adds the gathered ones to it
        terms.insert(0, (rows @ row_weight.T, None))
    if n == 0:
        hid, slope = bias1.new_empty((0, two_h)), bias1.new_empty((0, two_h))
    else:
        hid, slope = activate_with_slope(terms, bias1, "silu", n)
    core = torch.addmm(core_bias, hid[:, :h], core_weight.T)
    gate = torch.addmm(gate_bias, hid[:, h:], gate_weight.T)
    if not keep_hidden:
        hid = bias1.new_empty((0,))
    out = torch.empty_like(core)
    r_c, r_g = core.new_empty((n, 1)), core.new_empty((n, 1))
    if n:
        _epilogue_launch(core, gate, core_norm, gate_norm, core_norm_bias, gate_norm_bias, eps, layer,
                         None, out, r_c, r_g, None, None)
    return out, slope, core, gate, r_c, r_g, hid


def _phi_backward_triton(grad, row_weight, core_weight, gate_weight, core_norm, gate_norm, core_norm_bias,
                         gate_norm_bias, slope, core, gate, r_c, r_g, indices, projection_rows, want_rows,
                         want_projections, layer, chunk, want_weights=False):
    """The CUDA kernel of ``matris::gated_phi_backward`` (the formulas of the module docstring)."""
    n, two_h = slope.shape
    g_core, g_gate = torch.empty_like(core), torch.empty_like(gate)
    g_cn, g_gn = (torch.empty_like(core), torch.empty_like(gate)) if want_weights else (None, None)
    if n:
        _epilogue_launch(core, gate, core_norm, gate_norm, core_norm_bias, gate_norm_bias, 0.0, layer,
                         grad.contiguous(), None, r_c, r_g, g_core, g_gate, g_cn, g_gn)
    g_pre = torch.cat([g_core @ core_weight, g_gate @ gate_weight], dim=1).mul_(slope)
    g_rows = g_pre @ row_weight if want_rows else slope.new_empty((0,))
    g_projs = [slope.new_zeros((rows_k, two_h)).index_add_(0, idx, g_pre) if want else slope.new_empty((0,))
               for rows_k, idx, want in zip(projection_rows, indices, want_projections)]
    return [g_rows, *g_projs, *((g_pre, g_core, g_gate, g_cn, g_gn) if want_weights else ())]


def _epilogue_launch(core, gate, nc, ng, nbc, nbg, eps, layer, grad, out, r_c, r_g, g_core, g_gate, g_cn=None,
                     g_gn=None):
    n, d = core.shape
    dt = core.dtype
    eps_t = device_constants((float(eps),), dt, core.device)
    nc, ng = nc.to(dt).contiguous(), ng.to(dt).contiguous()
    nbc = nbc.to(dt).contiguous() if layer and nbc is not None else nc  # never read for RMSNorm
    nbg = nbg.to(dt).contiguous() if layer and nbg is not None else ng
    block_r = tile(EPILOGUE_ROWS, 64)
    backward = grad is not None
    phi_epilogue_kernel[(triton.cdiv(n, block_r),)](
        core, gate, nc, ng, nbc, nbg, eps_t, grad if backward else core, out if out is not None else core,
        r_c, r_g, g_core if backward else core, g_gate if backward else core,
        g_cn if g_cn is not None else core, g_gn if g_gn is not None else core, n, d, LAYER=bool(layer),
        BACKWARD=backward, KEEP=g_cn is not None, BLOCK_R=block_r, BLOCK_D=max(16, triton.next_power_of_2(d)))


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def phi_epilogue_kernel(core_ptr, gate_ptr, nc_ptr, ng_ptr, nbc_ptr, nbg_ptr, eps_ptr, grad_ptr, out_ptr,
                            rc_ptr, rg_ptr, gcore_ptr, ggate_ptr, gcn_ptr, ggn_ptr, n_rows, D, LAYER: tl.constexpr,
                            BACKWARD: tl.constexpr, KEEP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        """The epilogue, as the C++ kernel computes it. Forward: centres core, gate in place (LayerNorm), writes r per
        row and out. Backward: G_core, G_gate (σ(gn) recomputed); KEEP: also ∂L/∂cn, ∂L/∂gn (norm weight gradients)."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_D)
        rmask = rows < n_rows
        cmask = cols < D
        mask = rmask[:, None] & cmask[None, :]
        offs = rows[:, None] * D + cols[None, :]
        c = tl.load(core_ptr + offs, mask=mask, other=0.0)
        g = tl.load(gate_ptr + offs, mask=mask, other=0.0)
        wc = tl.load(nc_ptr + cols, mask=cmask, other=0.0)[None, :]
        wg = tl.load(ng_ptr + cols, mask=cmask, other=0.0)[None, :]
        if not BACKWARD:
            eps = tl.load(eps_ptr)
            if LAYER:
                c = tl.where(mask, c - (tl.sum(c, axis=1) / D)[:, None], 0.0)
                g = tl.where(mask, g - (tl.sum(g, axis=1) / D)[:, None], 0.0)
                tl.store(core_ptr + offs, c, mask=mask)
                tl.store(gate_ptr + offs, g, mask=mask)
            rc = 1.0 / tl.sqrt(tl.sum(c * c, axis=1) / D + eps)
            rg = 1.0 / tl.sqrt(tl.sum(g * g, axis=1) / D + eps)
            tl.store(rc_ptr + rows, rc, mask=rmask)
            tl.store(rg_ptr + rows, rg, mask=rmask)
        else:
            rc = tl.load(rc_ptr + rows, mask=rmask, other=0.0)
            rg = tl.load(rg_ptr + rows, mask=rmask, other=0.0)
        cn = c * rc[:, None] * wc
        if LAYER:
            cn += tl.load(nbc_ptr + cols, mask=cmask, other=0.0)[None, :]
        sc = tl.sigmoid(cn)
        gn = g * rg[:, None] * wg
        if LAYER:
            gn += tl.load(nbg_ptr + cols, mask=cmask, other=0.0)[None, :]
        sv = tl.sigmoid(gn)
        if not BACKWARD:
            tl.store(out_ptr + offs, cn * sc * sv, mask=mask)
        else:
            gr = tl.load(grad_ptr + offs, mask=mask, other=0.0)
            gcn = gr * sv * sc * (1.0 + cn * (1.0 - sc))  # ∂L/∂cn
            ggn = gr * cn * sc * sv * (1.0 - sv)  # ∂L/∂gn
            if KEEP:
                tl.store(gcn_ptr + offs, gcn, mask=mask)
                tl.store(ggn_ptr + offs, ggn, mask=mask)
            xc = gcn * wc  # ∂L/∂(core·r_c)
            xg = ggn * wg  # ∂L/∂(gate·r_g)
            kc = tl.sum(xc * c, axis=1) * rc * rc * rc / D
            kg = tl.sum(xg * g, axis=1) * rg * rg * rg / D
            if LAYER:
                xc -= (tl.sum(xc, axis=1) / D)[:, None]
                xg -= (tl.sum(xg, axis=1) / D)[:, None]
            tl.store(gcore_ptr + offs, xc * rc[:, None] - c * kc[:, None], mask=mask)
            tl.store(ggate_ptr + offs, xg * rg[:, None] - g * kg[:, None], mask=mask)


register_triton("gated_phi", _phi_triton)
register_triton("gated_phi_backward", _phi_backward_triton)
