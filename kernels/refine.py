"""The edge side of Refine on the line graph (spec §5) as one operator, ``matris::refine_edges`` (C++ kernel in
``csrc/cpu/refine.cpp``, Triton kernels below for CUDA).

    u_g   = u ⊙ g,   g = q[src] ⊙ q[tgt]            [E, C]   q = W_env·basis per bond [B, C]
    R[n]  = Σ_{tgt = n} u_g                          [n, C]   (goes to the node FFN)
    y'    = FFN(u_g if smooth else u) + w ⊙ y       [E, C]   FFN = Lin → SiLU → Lin

``u`` is Φ's output. Composed PyTorch ops write ~8 edge-sized tensors in the forward (more in the backward); here each
block of rows goes through every step in cache, summed into R every ``chunk`` rows (threads own channel ranges). The
forward keeps the SiLU slope of the FFN's pre-activation ``[E, C]``; the backward recomputes ``g`` per row:

    G_h  = silu'(h) ⊙ (G_y'·W₂),   G_in = G_h·W₁,   G_y = w ⊙ G_y'
    G_ug = G_R[tgt] (+ G_in if smooth),   G_u = G_ug ⊙ g (+ G_in if not smooth)
    G_q  = index_add(src, G_ug ⊙ u ⊙ q[tgt]) + index_add(tgt, G_ug ⊙ u ⊙ q[src])

Where weights train (first-order passes) the forward also keeps the FFN's activation silu(h + b₁) and the backward
writes G_h, for the weights' GEMMs and column sums; with ``create_graph`` the reference is recomputed under autograd.
On CUDA a Triton kernel computes u_g, ``index_add`` sums R and G_q, and the FFN is cuBLAS GEMMs with bias and SiLU
(and slope) in the first layer's Triton kernel; the backward's per-row terms are one Triton kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import LIB, operators_run, recompute_backward, register_triton, tile, triton_available
from .gather import activate_with_slope
from .segment import scatter_sum

CHUNK_BYTES = 2 << 20  # rows per chunk: 4,096 float32 rows of C = 128


def refine_edges_reference(u, q, src, tgt, num_segments: int, y=None, res_weight=None, w1=None, b1=None, w2=None,
                           b2=None, smooth: bool = False):
    """PyTorch reference of the formulas above → ``(R [n, C], y' [E, C])``, or ``R`` alone when ``y`` is None (no
    edge update: the model's last block). u, y ``[E, C]``; q ``[B, C]``; src, tgt ``[E]``; res_weight ``[1, C]``;
    w1, w2 ``[C, C]`` with biases ``[C]`` or None."""
    u_g = u * (q.index_select(0, src) * q.index_select(0, tgt))
    agg = scatter_sum(u_g, tgt, num_segments)
    if y is None:
        return agg
    delta = F.linear(F.silu(F.linear(u_g if smooth else u, w1, b1)), w2, b2)
    return agg, delta + res_weight * y


def refine_edges(u, q, src, tgt, num_segments: int, y=None, res_weight=None, w1=None, b1=None, w2=None, b2=None,
                 smooth: bool = False, chunk: int | None = None, *, fused: bool = True):
    """:func:`refine_edges_reference` as the operator ``matris::refine_edges`` (``chunk``: rows per chunk of the sums
    into R and ∂L/∂q); the reference if not ``fused`` or without a kernel here (no compiler, not float CPU tensors)."""
    if not fused or u.shape[0] == 0 or not operators_run(u, q, src, tgt, y, res_weight, w1, b1, w2, b2):
        return refine_edges_reference(u, q, src, tgt, num_segments, y, res_weight, w1, b1, w2, b2, smooth)
    if chunk is None:
        chunk = max(64, CHUNK_BYTES // (u.shape[1] * u.element_size()))
    keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (w1, b1, w2, b2))
    agg, y_new = torch.ops.matris.refine_edges(u, q, src, tgt, num_segments, y, res_weight, w1, b1, w2, b2,
                                               bool(smooth), int(chunk), keep)[:2]
    return agg if y is None else (agg, y_new)


# ---------------------------------------------------------------------------- registered operators
# outputs: refine_edges R, y', silu'(h), silu(h) (keep_hidden); its backward G_u, G_q, G_y, G_h; empty where not wanted
LIB.define("refine_edges(Tensor u, Tensor q, Tensor src, Tensor tgt, SymInt num_segments, Tensor? y, "
           "Tensor? res_weight, Tensor? w1, Tensor? b1, Tensor? w2, Tensor? b2, bool smooth, SymInt chunk, "
           "bool keep_hidden) -> (Tensor, Tensor, Tensor, Tensor)")
LIB.define("refine_edges_backward(Tensor g_agg, Tensor? g_ynew, Tensor u, Tensor q, Tensor src, Tensor tgt, "
           "Tensor? w1, Tensor? w2, Tensor h, Tensor? res_weight, bool smooth, SymInt chunk, bool want_u, "
           "bool want_q, bool want_y, bool want_weights) -> (Tensor, Tensor, Tensor, Tensor)")


def _refine_fake(u, q, src, tgt, num_segments, y, res_weight, w1, b1, w2, b2, smooth, chunk, keep_hidden):
    e, c = u.shape
    edges = y is not None
    return (u.new_empty((num_segments, c)), u.new_empty((e, w2.shape[0]) if edges else (0,)),
            u.new_empty((e, w1.shape[0]) if edges else (0,)),
            u.new_empty((e, w1.shape[0]) if edges and keep_hidden else (0,)))


def _refine_backward_fake(g_agg, g_ynew, u, q, src, tgt, w1, w2, h, res_weight, smooth, chunk, want_u, want_q,
                          want_y, want_weights):
    return (u.new_empty(u.shape if want_u else (0,)), q.new_empty(q.shape if want_q else (0,)),
            u.new_empty(g_ynew.shape if want_y and g_ynew is not None else (0,)),
            u.new_empty((u.shape[0], w1.shape[0]) if want_weights and g_ynew is not None else (0,)))


def _refine_setup(ctx, inputs, output):
    u, q, src, tgt, n, y, res_weight, w1, b1, w2, b2, smooth, chunk, _keep = inputs
    ctx.set_materialize_grads(False)  # an output that reaches no loss gets None: its backward is skipped
    ctx.save_for_backward(u, q, src, tgt, y, res_weight, w1, b1, w2, b2, output[2], output[3])
    ctx.n, ctx.smooth, ctx.chunk, ctx.edges = n, smooth, chunk, y is not None
    ctx.want = (u.requires_grad, q.requires_grad, y is not None and y.requires_grad)
    ctx.want_weights = any(t is not None and t.requires_grad for t in (res_weight, w1, b1, w2, b2))


def _refine_backward(ctx, g_agg, g_ynew, *_unused):
    u, q, src, tgt, y, res_weight, w1, b1, w2, b2, h, act = ctx.saved_tensors
    n, smooth = ctx.n, ctx.smooth
    if g_agg is None:
        g_agg = u.new_zeros((n, u.shape[1]))
    if not ctx.edges:
        g_ynew = None
    if not ctx.edges and torch.is_grad_enabled():
        g = recompute_backward(lambda u_, q_: refine_edges_reference(u_, q_, src, tgt, n), (u, q), g_agg)
        return g[0], g[1], *[None] * 12
    want_w = ctx.edges and ctx.want_weights
    if ctx.edges and (torch.is_grad_enabled() or (want_w and act.numel() == 0 and u.shape[0] > 0)):
        # create_graph (or weight gradients without the forward's activation): the reference under autograd
        def ref(u_, q_, y_, rw, w1_, w2_, *biases):
            bb = list(biases)
            b1_ = bb.pop(0) if b1 is not None else None
            b2_ = bb.pop(0) if b2 is not None else None
            return refine_edges_reference(u_, q_, src, tgt, n, y_, rw, w1_, b1_, w2_, b2_, smooth)

        inputs = (u, q, y, res_weight, w1, w2) + tuple(b for b in (b1, b2) if b is not None)
        g = recompute_backward(ref, inputs, (g_agg, g_ynew if g_ynew is not None else torch.zeros_like(y)))
        rest = list(g[6:])
        gb1 = rest.pop(0) if b1 is not None else None
        gb2 = rest.pop(0) if b2 is not None else None
        return g[0], g[1], None, None, None, g[2], g[3], g[4], gb1, g[5], gb2, None, None, None
    want_u, want_q, want_y = ctx.want
    g_u, g_q, g_y, g_h = torch.ops.matris.refine_edges_backward(g_agg, g_ynew, u, q, src, tgt, w1, w2, h, res_weight,
                                                                smooth, ctx.chunk, want_u, want_q, want_y,
                                                                want_w and g_ynew is not None)
    g_w = [None] * 5  # res_weight, w1, b1, w2, b2
    if want_w and g_ynew is not None:
        x = u * (q.index_select(0, src) * q.index_select(0, tgt)) if smooth else u  # the FFN's input
        g_w = [(g_ynew * y).sum(0).view(res_weight.shape), g_h.T @ x, g_h.sum(0) if b1 is not None else None,
               g_ynew.T @ act, g_ynew.sum(0) if b2 is not None else None]
    return (g_u if want_u else None, g_q if want_q else None, None, None, None,
            g_y if want_y and g_ynew is not None else None, *g_w, None, None, None)


torch.library.register_fake("matris::refine_edges")(_refine_fake)
torch.library.register_fake("matris::refine_edges_backward")(_refine_backward_fake)
torch.library.register_autograd("matris::refine_edges", _refine_backward, setup_context=_refine_setup)


# ---------------------------------------------------------------------------- CUDA (Triton)
BLOCK_ROWS, BLOCK_COLS = 16, 64


def _refine_triton(u, q, src, tgt, num_segments, y, res_weight, w1, b1, w2, b2, smooth, chunk, keep_hidden):
    """The CUDA kernel of ``matris::refine_edges``: the C++ kernel's outputs."""
    e, c = u.shape
    u, q = u.contiguous(), q.contiguous()
    u_g = torch.empty_like(u)
    if e:
        _launch(u, q, src, tgt, u_g, None, None, None, None, None, False, False)
    agg = u.new_zeros((num_segments, c)).index_add_(0, tgt, u_g)
    if y is None:
        return agg, u.new_empty((0,)), u.new_empty((0,)), u.new_empty((0,))
    pre = (u_g if smooth else u) @ w1.T
    if e:
        hid, slope = activate_with_slope([(pre, None)], b1, "silu", e)
    else:
        hid, slope = pre, torch.empty_like(pre)
    y_new = torch.addmm(b2, hid, w2.T) if b2 is not None else hid @ w2.T
    return agg, y_new.addcmul_(res_weight, y), slope, hid if keep_hidden else u.new_empty((0,))


def _refine_backward_triton(g_agg, g_ynew, u, q, src, tgt, w1, w2, h, res_weight, smooth, chunk, want_u, want_q,
                            want_y, want_weights):
    """The CUDA kernel of ``matris::refine_edges_backward`` (the formulas of the module docstring)."""
    e, c = u.shape
    edges = g_ynew is not None
    g_h = (g_ynew @ w2).mul_(h) if edges else None  # G_h = silu'(h) ⊙ G_y'·W₂
    g_in = g_h @ w1 if edges else None  # G_in = G_h·W₁
    g_u = torch.empty_like(u) if want_u else u.new_empty((0,))
    to_src = torch.empty_like(u) if want_q else None
    to_tgt = torch.empty_like(u) if want_q else None
    if e and (want_u or want_q):
        _launch(u.contiguous(), q.contiguous(), src, tgt, None, g_agg.contiguous(), g_in, g_u, to_src, to_tgt,
                smooth, True, want_u=want_u, want_q=want_q)
    g_q = q.new_zeros(q.shape).index_add_(0, src, to_src).index_add_(0, tgt, to_tgt) if want_q else u.new_empty((0,))
    g_y = g_ynew * res_weight if edges and want_y else u.new_empty((0,))
    return g_u, g_q, g_y, g_h if edges and want_weights else u.new_empty((0,))


def _launch(u, q, src, tgt, u_g, g_agg, g_in, g_u, to_src, to_tgt, smooth, backward, want_u=False, want_q=False):
    e, c = u.shape
    block_r, block_c = tile(BLOCK_ROWS, 128), tile(BLOCK_COLS, 128)
    grid = (triton.cdiv(e, block_r), triton.cdiv(c, block_c))
    refine_edges_kernel[grid](u, q, src, tgt, u_g if u_g is not None else u, g_agg if backward else u,
                              g_in if g_in is not None else u, g_u if want_u else u, to_src if want_q else u,
                              to_tgt if want_q else u, e, c, BACKWARD=backward, HAS_GIN=g_in is not None,
                              SMOOTH=bool(smooth), WANT_U=want_u, WANT_Q=want_q, BLOCK_R=block_r, BLOCK_C=block_c)


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def refine_edges_kernel(u_ptr, q_ptr, src_ptr, tgt_ptr, ug_ptr, gagg_ptr, gin_ptr, gu_ptr, tosrc_ptr, totgt_ptr,
                            E, C, BACKWARD: tl.constexpr, HAS_GIN: tl.constexpr, SMOOTH: tl.constexpr,
                            WANT_U: tl.constexpr, WANT_Q: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        """Forward: u_g. Backward (module docstring): G_u, and the rows to src and tgt that index_add sums into G_q."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
        rmask = rows < E
        mask = rmask[:, None] & (cols < C)[None, :]
        s = tl.load(src_ptr + rows, mask=rmask, other=0).to(tl.int64)
        t = tl.load(tgt_ptr + rows, mask=rmask, other=0).to(tl.int64)
        offs = rows[:, None] * C + cols[None, :]
        u = tl.load(u_ptr + offs, mask=mask, other=0.0)
        qs = tl.load(q_ptr + s[:, None] * C + cols[None, :], mask=mask, other=0.0)
        qt = tl.load(q_ptr + t[:, None] * C + cols[None, :], mask=mask, other=0.0)
        if not BACKWARD:
            tl.store(ug_ptr + offs, u * (qs * qt), mask=mask)
        else:
            gug = tl.load(gagg_ptr + t[:, None] * C + cols[None, :], mask=mask, other=0.0)
            if HAS_GIN:
                gin = tl.load(gin_ptr + offs, mask=mask, other=0.0)
                if SMOOTH:
                    gug += gin
            if WANT_U:
                gu = gug * (qs * qt)
                if HAS_GIN:
                    if not SMOOTH:
                        gu += gin
                tl.store(gu_ptr + offs, gu, mask=mask)
            if WANT_Q:
                w = gug * u
                tl.store(tosrc_ptr + offs, w * qt, mask=mask)
                tl.store(totgt_ptr + offs, w * qs, mask=mask)


register_triton("refine_edges", _refine_triton)
register_triton("refine_edges_backward", _refine_backward_triton)
