"""Separable attention's aggregations: per-channel segment softmax and weighted sum, and the
operator ``matris::attention_pair`` that computes both of one attention step.

``out[n, c] = Σ_{e: index[e] = n} softmax_e(logits[:, c])[e] · messages[e, c]``: S or T of spec §5 (reference:
:func:`softmax_aggregate_reference`). The Triton forward kernel walks each segment's edges once (CSR order) with an
online softmax (running max, sum, weighted sum; no weights stored) and writes the log-sum-exp the backward needs:

    p_e = exp(logits_e − lse[n]),   ∂L/∂m_e = p_e·G[n],   ∂L/∂logit_e = p_e·((m_e − out[n])·G[n] + G_lse[n])

``matris::attention_pair``'s CUDA kernel runs it once per direction; its backward is one edge-parallel Triton kernel
for both. ``benchmarks/kernels.py --check`` compiles the kernels; ``tests/test_operators.py`` checks the operator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .backend import LIB, operators_run, recompute_backward, register_triton, tile, triton_available
from .segment import scatter_sum, segment_max, segment_softmax


@dataclass
class Segments:
    """Edges grouped by a node index, with the CSR view the Triton kernels need.

    index ``[E]``: node of each edge; order ``[E]``: edges stably sorted by node; offsets ``[num_segments + 1]``: start
    of each node's edges in ``order``. All int64, as every kernel offset (segment × channel passes 2³¹ on big cells)."""

    index: torch.Tensor
    num_segments: int
    order: torch.Tensor
    offsets: torch.Tensor

    @classmethod
    def from_index(cls, index: torch.Tensor, num_segments: int) -> "Segments":
        """Sort once; offsets by binary search of the sorted index (``bincount`` would sync the host on CUDA)."""
        sorted_index, order = torch.sort(index, stable=True)
        bounds = torch.arange(num_segments + 1, dtype=sorted_index.dtype, device=index.device)
        offsets = torch.searchsorted(sorted_index, bounds)
        return cls(index, num_segments, order, offsets)

    def permuted(self, index: torch.Tensor, shift: int) -> "Segments":
        """Segments of ``index[k] = self.index[(k + shift) mod E]`` without a second sort (same offsets, order shifted
        back): directed edges by source from those by target, as edge ``k + B`` is edge ``k`` reversed."""
        e = self.order.shape[0]
        return Segments(index, self.num_segments, (self.order + (e - shift)) % e if e else self.order, self.offsets)


def softmax_aggregate_reference(logits: torch.Tensor, messages: torch.Tensor, index: torch.Tensor,
                                num_segments: int) -> torch.Tensor:
    """PyTorch reference: ``scatter_sum(segment_softmax(logits) ⊙ messages)`` → ``[num_segments, C]``."""
    return scatter_sum(segment_softmax(logits, index, num_segments) * messages, index, num_segments)


# ---------------------------------------------------------------------------- Triton
if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_aggregate_fwd_kernel(logits_ptr, msg_ptr, order_ptr, offsets_ptr, out_ptr, lse_ptr, C, stride_a,
                                     BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
        """One program per (segment, block of channels): online softmax over the segment's edges.
        ``stride_a``: the logits' row stride (C, or 2C for one half of ``[α_s ‖ α_t]``)."""
        seg = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = cols < C
        start = tl.load(offsets_ptr + seg)
        end = tl.load(offsets_ptr + seg + 1)
        dt = logits_ptr.dtype.element_ty
        run_max = tl.full([BLOCK_C], float("-inf"), dt)
        run_sum = tl.zeros([BLOCK_C], dt)
        acc = tl.zeros([BLOCK_C], dt)
        e0 = start
        while e0 < end:  # a while loop: the interpreter cannot range() over loaded bounds
            eids = e0 + tl.arange(0, BLOCK_E)
            emask = eids < end
            rows = tl.load(order_ptr + eids, mask=emask, other=0).to(tl.int64)
            mask = emask[:, None] & cmask[None, :]
            offs = rows[:, None] * C + cols[None, :]
            a = tl.load(logits_ptr + rows[:, None] * stride_a + cols[None, :], mask=mask, other=float("-inf"))
            m = tl.load(msg_ptr + offs, mask=mask, other=0.0)
            new_max = tl.maximum(run_max, tl.max(a, axis=0))
            safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # masked channels only
            scale = tl.exp(run_max - safe_max)
            p = tl.exp(a - safe_max[None, :])
            run_sum = run_sum * scale + tl.sum(p, axis=0)
            acc = acc * scale + tl.sum(p * m, axis=0)
            run_max = new_max
            e0 += BLOCK_E
        nonempty = run_sum > 0
        denom = tl.where(nonempty, run_sum, 1.0)
        out = tl.where(nonempty, acc / denom, 0.0)
        lse = tl.where(nonempty, run_max + tl.log(denom), 0.0)
        tl.store(out_ptr + seg * C + cols, out, mask=cmask)
        tl.store(lse_ptr + seg * C + cols, lse, mask=cmask)


FWD_BLOCK_E, FWD_BLOCK_C = 16, 32
BWD_BLOCK_E, BWD_BLOCK_C = 32, 32


def _forward_triton(logits, messages, segments):
    """(out, lse) ``[n, C]``; ``logits`` ``[E, C]`` with unit column stride (rows may be strided)."""
    n, c = segments.num_segments, messages.shape[1]
    out = torch.empty((n, c), dtype=messages.dtype, device=messages.device)
    lse = torch.empty_like(out)
    if n == 0:
        return out, lse
    block_e, block_c = tile(FWD_BLOCK_E, 64), tile(FWD_BLOCK_C, 128)
    grid = (n, triton.cdiv(c, block_c))
    softmax_aggregate_fwd_kernel[grid](logits, messages, segments.order, segments.offsets, out, lse, c,
                                       logits.stride(0), BLOCK_E=block_e, BLOCK_C=block_c)
    return out, lse


# ---------------------------------------------------------------------------- CPU, fused loops
def attention_pair_reference(rows: torch.Tensor, weight: torch.Tensor | None, row_index: torch.Tensor | None,
                             messages: torch.Tensor, target: torch.Tensor, source: torch.Tensor,
                             num_segments: int, res_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """PyTorch reference of both aggregations of one separable attention → (T, S) ``[n, C]``.

    Logits ``α = [α_s ‖ α_t]`` ``[E, 2C]`` are ``rows·weightᵀ`` (rows ``[E, d]``, weight ``[2C, d]``) or, with
    ``row_index``, ``rows[row_index]`` (rows already projected, ``[B, 2C]``). T, S: :func:`softmax_aggregate_reference`
    of ``α_t`` by ``target``, of ``α_s`` by ``source``. With ``res_weight`` ``[1, C]`` (line graph: rows are the edge
    features, d = C) also the edges' residual update ``y' = m + res_weight ⊙ rows`` ``[E, C]``: (T, S, y')."""
    alpha = rows @ weight.T if row_index is None else rows.index_select(0, row_index)
    c = messages.shape[1]
    pair = (softmax_aggregate_reference(alpha[:, c:], messages, target, num_segments),
            softmax_aggregate_reference(alpha[:, :c], messages, source, num_segments))
    return pair if res_weight is None else (*pair, torch.addcmul(messages, res_weight, rows))


def segment_logsumexp(logits: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """``log Σ_{index[k] = n} exp(logits[k])`` per channel → ``[num_segments, C]``, 0 without rows (as the kernels)."""
    top = segment_max(logits, index, num_segments)
    total = scatter_sum(torch.exp(logits - top.index_select(0, index)), index, num_segments)
    return torch.where(total > 0, top + torch.log(torch.where(total > 0, total, torch.ones_like(total))),
                       torch.zeros_like(total))


def merge_softmax(parts: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]) -> torch.Tensor:
    """The softmax aggregate of a segment from partial softmaxes over disjoint parts of its rows.

    Each part is ``(N, D, s)`` ``[n, C]``: ``N = Σ exp(α − s)·m``, ``D = Σ exp(α − s)`` over its rows for a shift ``s``
    (None: 0; ``D`` None: 1). Returns ``Σ_k N_k·exp(s_k − S) / Σ_k D_k·exp(s_k − S)``, ``S = max_k s_k``; 0 where no
    part has rows. For line-graph row chunks (one shift, sums added) and domain ranks (a part per bond end:
    ``(T, None, lse)`` of :func:`attention_pair_lse`, ``−inf`` without rows)."""
    shifts = [s for _, _, s in parts if s is not None]
    top = None
    if shifts:
        top = torch.stack(shifts).amax(0).detach()
        top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # no rows in any part
    num = den = 0
    for n, d, s in parts:
        w = torch.ones_like(n) if s is None else torch.exp(s - top)
        num = num + n * w
        den = den + (w if d is None else d * w)
    return num / torch.where(den > 0, den, torch.ones_like(den))


def attention_pair_lse(rows, weight, row_index, messages, target, source, num_segments: int,
                       res_weight: torch.Tensor | None = None, *, fused: bool = True) -> tuple[torch.Tensor, ...]:
    """:func:`attention_pair` plus the segments' differentiable log-sum-exps: ``(T, S, y' or None, lse_t, lse_s)``,
    lse ``[n, C]`` (0 if empty). Parts of a segment on several MPI ranks (:mod:`matris.domain`) combine as
    ``Σ_k T_k·exp(lse_k − L)``, ``L = log Σ_k exp(lse_k)``. The operator (``fused``, a kernel here), else reference."""
    if fused and messages.shape[0] and operators_run(messages, target, source, row_index, rows, weight, res_weight):
        out_t, out_s, y_new, _, lse_s, lse_t = torch.ops.matris.attention_pair(
            rows, weight, row_index, messages, target, source, num_segments, res_weight, [])
        return out_t, out_s, (y_new if res_weight is not None else None), lse_t, lse_s
    ref = attention_pair_reference(rows, weight, row_index, messages, target, source, num_segments, res_weight)
    alpha = rows @ weight.T if row_index is None else rows.index_select(0, row_index)
    c = messages.shape[1]
    lse_t = segment_logsumexp(alpha[:, c:], target, num_segments)
    lse_s = segment_logsumexp(alpha[:, :c], source, num_segments)
    return ref[0], ref[1], (ref[2] if res_weight is not None else None), lse_t, lse_s


def attention_pair(rows, weight, row_index, messages, target, source, num_segments: int,
                   res_weight: torch.Tensor | None = None, segments: "tuple[Segments, Segments] | None" = None, *,
                   fused: bool = True) -> tuple[torch.Tensor, ...]:
    """:func:`attention_pair_reference` as the operator ``matris::attention_pair`` (C++ kernel: csrc/cpu/attention.cpp).

    One online pass over the edges (running maxima and sums per segment and channel; line-graph logits by a GEMM per
    block of rows). The backward recomputes ``p = exp(α − lse)`` per row (module docstring), builds no edge-sized tensor
    beyond the gradients it returns and gives the line graph's ``∂L/∂W = (∂L/∂α)ᵀ·rows``, ``∂L/∂w = Σ G_y' ⊙ rows``;
    with ``create_graph``, the reference under autograd. ``res_weight`` (line graph only): also y'. ``segments`` (by
    target, by source): the CSR order the CUDA kernel walks, made once per graph (else it sorts). The reference where
    the operator cannot run (e.g. no compiler) or ``fused`` is False."""
    n_edges = messages.shape[0]
    if res_weight is not None and row_index is not None:
        raise ValueError("attention_pair: res_weight is for the line-graph form (row_index None)")
    if not fused or n_edges == 0 or not operators_run(messages, target, source, row_index, rows, weight, res_weight):
        # not asked for, or no kernel here (no compiler, not float32/float64 tensors): the reference
        return attention_pair_reference(rows, weight, row_index, messages, target, source, num_segments, res_weight)
    csr = [t for seg in segments for t in (seg.order, seg.offsets)] if segments is not None else []
    out_t, out_s, y_new = torch.ops.matris.attention_pair(rows, weight, row_index, messages, target, source,
                                                          num_segments, res_weight, csr)[:3]
    return (out_t, out_s) if res_weight is None else (out_t, out_s, y_new)


# ---------------------------------------------------------------------------- registered operators
# matris::attention_pair (T, S, y' and what the backward reads), matris::attention_pair_backward: C++ CPU kernels
# (csrc/cpu/attention.cpp), Triton CUDA kernels (below); autograd: the backward operator, or with create_graph the
# reference. ``csr``: [target order, target offsets, source order, source offsets] (:class:`Segments`; empty on CPU).
# Outputs: (T, S, y' [E, C] or empty, α [E, 2C] or empty (atom graph: rows[row_index]), lse_s, lse_t); T, S, lse [n, C].
LIB.define("attention_pair(Tensor rows, Tensor? weight, Tensor? row_index, Tensor messages, Tensor target, "
           "Tensor source, SymInt num_segments, Tensor? res_weight, Tensor[] csr) -> "
           "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
LIB.define("attention_pair_backward(Tensor g_t, Tensor g_s, Tensor? g_y, Tensor rows, Tensor? weight, "
           "Tensor? row_index, Tensor messages, Tensor target, Tensor source, Tensor alpha, Tensor out_s, "
           "Tensor out_t, Tensor lse_s, Tensor lse_t, Tensor? res_weight, bool want_rows, bool want_messages, "
           "bool want_weights) -> (Tensor, Tensor, Tensor)")


def _attention_fake(rows, weight, row_index, messages, target, source, num_segments, res_weight, csr):
    e, c = messages.shape
    per_node = [messages.new_empty((num_segments, c)) for _ in range(4)]
    return (per_node[0], per_node[1], messages.new_empty((e, c) if res_weight is not None else (0,)),
            messages.new_empty((e, 2 * c) if row_index is None else (0,)), per_node[2], per_node[3])


def _attention_backward_fake(g_t, g_s, g_y, rows, weight, row_index, messages, target, source, alpha, out_s, out_t,
                             lse_s, lse_t, res_weight, want_rows, want_messages, want_weights):
    e, c = messages.shape
    return (rows.new_empty(rows.shape if want_rows else (0,)),
            messages.new_empty(messages.shape if want_messages else (0,)),
            messages.new_empty((e, 2 * c) if want_weights and row_index is None else (0,)))


def _attention_setup(ctx, inputs, output):
    rows, weight, row_index, m, target, source, n, res_weight, csr = inputs
    out_t, out_s, _, alpha, lse_s, lse_t = output
    ctx.set_materialize_grads(False)  # an output that reaches no loss gets None (its terms are skipped)
    ctx.save_for_backward(rows, weight, row_index, m, target, source, alpha, out_s, out_t, lse_s, lse_t, res_weight)
    ctx.n, ctx.res, ctx.no_csr = n, res_weight is not None, [None] * len(csr)
    ctx.want_rows, ctx.want_messages = rows.requires_grad, m.requires_grad
    ctx.want_weights = (weight is not None and weight.requires_grad and row_index is None) or (
        res_weight is not None and res_weight.requires_grad)


def _attention_backward(ctx, g_t, g_s, g_y, _g_alpha=None, g_lse_s=None, g_lse_t=None):
    rows, weight, row_index, m, target, source, alpha, out_s, out_t, lse_s, lse_t, res_weight = ctx.saved_tensors
    g_t = torch.zeros_like(out_t) if g_t is None else g_t
    g_s = torch.zeros_like(out_s) if g_s is None else g_s
    g_y = g_y if ctx.res and g_y is not None else None  # None: y' reaches no output
    with_lse = g_lse_s is not None or g_lse_t is not None  # attention_pair_lse: the log-sum-exps are used
    g_lse = [torch.zeros_like(lse_t) if g_lse_t is None else g_lse_t,
             torch.zeros_like(lse_s) if g_lse_s is None else g_lse_s] if with_lse else []
    if torch.is_grad_enabled():  # create_graph: the reference under autograd (exact second order)
        def ref_all(r, w, msg, *rw):
            if not with_lse:
                return attention_pair_reference(r, w, row_index, msg, target, source, ctx.n, *rw)
            t, s_, y, lt, ls = attention_pair_lse(r, w, row_index, msg, target, source, ctx.n, *rw, fused=False)
            return (t, s_, *((y,) if ctx.res else ()), lt, ls)

        w = weight if weight is not None else rows.new_zeros(0)
        if ctx.res:
            g = recompute_backward(ref_all, (rows, w, m, res_weight),
                                   (g_t, g_s, g_y if g_y is not None else torch.zeros_like(m), *g_lse))
            return g[0], (g[1] if weight is not None else None), None, g[2], None, None, None, g[3], ctx.no_csr
        g = recompute_backward(ref_all, (rows, w, m), (g_t, g_s, *g_lse))
        return g[0], (g[1] if weight is not None else None), None, g[2], None, None, None, None, ctx.no_csr
    # weight gradients (first order, no graph): the projection's from ∂L/∂α, the residual's from G_y'
    want_w = ctx.want_weights
    g_rows, g_m, g_alpha = torch.ops.matris.attention_pair_backward(
        g_t, g_s, g_y, rows, weight, row_index, m, target, source, alpha, out_s, out_t, lse_s, lse_t, res_weight,
        ctx.want_rows, ctx.want_messages, want_w)
    if with_lse and (ctx.want_rows or want_w):
        # ∂lse/∂α = p = exp(α − lse): one more term of ∂L/∂α, to the rows (and weight) as the kernel's own
        c = m.shape[1]
        logits = alpha if row_index is None else rows.index_select(0, row_index)
        p_s = torch.exp(logits[:, :c] - lse_s.index_select(0, source))
        p_t = torch.exp(logits[:, c:] - lse_t.index_select(0, target))
        g_lse_alpha = torch.cat([p_s * g_lse[1].index_select(0, source), p_t * g_lse[0].index_select(0, target)],
                                dim=1)
        if ctx.want_rows:
            g_rows = g_rows + (g_lse_alpha @ weight if row_index is None else
                               rows.new_zeros(rows.shape).index_add_(0, row_index, g_lse_alpha))
        if want_w and row_index is None:
            g_alpha = g_alpha + g_lse_alpha
    g_w = g_rw = None
    if want_w:
        if weight is not None and weight.requires_grad and row_index is None:
            g_w = g_alpha.T @ rows
        if ctx.res and res_weight.requires_grad and g_y is not None:
            g_rw = (g_y * rows).sum(0).view(res_weight.shape)
    return (g_rows if ctx.want_rows else None, g_w, None, g_m if ctx.want_messages else None, None, None, None, g_rw,
            ctx.no_csr)


torch.library.register_fake("matris::attention_pair")(_attention_fake)
torch.library.register_fake("matris::attention_pair_backward")(_attention_backward_fake)
torch.library.register_autograd("matris::attention_pair", _attention_backward, setup_context=_attention_setup)


# ---------------------------------------------------------------------------- CUDA (Triton)
def _attention_triton(rows, weight, row_index, messages, target, source, num_segments, res_weight, csr):
    """CUDA kernel of ``matris::attention_pair``: a GEMM for α, the online softmax per direction on its half of α."""
    e, c = messages.shape
    messages = messages.contiguous()
    if csr:
        t_seg = Segments(target, num_segments, csr[0], csr[1])
        s_seg = Segments(source, num_segments, csr[2], csr[3])
    else:
        t_seg, s_seg = Segments.from_index(target, num_segments), Segments.from_index(source, num_segments)
    if row_index is None:
        alpha = rows @ weight.T  # [E, 2C], kept for the backward
        logits = alpha
    else:  # the atom graph: α per bond, read per directed edge (not kept: the backward gathers again)
        logits = rows.index_select(0, row_index)
        alpha = messages.new_empty((0,))
    out_t, lse_t = _forward_triton(logits[:, c:], messages, t_seg)
    out_s, lse_s = _forward_triton(logits[:, :c], messages, s_seg)
    y_new = torch.addcmul(messages, res_weight, rows) if res_weight is not None else messages.new_empty((0,))
    return out_t, out_s, y_new, alpha, lse_s, lse_t


def _attention_backward_triton(g_t, g_s, g_y, rows, weight, row_index, messages, target, source, alpha, out_s, out_t,
                               lse_s, lse_t, res_weight, want_rows, want_messages, want_weights):
    """The CUDA kernel of ``matris::attention_pair_backward``: one edge-parallel Triton kernel for
    ∂L/∂α (both halves) and ∂L/∂m, then a GEMM (line graph) or an index_add (atom graph) for ∂L/∂rows."""
    e, c = messages.shape
    logits = alpha if row_index is None else rows.index_select(0, row_index)
    g_alpha = messages.new_empty((e, 2 * c))
    g_m = messages.new_empty((e, c))
    if e:
        block_e, block_c = tile(BWD_BLOCK_E, 256), tile(BWD_BLOCK_C, 128)
        grid = (triton.cdiv(e, block_e), triton.cdiv(c, block_c))
        has_gy = g_y is not None
        attention_pair_bwd_kernel[grid](logits, messages.contiguous(), target, source, out_t, out_s, lse_t, lse_s,
                                        g_t.contiguous(), g_s.contiguous(),
                                        g_y.contiguous() if has_gy else messages, g_alpha, g_m, e, c,
                                        logits.stride(0), HAS_GY=has_gy, BLOCK_E=block_e, BLOCK_C=block_c)
    g_rows = messages.new_empty((0,))
    if want_rows:
        if row_index is None:
            g_rows = g_alpha @ weight
            if res_weight is not None and g_y is not None:
                g_rows.addcmul_(res_weight, g_y)
        else:
            g_rows = rows.new_zeros(rows.shape).index_add_(0, row_index, g_alpha)
    keep = want_weights and row_index is None  # ∂L/∂α per row: the projection's weight gradient
    return (g_rows, g_m if want_messages else messages.new_empty((0,)), g_alpha if keep else messages.new_empty((0,)))


if triton_available():
    @triton.jit
    def attention_pair_bwd_kernel(logits_ptr, msg_ptr, tgt_ptr, src_ptr, out_t_ptr, out_s_ptr, lse_t_ptr,
                                  lse_s_ptr, gt_ptr, gs_ptr, gy_ptr, galpha_ptr, gm_ptr, E, C, stride_a,
                                  HAS_GY: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
        """Both aggregations' backward per edge: p from the saved log-sum-exp, no reductions.
        ∂L/∂α_s and ∂L/∂α_t into the two halves of ``galpha`` [E, 2C]; ∂L/∂m = p_t·G_t + p_s·G_s (+ G_y')."""
        eids = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
        cols = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
        emask = eids < E
        mask = emask[:, None] & (cols < C)[None, :]
        t = tl.load(tgt_ptr + eids, mask=emask, other=0).to(tl.int64)
        s = tl.load(src_ptr + eids, mask=emask, other=0).to(tl.int64)
        eoffs = eids[:, None] * C + cols[None, :]
        aoffs = eids[:, None] * stride_a + cols[None, :]
        toffs = t[:, None] * C + cols[None, :]
        soffs = s[:, None] * C + cols[None, :]
        m = tl.load(msg_ptr + eoffs, mask=mask, other=0.0)
        a_s = tl.load(logits_ptr + aoffs, mask=mask, other=0.0)
        a_t = tl.load(logits_ptr + aoffs + C, mask=mask, other=0.0)
        p_t = tl.exp(a_t - tl.load(lse_t_ptr + toffs, mask=mask, other=0.0))
        p_s = tl.exp(a_s - tl.load(lse_s_ptr + soffs, mask=mask, other=0.0))
        g_t = tl.load(gt_ptr + toffs, mask=mask, other=0.0)
        g_s = tl.load(gs_ptr + soffs, mask=mask, other=0.0)
        gm = p_t * g_t + p_s * g_s
        if HAS_GY:
            gm += tl.load(gy_ptr + eoffs, mask=mask, other=0.0)
        tl.store(gm_ptr + eoffs, gm, mask=mask)
        goffs = eids[:, None] * (2 * C) + cols[None, :]
        tl.store(galpha_ptr + goffs, p_s * (m - tl.load(out_s_ptr + soffs, mask=mask, other=0.0)) * g_s, mask=mask)
        tl.store(galpha_ptr + goffs + C, p_t * (m - tl.load(out_t_ptr + toffs, mask=mask, other=0.0)) * g_t,
                 mask=mask)


register_triton("attention_pair", _attention_triton)
register_triton("attention_pair_backward", _attention_backward_triton)
