"""The edge side of Refine on the line graph (spec §5), fused for the CPU.

    g     = q[src] ⊙ q[tgt]                        [E, C]   q = W_env·basis per bond [B, C]
    u_g   = u ⊙ g
    R[n]  = Σ_{tgt = n} u_g                          [n, C]   (goes to the node FFN)
    y'    = FFN(u_g if smooth else u) + w ⊙ y       [E, C]   FFN = Lin → SiLU → Lin

``u`` is Φ's output. The composed PyTorch ops write about eight edge-sized tensors in the
forward pass and more in the backward; here each chunk of rows goes through every step in
cache. The forward keeps the SiLU slope of the FFN's pre-activation ``[E, C]``; the backward
recomputes ``g`` per chunk:

    G_h  = silu'(h) ⊙ (G_y'·W₂),   G_in = G_h·W₁,   G_y = w ⊙ G_y'
    G_ug = G_R[tgt] (+ G_in if smooth),   G_u = G_ug ⊙ g (+ G_in if not smooth)
    G_q  = index_add(src, G_ug ⊙ u ⊙ q[tgt]) + index_add(tgt, G_ug ⊙ u ⊙ q[src])

Input gradients only (weights are frozen at inference); with weight gradients or a graph of
the backward wanted, the reference is recomputed under autograd (exact second order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from .backend import recompute_backward
from .segment import scatter_sum

CHUNK_BYTES = 2 << 20  # rows per chunk: 4,096 float32 rows of C = 128


def refine_edges_reference(u, q, src, tgt, num_segments: int, y=None, res_weight=None, w1=None, b1=None, w2=None,
                           b2=None, smooth: bool = False):
    """PyTorch reference of the formulas above → ``(R [n, C], y' [E, C])``, or ``R`` alone
    when ``y`` is None (no edge update: the model's last block).

    u, y: ``[E, C]``; q: ``[B, C]``; src, tgt: ``[E]``; res_weight: ``[1, C]``; w1, w2:
    ``[C, C]`` with biases ``[C]`` or None.
    """
    u_g = u * (q.index_select(0, src) * q.index_select(0, tgt))
    agg = scatter_sum(u_g, tgt, num_segments)
    if y is None:
        return agg
    delta = F.linear(F.silu(F.linear(u_g if smooth else u, w1, b1)), w2, b2)
    return agg, delta + res_weight * y


def refine_edges(u, q, src, tgt, num_segments: int, y=None, res_weight=None, w1=None, b1=None, w2=None, b2=None,
                 smooth: bool = False, chunk: int | None = None):
    """:func:`refine_edges_reference` in the fused C++ loops of :mod:`.native` (``chunk`` rows at a
    time); without them (no compiler, not contiguous float CPU tensors) the reference."""
    if u.shape[0] == 0 or not native.usable(u, q, src, tgt):
        return refine_edges_reference(u, q, src, tgt, num_segments, y, res_weight, w1, b1, w2, b2, smooth)
    if chunk is None:
        chunk = max(64, CHUNK_BYTES // (u.shape[1] * u.element_size()))
    agg, y_new, _ = torch.ops.matris.refine_edges(u, q, src, tgt, num_segments, y, res_weight, w1, b1, w2, b2,
                                                  bool(smooth), int(chunk))
    return agg if y is None else (agg, y_new)


# ---------------------------------------------------------------------------- registered operators
# matris::refine_edges (forward: R, y' and the FFN's SiLU slope) and matris::refine_edges_backward
# (input gradients): CPU kernels in the fused C++ loops, fake kernels for shapes, and autograd: the
# backward operator where only input gradients are wanted (inference), else the reference under
# autograd (exact second order).
@torch.library.custom_op("matris::refine_edges", mutates_args=(), device_types="cpu")
def refine_edges_op(u: torch.Tensor, q: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor, num_segments: int,
                    y: torch.Tensor | None, res_weight: torch.Tensor | None, w1: torch.Tensor | None,
                    b1: torch.Tensor | None, w2: torch.Tensor | None, b2: torch.Tensor | None, smooth: bool,
                    chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(R [n, C], y' [E, C], silu'(h) [E, C_h])``; without ``y`` (no edge update) the last two
    are empty."""
    agg, y_new, h = _refine_buffers(u, num_segments, y, w1, w2)
    edges = y is not None
    _forward_native(u, q, src, tgt, y, res_weight, w1, b1, w2, b2, smooth, chunk, agg,
                    h if edges else None, y_new if edges else None)
    return agg, y_new, h


def _refine_buffers(u, num_segments, y, w1, w2):
    e, c = u.shape
    edges = y is not None
    return (u.new_zeros((num_segments, c)), u.new_empty((e, w2.shape[0]) if edges else (0,)),
            u.new_empty((e, w1.shape[0]) if edges else (0,)))


@refine_edges_op.register_fake
def _(u, q, src, tgt, num_segments, y, res_weight, w1, b1, w2, b2, smooth, chunk):
    return _refine_buffers(u, num_segments, y, w1, w2)


@torch.library.custom_op("matris::refine_edges_backward", mutates_args=(), device_types="cpu")
def refine_edges_backward_op(g_agg: torch.Tensor, g_ynew: torch.Tensor | None, u: torch.Tensor, q: torch.Tensor,
                             src: torch.Tensor, tgt: torch.Tensor, w1: torch.Tensor | None, w2: torch.Tensor | None,
                             h: torch.Tensor, res_weight: torch.Tensor | None, smooth: bool, chunk: int,
                             want_u: bool, want_q: bool, want_y: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                 torch.Tensor]:
    """``(∂L/∂u, ∂L/∂q, ∂L/∂y)``, each an empty tensor where it is not wanted (or, for y, where
    ``g_ynew`` is None: y' reaches no output)."""
    g_u, g_q = _refine_grad_buffers(u, q, want_u, want_q)
    g_y = _backward_native(u, q, src, tgt, w1, w2, h, smooth, chunk, g_agg.contiguous(),
                           g_ynew.contiguous() if g_ynew is not None else None, g_u if want_u else None,
                           g_q if want_q else None, res_weight if want_y else None)
    return g_u, g_q, g_y if g_y is not None else u.new_empty(0)


def _refine_grad_buffers(u, q, want_u, want_q):
    return u.new_empty(u.shape if want_u else (0,)), q.new_zeros(q.shape if want_q else (0,))


@refine_edges_backward_op.register_fake
def _(g_agg, g_ynew, u, q, src, tgt, w1, w2, h, res_weight, smooth, chunk, want_u, want_q, want_y):
    g_u, g_q = _refine_grad_buffers(u, q, want_u, want_q)
    return g_u, g_q, u.new_empty(g_ynew.shape if want_y and g_ynew is not None else (0,))


def _refine_setup(ctx, inputs, output):
    u, q, src, tgt, n, y, res_weight, w1, b1, w2, b2, smooth, chunk = inputs
    ctx.set_materialize_grads(False)  # an output that reaches no loss gets None: its backward is skipped
    ctx.save_for_backward(u, q, src, tgt, y, res_weight, w1, b1, w2, b2, output[2])
    ctx.n, ctx.smooth, ctx.chunk, ctx.edges = n, smooth, chunk, y is not None
    ctx.want = (u.requires_grad, q.requires_grad, y is not None and y.requires_grad)
    ctx.want_weights = any(t is not None and t.requires_grad for t in (res_weight, w1, b1, w2, b2))


def _refine_backward(ctx, g_agg, g_ynew, *_unused):
    u, q, src, tgt, y, res_weight, w1, b1, w2, b2, h = ctx.saved_tensors
    n, smooth = ctx.n, ctx.smooth
    if g_agg is None:
        g_agg = u.new_zeros((n, u.shape[1]))
    if not ctx.edges:
        g_ynew = None
    if not ctx.edges and torch.is_grad_enabled():
        g = recompute_backward(lambda u_, q_: refine_edges_reference(u_, q_, src, tgt, n), (u, q), g_agg)
        return g[0], g[1], *[None] * 11
    if ctx.edges and (torch.is_grad_enabled() or ctx.want_weights):
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
        return g[0], g[1], None, None, None, g[2], g[3], g[4], gb1, g[5], gb2, None, None
    want_u, want_q, want_y = ctx.want
    g_u, g_q, g_y = refine_edges_backward_op(g_agg, g_ynew, u, q, src, tgt, w1, w2, h, res_weight, smooth, ctx.chunk,
                                             want_u, want_q, want_y)
    return (g_u if want_u else None, g_q if want_q else None, None, None, None,
            g_y if want_y and g_ynew is not None else None, None, None, None, None, None, None, None)


refine_edges_op.register_autograd(_refine_backward, setup_context=_refine_setup)


def _forward_native(u, q, src, tgt, y, res_weight, w1, b1, w2, b2, smooth, chunk, agg, h, y_new):
    """The forward's chunk loop with :mod:`.native`: u_g and the scatter in one pass, the FFN's
    bias and SiLU in another, the GEMMs in PyTorch (no FFN where ``y`` is None)."""
    e, c = u.shape
    lib, nt = native.library(), native.threads()
    if _forward_whole(u, q, src, tgt, y, res_weight, w1, b1, w2, b2, smooth, chunk, agg, h, y_new):
        return
    fwd, act_fn = lib("refine_fwd", u.dtype), lib("gather_silu", u.dtype)
    k0 = min(chunk, e)
    ug = torch.empty(k0, c, dtype=u.dtype)
    act = torch.empty(k0, w1.shape[0], dtype=u.dtype) if y is not None else None
    b1 = b1.contiguous() if b1 is not None else None
    by_w1, by_w2 = (native.Matmul(w1.T), native.Matmul(w2.T)) if y is not None else (None, None)
    for s in range(0, e, chunk):
        k = min(chunk, e - s)
        fwd(u[s : s + chunk].data_ptr(), q.data_ptr(), src[s : s + chunk].data_ptr(), tgt[s : s + chunk].data_ptr(),
            k, c, ug.data_ptr(), agg.data_ptr(), nt)
        if y is None:
            continue
        hs = h[s : s + chunk]
        by_w1(ug[:k] if smooth else u[s : s + chunk], out=hs)
        act_fn(hs.data_ptr(), act.data_ptr(), k, hs.shape[1], native.ptr(b1), 0, 0, None, None, 1, nt)
        yn = by_w2(act[:k], out=y_new[s : s + chunk])
        if b2 is not None:
            yn.add_(b2)
        yn.addcmul_(y[s : s + chunk], res_weight)


def _backward_native(u, q, src, tgt, w1, w2, h, smooth, chunk, g_agg, g_ynew, g_u, g_q, res_weight=None):
    """The backward's chunk loop with :mod:`.native` (the formulas of the module docstring): the
    rows in one pass, then the two terms of ∂L/∂q scattered by source and by target (``h`` holds
    silu'(h)).
    ``g_ynew`` None: no FFN backward (G_in = 0). Returns G_y = w ⊙ G_y' where ``res_weight`` is
    given (else None)."""
    e, c = u.shape
    lib, nt = native.library(), native.threads()
    g_y = None
    if res_weight is not None and g_ynew is not None:
        g_y = torch.empty_like(g_ynew)
    if _backward_whole(u, q, src, tgt, w1, w2, h, smooth, chunk, g_agg, g_ynew, g_u, g_q, g_y, res_weight):
        return g_y
    if g_y is not None:
        torch.mul(g_ynew, res_weight, out=g_y)
    bwd, scatter = lib("refine_bwd", u.dtype), lib("scatter_add", u.dtype)
    k0 = min(chunk, e)
    ffn = g_ynew is not None
    gh = torch.empty(k0, w1.shape[0], dtype=u.dtype) if ffn else None
    g_in = torch.empty(k0, c, dtype=u.dtype) if ffn else None
    p_s, p_t = (torch.empty(k0, c, dtype=u.dtype) for _ in range(2)) if g_q is not None else (None, None)
    targets = native.ptr_array([g_q]) if g_q is not None else None
    by_w1, by_w2 = (native.Matmul(w1), native.Matmul(w2)) if ffn else (None, None)
    for s in range(0, e, chunk):
        k = min(chunk, e - s)
        if ffn:
            by_w2(g_ynew[s : s + chunk], out=gh[:k])
            gh[:k].mul_(h[s : s + chunk])
            by_w1(gh[:k], out=g_in[:k])
        bwd(g_agg.data_ptr(), native.ptr(g_in), u[s : s + chunk].data_ptr(), q.data_ptr(),
            src[s : s + chunk].data_ptr(), tgt[s : s + chunk].data_ptr(), k, c, int(smooth),
            g_u[s : s + chunk].data_ptr() if g_u is not None else None, native.ptr(p_s), native.ptr(p_t), nt)
        if g_q is not None:
            scatter(p_s.data_ptr(), k, c, 1, targets, native.ptr_array([src[s : s + chunk]]), nt)
            scatter(p_t.data_ptr(), k, c, 1, targets, native.ptr_array([tgt[s : s + chunk]]), nt)
    return g_y


def _forward_whole(u, q, src, tgt, y, res_weight, w1, b1, w2, b2, smooth, chunk, agg, h, y_new) -> bool:
    """The forward in one call of the library's ``refine_fwd_whole`` (float32 with the native GEMM:
    each step on blocks of rows in cache, the same operations per row as the chunk loop); False,
    with nothing written, where it does not apply."""
    if u.dtype != torch.float32 or not native.whole_calls():
        return False
    by_w1, by_w2 = (native.Matmul(w1.T), native.Matmul(w2.T)) if y is not None else (None, None)
    if y is not None and (by_w1.lib is None or by_w2.lib is None or not y.is_contiguous() or y.dtype != u.dtype
                          or res_weight.numel() != u.shape[1] or res_weight.dtype != u.dtype):
        return False
    e, c = u.shape
    rw = res_weight.contiguous() if y is not None else None
    b1 = b1.contiguous() if b1 is not None else None
    b2 = b2.contiguous() if b2 is not None else None
    native.library().refine_fwd_whole(
        u.data_ptr(), q.data_ptr(), src.data_ptr(), tgt.data_ptr(), e, c, native.ptr(y), native.ptr(rw),
        by_w1.packed.data_ptr() if by_w1 else None, native.ptr(b1), by_w2.packed.data_ptr() if by_w2 else None,
        native.ptr(b2), w1.shape[0] if y is not None else 0, int(smooth), chunk, agg.data_ptr(), native.ptr(h),
        native.ptr(y_new), native.threads())
    return True


def _backward_whole(u, q, src, tgt, w1, w2, h, smooth, chunk, g_agg, g_ynew, g_u, g_q, g_y=None,
                    res_weight=None) -> bool:
    """The backward in one call of the library's ``refine_bwd_whole`` (float32 with the native
    GEMM, ``h`` holding silu'(h)), with G_y = w ⊙ G_y' into ``g_y`` where given; False, with
    nothing written, where it does not apply."""
    if u.dtype != torch.float32 or not native.whole_calls():
        return False
    ffn = g_ynew is not None
    by_w2, by_w1 = (native.Matmul(w2), native.Matmul(w1)) if ffn else (None, None)
    if ffn and (by_w1.lib is None or by_w2.lib is None):
        return False
    if g_y is not None and (res_weight.numel() != u.shape[1] or res_weight.dtype != u.dtype):
        return False
    rw = res_weight.contiguous() if g_y is not None else None
    e, c = u.shape
    native.library().refine_bwd_whole(
        g_agg.data_ptr(), native.ptr(g_ynew), u.data_ptr(), q.data_ptr(), src.data_ptr(), tgt.data_ptr(), e, c,
        native.ptr(h), by_w2.packed.data_ptr() if ffn else None, by_w1.packed.data_ptr() if ffn else None,
        w1.shape[0] if ffn else 0, int(smooth), native.ptr(g_u), native.ptr(g_q), native.ptr(g_y), native.ptr(rw), chunk,
        native.threads())
    return True
