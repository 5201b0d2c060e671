"""Inference's lowest memory levels: the angles streamed through the blocks by chunks.

The angles dominate memory: diamond Si at the published three-body cutoff has ~450 angles per
atom and ~20 per bond, and one angle state ``a`` ``[A, d_t]`` is 512 B per angle in float32.
Here the blocks run as one autograd node (:func:`streamed`) that keeps, per angle, only

- the angle state at the input of some blocks (``kept``: every block at level 2, every
  ``every``-th at the lowest level; block 0's is the embedding of θ, recomputed from it),
- and during the backward pass one gradient buffer ``∂E/∂a`` and, between kept states, one
  buffer that the states in between are recomputed into,

and, per bond and block, what the angles' passes cannot give back chunk by chunk: the block's
inputs ``h``, ``e``, the line attention's aggregates ``t_agg``, ``s_agg`` and Refine's sums ``R``
(which sum over all angles), and the softmax's shift (each bond's largest logit, stored in bfloat16:
any constant per bond cancels in the softmax, so forward and backward only have to use the same
one). Everything else per angle lives for one chunk of rows at a time.

An angle's state after a block depends only on its state before it and on bond and atom
features (``a' = Φ(a, e[t], e[s]) + w ⊙ a``, then Refine's), so a chunk of angles can be pushed
through several blocks given the bonds' and atoms' features; only the bonds' sums need all
angles. Each block's backward makes two passes over the chunks of angles:

1. the line attention's angle update recomputed without a graph (its softmax denominators
   ``D`` with it), and Refine's per-angle work differentiated: ``∂E/∂a_mid`` replaces
   ``∂E/∂a_{k+1}`` in the gradient buffer, chunk by chunk, and the bonds' projections collect
   their gradients;
2. after the bonds' and atoms' part of the block is differentiated (its atom-graph Φ by row
   chunks, :mod:`matris.model.recompute`), the line attention's per-angle work differentiated:
   ``∂E/∂a_k`` replaces ``∂E/∂a_mid``.

The angles' forward work runs three times (the forward pass and each backward pass) and its
backward once, against once and once keeping everything; between kept states, the states in
between are recomputed from the last kept one (block by block, in place).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..kernels import merge_softmax, references
from .attention import _AttentionRows
from .block import BlockGraph, _masked
from .recompute import RowRecompute, _detached, _grads
from .refine import _RefineRows


@dataclass(eq=False)
class Plan:
    """What :func:`streamed` runs: the model's ``blocks`` and angle ``embedding`` on ``graph``,
    keeping the angle state at the input of the blocks in ``kept`` (block 0's is recomputed from
    the embedding), by ``chunk`` angles; ``rows``: the atom graph's Φ recomputed by row chunks
    inside the backward's recomputations; ``reference``: the operators' references (else their
    kernels); ``params``: the parameters that want gradients (none at inference)."""

    blocks: nn.ModuleList
    embedding: nn.Module
    graph: BlockGraph
    kept: frozenset
    chunk: int
    rows: RowRecompute | None
    reference: bool
    params: list = field(default_factory=list)

    def __post_init__(self):
        g = self.graph
        self.last = len(self.blocks) - 1
        self.n_bonds = g.rbf_3b.shape[0]
        self.n_angles = g.angle_atom.shape[0]
        self.width = self.embedding.swish_layer.linear.weight.shape[0]
        self.slices = [slice(lo, min(lo + self.chunk, self.n_angles)) for lo in range(0, self.n_angles, self.chunk)]

    # the bonds' and atoms' parts of block k, in the order the block runs them
    def head(self, k, e):
        """The line attention's projections of the bonds: ``(p_t, p_s)`` ``[B, 2·d_hidden]``."""
        g = self.graph
        return self.blocks[k].attn_block_line_graph.line_projections(e, g.angle_target_bond, g.angle_source_bond,
                                                                     self.width)

    def middle(self, k, h, e, t_agg, s_agg, rows=None):
        """The bonds' update by the line attention's aggregates, then the atom-graph attention: ``(h, e)``."""
        b, g = self.blocks[k], self.graph
        e = _masked(g.line_mask, b.attn_block_line_graph.node_update(e, t_agg, s_agg), e)
        return b.attn_block_atom_graph(h, e, g.edge_target, g.edge_source, d2u=g.edge_bond, rows=rows,
                                       segments=g.atom_segments)

    def refine_terms(self, k, h, e, rbf_3b):
        """Refine's projections of the atoms and bonds and its envelope: ``(p_h, p_t, p_s, q)``."""
        g = self.graph
        return self.blocks[k].refine_block_line_graph.line_projections(
            e, g.angle_target_bond, g.angle_source_bond, h, g.angle_atom, rbf_3b, self.width)

    def tail(self, k, h, e, r, rbf_pair, rows=None):
        """The bonds' update by Refine's sums ``r``, then the atom-graph Refine: ``(h, e)``."""
        b, g = self.blocks[k], self.graph
        e = _masked(g.line_mask, b.refine_block_line_graph.node_update(e, r), e)
        return b.refine_block_atom_graph(h, e, g.edge_target, g.edge_source, rbf_pair, d2u=g.edge_bond, rows=rows,
                                         update_edges=k != self.last)

    # the angles' parts, on the chunk of angles c
    def attention_rows(self, k, y, p_att, shift, c, sums=True):
        """``(N_t, D_t, N_s, D_s, a_mid)`` of the chunk (``sums`` False: ``(a_mid,)``)."""
        g = self.graph
        return _AttentionRows(self.blocks[k].attn_block_line_graph)(
            y, *p_att, g.angle_target_bond[c], g.angle_source_bond[c], *shift, self.n_bonds,
            reference=self.reference, sums=sums)

    def refine_rows(self, k, y, p_ref, c):
        """``(R, a_next)`` of the chunk (the last block: ``(R,)``)."""
        g = self.graph
        return _RefineRows(self.blocks[k].refine_block_line_graph)(
            y, *p_ref, g.angle_target_bond[c], g.angle_source_bond[c], g.angle_atom[c], self.n_bonds,
            reference=self.reference, update_edges=k != self.last)

    def embed(self, theta, rho, c):
        return self.embedding(theta[c], rho[c])


@dataclass
class _Cached:
    """Per bond (and atom) of one block: its inputs, its line steps' sums and the softmax shift."""

    h: torch.Tensor
    e: torch.Tensor
    t_agg: torch.Tensor
    s_agg: torch.Tensor
    r: torch.Tensor
    shift: list  # bfloat16

    def shifts(self, dtype):
        return [s.to(dtype) for s in self.shift]


def streamed(plan: Plan, h, e, theta, rho, rbf_pair, rbf_3b) -> tuple[torch.Tensor, ...]:
    """The atoms' features after each block ``(h_1 … h_K)`` ``[N, d_n]`` from the embeddings ``h``
    ``[N, d_n]``, ``e`` ``[B, d_e]``, the angles ``theta``, ``rho`` ``[A]`` and the bases ``rbf_pair``,
    ``rbf_3b`` ``[B, K]``, as one autograd node (see the module docstring)."""
    return _Stream.apply(plan, h, e, theta, rho, rbf_pair, rbf_3b, *plan.params)


def _forward(plan: Plan, h, e, theta, rho, rbf_pair, rbf_3b):
    g = plan.graph
    cur = theta.new_empty(plan.n_angles, plan.width)
    for c in plan.slices:
        cur[c] = plan.embed(theta, rho, c)
    kept, cache, hs = {}, [], []
    for k, block in enumerate(plan.blocks):
        att = block.attn_block_line_graph
        if k in plan.kept:
            kept[k] = cur
        p_att = plan.head(k, e)
        # rounded as stored, so that the backward passes use the very same shift
        shift = [s.to(torch.bfloat16) for s in att.bond_shift(cur, g.angle_target_bond, g.angle_source_bond,
                                                               plan.n_bonds, plan.chunk)]
        cached = _Cached(h, e, None, None, None, shift)
        up = cached.shifts(cur.dtype)
        mid = torch.empty_like(cur) if k in plan.kept else cur  # a kept state stays; else in place
        sums = [0] * 4
        for c in plan.slices:
            *parts, mid[c] = plan.attention_rows(k, cur[c], p_att, up, c)
            sums = [s + p for s, p in zip(sums, parts)]
        cached.t_agg = merge_softmax([(sums[0], sums[1], None)])
        cached.s_agg = merge_softmax([(sums[2], sums[3], None)])
        h1, e2 = plan.middle(k, h, e, cached.t_agg, cached.s_agg)
        p_ref = plan.refine_terms(k, h1, e2, rbf_3b)
        r = 0
        for c in plan.slices:
            out = plan.refine_rows(k, mid[c], p_ref, c)
            r = r + out[0]
            if k != plan.last:
                mid[c] = out[1]
        cached.r = r
        cache.append(cached)
        h, e = plan.tail(k, h1, e2, r, rbf_pair)
        hs.append(h)
        cur = mid
    return hs, kept, cache


class _Stream(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: Plan, h, e, theta, rho, rbf_pair, rbf_3b, *params):
        with references(plan.reference):
            hs, kept, cache = _forward(plan, h, e, theta, rho, rbf_pair, rbf_3b)
        ctx.set_materialize_grads(False)
        ctx.plan, ctx.kept, ctx.cache = plan, kept, cache
        ctx.save_for_backward(h, e, theta, rho, rbf_pair, rbf_3b)
        return tuple(hs)

    @staticmethod
    def backward(ctx, *grad_hs):
        plan = ctx.plan
        with references(plan.reference), torch.no_grad():
            grads = _Backward(plan, ctx.saved_tensors, ctx.kept, ctx.cache).run(grad_hs)
        ctx.kept = ctx.cache = None
        return (None, *grads)


class _Backward:
    """The backward pass of :func:`streamed`, block by block from the last (module docstring)."""

    def __init__(self, plan: Plan, inputs, kept: dict, cache: list):
        self.plan, self.kept, self.cache = plan, kept, cache
        self.h0, self.e0, self.theta, self.rho, self.rbf_pair, self.rbf_3b = inputs
        self.params = list(plan.params)
        self.g_params = [None] * len(self.params)
        self.g_rbf_pair = self.g_rbf_3b = self.g_theta = self.g_rho = None
        self.buffer = None  # the recomputed angle states between kept ones

    def _add_params(self, grads):
        self.g_params = [_add(a, b) for a, b in zip(self.g_params, grads)]

    def run(self, grad_hs):
        plan = self.plan
        g_h, g_e, g_a = None, None, None  # ∂E/∂(h, e, a) after block k
        for k in range(plan.last, -1, -1):
            g_h = _add(g_h, grad_hs[k])
            g_h, g_e, g_a = self.block(k, g_h, g_e, g_a)
            self.cache[k] = None
            self.kept.pop(k, None)
        return (g_h, g_e, self.g_theta, self.g_rho, self.g_rbf_pair, self.g_rbf_3b, *self.g_params)

    def angle_state(self, k):
        """``a_k`` ``[A, d_t]``: kept, or recomputed from the last kept state before it (block by
        block, in place); None for block 0 (the embedding, recomputed per chunk)."""
        plan = self.plan
        if k in self.kept or k == 0:
            return self.kept.get(k)
        j = max((i for i in self.kept if i < k), default=0)
        if self.buffer is None:
            self.buffer = self.theta.new_empty(plan.n_angles, plan.width)
        for i in range(j, k):
            cached = self.cache[i]
            p_att = plan.head(i, cached.e)
            h1, e2 = plan.middle(i, cached.h, cached.e, cached.t_agg, cached.s_agg)
            p_ref = plan.refine_terms(i, h1, e2, self.rbf_3b)
            for c in plan.slices:
                y = self.buffer[c] if i > j else (self.kept[j][c] if j else plan.embed(self.theta, self.rho, c))
                (mid,) = plan.attention_rows(i, y, p_att, (None, None), c, sums=False)
                self.buffer[c] = plan.refine_rows(i, mid, p_ref, c)[1]
        return self.buffer

    def block(self, k, g_h, g_e, g_a):
        plan, cached = self.plan, self.cache[k]
        params = self.params
        a = self.angle_state(k)
        shift = cached.shifts(self.theta.dtype)
        p_att = plan.head(k, cached.e)
        h1, e2 = plan.middle(k, cached.h, cached.e, cached.t_agg, cached.s_agg)

        # the bonds' update by R and the atom-graph Refine
        with torch.enable_grad():
            leaves = _detached([h1, e2, cached.r, self.rbf_pair], [True, True, True, self.rbf_pair.requires_grad])
            out = plan.tail(k, *leaves, rows=plan.rows)
            g_h1, g_e2, g_r, g_rbf, *g_p = _grads(out, leaves + params, [g_h, g_e])
        self.g_rbf_pair = _add(self.g_rbf_pair, g_rbf)
        self._add_params(g_p)

        # pass 1: a_mid recomputed, Refine's per-angle work differentiated
        with torch.enable_grad():
            ref_in = _detached([h1, e2, self.rbf_3b], [True, True, self.rbf_3b.requires_grad])
            p_ref = plan.refine_terms(k, *ref_in)
        p_leaves = _detached(p_ref, [True] * 4)
        g_ref = [None] * 4
        if g_a is None:
            g_a = self.theta.new_empty(plan.n_angles, plan.width)
            upstream = lambda c: None  # noqa: E731 (the last block's angles reach no output)
        else:
            upstream = g_a.__getitem__
        den_t = den_s = 0
        for c in plan.slices:
            y = a[c] if a is not None else plan.embed(self.theta, self.rho, c)
            _, d_t, _, d_s, mid = plan.attention_rows(k, y, p_att, shift, c)
            den_t, den_s = den_t + d_t, den_s + d_s
            with torch.enable_grad():
                (mid,) = _detached([mid], [True])
                out = plan.refine_rows(k, mid, p_leaves, c)
                g_mid, *rest = _grads(out, [mid] + p_leaves + params, [g_r, upstream(c)])
            g_a[c] = g_mid
            g_ref = [_add(x, y) for x, y in zip(g_ref, rest[:4])]
            self._add_params(rest[4:])
        with torch.enable_grad():
            g_h1b, g_e2b, g_rbf3, *g_p = _grads(p_ref, ref_in + params, g_ref)
        g_h1, g_e2 = _add(g_h1, g_h1b), _add(g_e2, g_e2b)
        self.g_rbf_3b = _add(self.g_rbf_3b, g_rbf3)
        self._add_params(g_p)

        # the line attention's node update and the atom-graph attention
        with torch.enable_grad():
            leaves = _detached([cached.h, cached.e, cached.t_agg, cached.s_agg], [True] * 4)
            out = plan.middle(k, *leaves, rows=plan.rows)
            g_hk, g_ek, g_t, g_s, *g_p = _grads(out, leaves + params, [g_h1, g_e2])
        self._add_params(g_p)
        # agg = N/D: ∂/∂N = 1/D, ∂/∂D = −agg/D (a bond without angles, D = 0: no rows to reach)
        sums = []
        for g_agg, agg, den in ((g_t, cached.t_agg, den_t), (g_s, cached.s_agg, den_s)):
            inv = torch.where(den > 0, 1 / torch.where(den > 0, den, 1), 0)
            g_n = g_agg * inv if g_agg is not None else None
            sums += [g_n, -g_n * agg if g_n is not None else None]

        # pass 2: the line attention's per-angle work differentiated
        with torch.enable_grad():
            (e_in,) = _detached([cached.e], [True])
            p_att = plan.head(k, e_in)
        p_leaves = _detached(p_att, [True, True])
        g_att = [None, None]
        for c in plan.slices:
            with torch.enable_grad():
                if a is None:  # block 0: the embedding of θ differentiated too
                    ins = _detached([self.theta[c], self.rho[c]], [self.theta.requires_grad, self.rho.requires_grad])
                    y = plan.embedding(*ins)
                else:
                    ins = _detached([a[c]], [True])
                    y = ins[0]
                out = plan.attention_rows(k, y, p_leaves, shift, c)
                got = _grads(out, ins + p_leaves + params, [*sums, g_a[c]])
            if a is None:
                self._rows(c, got[0], got[1])
            else:
                g_a[c] = got[0]
            got = got[len(ins):]
            g_att = [_add(x, y) for x, y in zip(g_att, got[:2])]
            self._add_params(got[2:])
        with torch.enable_grad():
            g_eh, *g_p = _grads(p_att, [e_in] + params, g_att)
        self._add_params(g_p)
        return g_hk, _add(g_ek, g_eh), g_a

    def _rows(self, c, g_theta, g_rho):
        """θ's and ρ's gradients of the chunk c."""
        for name, g, like in (("g_theta", g_theta, self.theta), ("g_rho", g_rho, self.rho)):
            if g is None:
                continue
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros_like(like))
            getattr(self, name)[c] = g


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b
