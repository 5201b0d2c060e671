"""Fused gathers feeding Φ's first Linear: ``act(Σ_k P_k[idx_k] + b)`` in one pass.

With the projection rewrite (``matris.model.layers``), Φ's first layer is a sum of per-node
projections gathered per edge, ``P_y[d2u] + P_t[tgt] + P_s[src] (+ P_c[angle_atom])``, plus
the bias, followed by the activation. The reference builds each gathered term, each partial
sum, the biased sum and the activation as separate edge-sized tensors; the Triton kernel
reads each projection row once through its index and writes only the activated hidden
layer ``[n_edges, H]``.

Backward: a Triton kernel recomputes the pre-activation from the gathers and writes
``∂L/∂pre = G ⊙ act'(pre)`` ``[n_edges, H]``; each projection's gradient is then the
index_add of that over its index (the backward of a gather), and the bias gradient its
column sum. With ``create_graph`` the backward recomputes the PyTorch reference under
autograd, which gives exact second derivatives.
"""

from __future__ import annotations

import torch

from .backend import check_dtype, recompute_backward, register_cpu, tile, triton_available, use_triton
from .epilogue import ACT_CODE, ACTIVATIONS, _activate, activation_slope

Term = tuple[torch.Tensor, "torch.Tensor | None"]
MAX_TERMS = 4


def gather_sum_activate_reference(terms: list[Term], bias: torch.Tensor | None, act: str) -> torch.Tensor:
    """PyTorch reference: ``act(Σ_k P_k[idx_k] + b)``.

    terms: ``(P_k [n_k, H], idx_k [E] int64 or None)``; None means P_k is already ``[E, H]``.
    bias: ``[H]`` or None. Returns ``[E, H]``.
    """
    return _activate(gather_sum(terms, bias), act)


def gather_sum(terms: list[Term], bias: torch.Tensor | None) -> torch.Tensor:
    """The pre-activation ``Σ_k P_k[idx_k] + b`` ``[E, H]`` of :func:`gather_sum_activate_reference`."""
    out, owned = None, False
    for proj, index in terms:
        rows = proj if index is None else proj.index_select(0, index)
        if out is None:
            out, owned = rows, index is not None
        elif owned:  # accumulate in place into a tensor made here (fewer edge-sized allocations)
            out.add_(rows)
        else:
            out, owned = out + rows, True
    if bias is not None:
        out = out.add_(bias) if owned else out + bias
    return out


def gather_sum_activate(terms: list[Term], bias: torch.Tensor | None, act: str,
                        backend: str | None = None) -> torch.Tensor:
    """The fused kernel (Triton) or its reference, chosen as in :mod:`matris.kernels.backend`."""
    if act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; use one of {ACTIVATIONS}")
    if not 1 <= len(terms) <= MAX_TERMS:
        raise ValueError(f"gather_sum_activate takes 1 to {MAX_TERMS} terms, got {len(terms)}")
    first, first_index = terms[0]
    n_rows = first.shape[0] if first_index is None else first_index.shape[0]
    if not use_triton(first.device, backend) or n_rows == 0:
        return gather_sum_activate_reference(terms, bias, act)
    check_dtype(*(p for p, _ in terms))
    # an index of no elements stands for None (the op schema takes a plain list of tensors)
    return gather_sum_activate_op([p for p, _ in terms], [_NO_INDEX if i is None else i for _, i in terms], bias, act,
                                  n_rows)


_NO_INDEX = torch.empty(0, dtype=torch.int64)


def _indices(indices: list[torch.Tensor]) -> list[torch.Tensor | None]:
    return [None if i.numel() == 0 else i for i in indices]


# Custom ops (torch.library) with their autograd formula: single nodes under torch.compile.
@torch.library.custom_op("matris::gather_sum_activate", mutates_args=())
def gather_sum_activate_op(projs: list[torch.Tensor], indices: list[torch.Tensor], bias: torch.Tensor | None,
                           act: str, n_rows: int) -> torch.Tensor:
    """Triton forward of :func:`gather_sum_activate` → ``[n_rows, H]`` (an empty index: rows as they are)."""
    return _launch([p.contiguous() for p in projs], _indices(indices), bias, act, n_rows, None)


@gather_sum_activate_op.register_fake
def _(projs, indices, bias, act, n_rows):
    return projs[0].new_empty((n_rows, projs[0].shape[1]))


@torch.library.custom_op("matris::gather_sum_activate_backward", mutates_args=())
def gather_sum_activate_backward_op(projs: list[torch.Tensor], indices: list[torch.Tensor],
                                    bias: torch.Tensor | None, act: str, n_rows: int,
                                    grad: torch.Tensor) -> torch.Tensor:
    """Triton backward: ``∂L/∂pre = G ⊙ act'(pre)`` ``[n_rows, H]``."""
    return _launch([p.contiguous() for p in projs], _indices(indices), bias, act, n_rows, grad.contiguous())


@gather_sum_activate_backward_op.register_fake
def _(projs, indices, bias, act, n_rows, grad):
    return torch.empty_like(grad)


def _setup_context(ctx, inputs, output):
    projs, indices, bias, act, n_rows = inputs
    ctx.save_for_backward(bias, *projs, *indices)
    ctx.act, ctx.n_terms, ctx.n_rows = act, len(projs), n_rows


def _backward(ctx, grad):
    saved = ctx.saved_tensors
    bias, projs = saved[0], list(saved[1 : 1 + ctx.n_terms])
    raw = list(saved[1 + ctx.n_terms :])
    indices = _indices(raw)
    proj_needs = ctx.needs_input_grad[0]
    proj_needs = list(proj_needs) if isinstance(proj_needs, (list, tuple)) else [proj_needs] * len(projs)
    bias_needs = ctx.needs_input_grad[2]
    if torch.is_grad_enabled():  # create_graph: backward through the reference, exact second order
        tensors = projs + ([bias] if bias is not None else [])

        def ref(*t):
            b = t[len(projs)] if bias is not None else None
            return gather_sum_activate_reference(list(zip(t[: len(projs)], indices)), b, ctx.act)

        grads = recompute_backward(ref, tensors, grad)
        return (list(grads[: len(projs)]), [None] * len(indices), grads[len(projs)] if bias is not None else None,
                None, None)
    d_pre = gather_sum_activate_backward_op(projs, raw, bias, ctx.act, ctx.n_rows, grad)
    g_projs = []
    for need, proj, index in zip(proj_needs, projs, indices):
        if not need:
            g_projs.append(None)
        elif index is None:
            g_projs.append(d_pre)
        else:  # the backward of a gather
            g_projs.append(torch.zeros_like(proj).index_add_(0, index, d_pre))
    g_bias = d_pre.sum(0) if bias is not None and bias_needs else None
    return g_projs, [None] * len(indices), g_bias, None, None


gather_sum_activate_op.register_autograd(_backward, setup_context=_setup_context)


def _forward_cpu(projs, indices, bias, act, n_rows):
    """The CPU kernel of ``matris::gather_sum_activate``: its reference."""
    return gather_sum_activate_reference(list(zip(projs, _indices(indices))), bias, act)


def _backward_cpu(projs, indices, bias, act, n_rows, grad):
    """The CPU kernel of ``matris::gather_sum_activate_backward``: ``G ⊙ act'(pre)``."""
    return grad * activation_slope(gather_sum(list(zip(projs, _indices(indices))), bias), act)


register_cpu(gather_sum_activate_op, _forward_cpu)
register_cpu(gather_sum_activate_backward_op, _backward_cpu)


# ---------------------------------------------------------------------------- Triton
BLOCK_ROWS, BLOCK_COLS = 16, 64  # 8 elements per thread: low register use

if triton_available():
    import triton
    import triton.language as tl

    from .epilogue import _act_and_slope

    @triton.jit
    def _gathered(p_ptr, i_ptr, rows, rmask, cols, mask, H, INDEXED: tl.constexpr):
        if INDEXED:
            src = tl.load(i_ptr + rows, mask=rmask, other=0).to(tl.int64)
        else:
            src = rows.to(tl.int64)
        return tl.load(p_ptr + src[:, None] * H + cols[None, :], mask=mask, other=0.0)

    @triton.jit
    def gather_sum_kernel(p0, i0, p1, i1, p2, i2, p3, i3, bias_ptr, grad_ptr, out_ptr, slope_ptr, n_rows, H,
                          N_TERMS: tl.constexpr, IDX0: tl.constexpr, IDX1: tl.constexpr, IDX2: tl.constexpr,
                          IDX3: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BACKWARD: tl.constexpr,
                          SLOPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
        """Forward: out = act(pre) (and with SLOPE, slope = act'(pre): what the gated Φ's backward
        reads); backward: out = grad ⊙ act'(pre); pre = Σ_k p_k[i_k] + bias."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
        rmask = rows < n_rows
        cmask = cols < H
        mask = rmask[:, None] & cmask[None, :]
        pre = _gathered(p0, i0, rows, rmask, cols, mask, H, IDX0)
        if N_TERMS > 1:
            pre += _gathered(p1, i1, rows, rmask, cols, mask, H, IDX1)
        if N_TERMS > 2:
            pre += _gathered(p2, i2, rows, rmask, cols, mask, H, IDX2)
        if N_TERMS > 3:
            pre += _gathered(p3, i3, rows, rmask, cols, mask, H, IDX3)
        if HAS_BIAS:
            pre += tl.load(bias_ptr + cols, mask=cmask, other=0.0)[None, :]
        a, da = _act_and_slope(pre, ACT)
        offs = rows.to(tl.int64)[:, None] * H + cols[None, :]
        if BACKWARD:
            g = tl.load(grad_ptr + offs, mask=mask, other=0.0)
            tl.store(out_ptr + offs, g * da, mask=mask)
        else:
            tl.store(out_ptr + offs, a, mask=mask)
            if SLOPE:
                tl.store(slope_ptr + offs, da, mask=mask)


def activate_with_slope(terms: list[Term], bias: torch.Tensor | None, act: str, n_rows: int):
    """``(act(pre), act'(pre))``, each ``[n_rows, H]``, with ``pre = Σ_k P_k[idx_k] + b`` (Triton; the
    first layer of :func:`matris.kernels.gated_phi` on CUDA). At most four terms."""
    return _launch([p for p, _ in terms], [i for _, i in terms], bias, act, n_rows, None, slope=True)


def _launch(projs, indices, bias, act, n_rows, grad, slope=False):
    h = projs[0].shape[1]
    ref = projs[0]
    slots = []
    for k in range(MAX_TERMS):
        if k < len(projs):
            slots += [projs[k], indices[k] if indices[k] is not None else ref]
        else:
            slots += [ref, ref]
    out = torch.empty((n_rows, h), dtype=ref.dtype, device=ref.device)
    slopes = torch.empty_like(out) if slope else out
    flags = {f"IDX{k}": k < len(indices) and indices[k] is not None for k in range(MAX_TERMS)}
    block_r, block_h = tile(BLOCK_ROWS, 128), tile(BLOCK_COLS, 128)
    grid = (triton.cdiv(n_rows, block_r), triton.cdiv(h, block_h))
    gather_sum_kernel[grid](*slots, bias if bias is not None else ref, grad if grad is not None else ref, out,
                            slopes, n_rows, h, N_TERMS=len(projs), HAS_BIAS=bias is not None, ACT=ACT_CODE[act],
                            BACKWARD=grad is not None, SLOPE=slope, BLOCK_R=block_r, BLOCK_H=block_h, **flags)
    return (out, slopes) if slope else out
