"""Φ's first layer on gathered projections: ``act(Σ_k P_k[idx_k] + b)``.

With the projection rewrite (``matris.model.attention``) that layer sums per-node projections gathered per edge and the
bias, ``P_y[d2u] + P_t[tgt] + P_s[src] (+ P_c[angle_atom]) + b``, then activates; :func:`gather_sum_activate_reference`
is its PyTorch form for every activation (where Φ is not :func:`matris.kernels.gated_phi`). The SiLU Triton kernel
serves the CUDA kernels of ``matris::gated_phi`` and ``matris::refine_edges``: it reads each projection row once through
its index and writes ``silu(pre)`` and ``silu'(pre)`` (their backward's factor), each ``[n_rows, H]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import tile, triton_available

Term = tuple[torch.Tensor, "torch.Tensor | None"]
MAX_TERMS = 4
# the functional forms of matris.model.layers.activation's modules (GELU exact erf; softplus beta 1)
FUNCTIONS = {"silu": F.silu, "relu": F.relu, "gelu": F.gelu, "softplus": F.softplus, "sigmoid": torch.sigmoid,
             "tanh": torch.tanh}
ACTIVATIONS = tuple(FUNCTIONS)


def activate(z: torch.Tensor, act: str) -> torch.Tensor:
    if act not in FUNCTIONS:
        raise ValueError(f"unknown activation {act!r}; use one of {ACTIVATIONS}")
    return FUNCTIONS[act](z)


def gather_sum_activate_reference(terms: list[Term], bias: torch.Tensor | None, act: str) -> torch.Tensor:
    """PyTorch reference: ``act(Σ_k P_k[idx_k] + b)`` → ``[E, H]``.

    terms: ``(P_k [n_k, H], idx_k [E] int64 or None)`` (None: P_k is already ``[E, H]``); bias: ``[H]`` or None."""
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
    return activate(out, act)


# ---------------------------------------------------------------------------- Triton
BLOCK_ROWS, BLOCK_COLS = 16, 64  # 8 elements per thread: low register use

if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _gathered(p_ptr, i_ptr, rows, rmask, cols, mask, H, INDEXED: tl.constexpr):
        if INDEXED:
            src = tl.load(i_ptr + rows, mask=rmask, other=0).to(tl.int64)
        else:
            src = rows.to(tl.int64)
        return tl.load(p_ptr + src[:, None] * H + cols[None, :], mask=mask, other=0.0)

    @triton.jit
    def gather_sum_kernel(p0, i0, p1, i1, p2, i2, p3, i3, bias_ptr, out_ptr, slope_ptr, n_rows, H,
                          N_TERMS: tl.constexpr, IDX0: tl.constexpr, IDX1: tl.constexpr, IDX2: tl.constexpr,
                          IDX3: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
        """out = silu(pre) and slope = silu'(pre), pre = Σ_k p_k[i_k] + bias."""
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
        s = tl.sigmoid(pre)
        a = pre * s
        offs = rows.to(tl.int64)[:, None] * H + cols[None, :]
        tl.store(out_ptr + offs, a, mask=mask)
        tl.store(slope_ptr + offs, s + a * (1.0 - s), mask=mask)


def activate_with_slope(terms: list[Term], bias: torch.Tensor | None, act: str, n_rows: int):
    """``(silu(pre), silu'(pre))``, each ``[n_rows, H]``, ``pre = Σ_k P_k[idx_k] + b`` (Triton kernel, ≤ 4 terms)."""
    if act != "silu":
        raise ValueError(f"activate_with_slope computes SiLU only, got {act!r}")
    projs, indices = [p for p, _ in terms], [i for _, i in terms]
    h = projs[0].shape[1]
    ref = projs[0]
    slots = []
    for k in range(MAX_TERMS):
        if k < len(projs):
            slots += [projs[k], indices[k] if indices[k] is not None else ref]
        else:
            slots += [ref, ref]
    out = torch.empty((n_rows, h), dtype=ref.dtype, device=ref.device)
    slopes = torch.empty_like(out)
    flags = {f"IDX{k}": k < len(indices) and indices[k] is not None for k in range(MAX_TERMS)}
    block_r, block_h = tile(BLOCK_ROWS, 128), tile(BLOCK_COLS, 128)
    grid = (triton.cdiv(n_rows, block_r), triton.cdiv(h, block_h))
    gather_sum_kernel[grid](*slots, bias if bias is not None else ref, out, slopes, n_rows, h, N_TERMS=len(projs),
                            HAS_BIAS=bias is not None, BLOCK_R=block_r, BLOCK_H=block_h, **flags)
    return out, slopes
