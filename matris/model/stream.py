"""Inference's lowest memory levels: the angles streamed through the blocks by chunks.

The angles dominate memory (diamond Si at the published three-body cutoff: ~450 per atom, ~20 per bond; 512 B each
for ``a`` ``[A, d_t]`` in float32). The blocks run as one autograd node (:func:`streamed`) keeping per angle only the
input states of the blocks in ``kept`` (level 2: all; the lowest level: every ``every``-th; block 0's is recomputed
from θ) and, in the backward pass, a gradient buffer ``∂E/∂a`` and a buffer for the states between kept ones; per bond
and block, :class:`_Cached`. All else per angle lives for one chunk at a time.

The forward is :meth:`matris.model.block.InteractionBlock.forward` with :class:`_StreamLines` driving the per-angle
parts by chunks without a graph. The backward (:class:`_Backward`), block by block from the last, makes two passes
over the chunks: (1) the line attention recomputed and Refine's per-angle part differentiated (``∂E/∂a_mid`` replaces
``∂E/∂a_{k+1}`` in the buffer); (2) after the bonds' and atoms' parts (the atom-graph Φ by row chunks), the line
attention's per-angle part differentiated, each chunk's sums taking their share of ``∂E/∂N``, ``∂E/∂D`` (``∂E/∂a_k``
replaces ``∂E/∂a_mid``). So the angles' forward work runs three times, their backward once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import heap
from ..kernels import merge_softmax
from .block import Angles, BlockGraph, Lines
from .recompute import RowRecompute, _detached, _grads


@dataclass(eq=False)
class Plan:
    """What :func:`streamed` runs: the model's ``blocks`` and angle ``embedding`` on ``graph`` (with its kernels), by
    ``chunk`` angles; ``kept``: the blocks whose input angle states are kept; ``params``: those wanting gradients."""

    blocks: nn.ModuleList
    embedding: nn.Module
    graph: BlockGraph
    kept: frozenset
    chunk: int
    params: list = field(default_factory=list)

    def __post_init__(self):
        g = self.graph
        self.last = len(self.blocks) - 1
        self.n_bonds = g.n_bonds
        self.n_angles = g.angle_atom.shape[0]
        self.width = self.embedding.swish_layer.linear.weight.shape[0]
        self.kernels = g.kernels
        self.rows = dataclasses.replace(g, rows=RowRecompute(self.chunk, g.kernels))
        self.chunks = [Angles.chunk(g, slice(lo, min(lo + self.chunk, self.n_angles)))
                       for lo in range(0, self.n_angles, self.chunk)]
        # chunks in local numbering on pre-gathered rows: no gradients or projections of all bonds per chunk
        self.local = [dataclasses.replace(ch, bonds=None, atoms=None) for ch in self.chunks]

    def embed(self, theta, rho, ch: Angles):
        return self.embedding(theta[ch.rows], rho[ch.rows], fused=self.kernels.fused)

    def graph_with(self, rbf_pair, rows: bool = False) -> BlockGraph:
        return dataclasses.replace(self.rows if rows else self.graph, rbf_pair=rbf_pair)

    def tail(self, k, h, e, r, rbf_pair, rows: bool = False):
        """Block k's bonds' update by Refine's sums ``r``, then the atom-graph Refine: ``(h, e)``."""
        b = self.blocks[k]
        return b.atom_refine(h, b.bonds_refined(e, r), self.graph_with(rbf_pair, rows), k == self.last)

    def attention_sums(self, k, a, e, out=None, theta=None, rho=None) -> "Softmax":
        """Block k's split softmax by chunks of ``a`` (None: embedded) (:class:`Softmax`); ``out``: a_mid."""
        b = self.blocks[k]
        soft = Softmax(self.n_bonds, self.width, e)
        for ch, local in zip(self.chunks, self.local):
            y = a[ch.rows] if a is not None else self.embed(theta, rho, ch)
            t, lse_t, s, lse_s, a_mid = b.line_attention(y, ch.of_bonds(e), local, self.kernels, partial=True)
            soft.add(ch, t, lse_t, s, lse_s)
            if out is not None:
                out[ch.rows] = a_mid
        return soft

    def refine_rows(self, k, a, h, e, rbf_3b, ch: Angles, local: Angles):
        """``(R, a_next)`` of the chunk (last block: ``(R, a)``) from its gathered rows of ``h``, ``e``, ``rbf_3b``."""
        return self.blocks[k].line_refine(a, h, e, rbf_3b, local, self.kernels, k == self.last)


def chunk_sums(ch: Angles, t, lse_t, s, lse_s, shift):
    """A chunk's partial softmaxes as sums relative to the bonds' ``shift`` (its local rows)."""
    return (*ch.sums(t, lse_t, 0, ch.of_bonds(shift[0])), *ch.sums(s, lse_s, 1, ch.of_bonds(shift[1])))


class Softmax:
    """A block's split softmax over all angles, merged chunk by chunk as they come: per side (by target, by source)
    the aggregate ``agg`` and log-sum-exp ``lse`` ``[B, d_t]`` over the chunks so far
    (:func:`matris.kernels.merge_softmax`). As the sums of :meth:`Angles.sums` they are ``(N, D) = (agg, 1)``
    relative to ``shift = lse``. No pass over the angles for a shift, and nothing per bond kept for the backward,
    which merges the same chunks the same way again."""

    def __init__(self, n_bonds: int, width: int, like: torch.Tensor):
        self.agg = [like.new_zeros((n_bonds, width)) for _ in range(2)]
        self.shift = [like.new_full((n_bonds, width), float("-inf")) for _ in range(2)]

    def add(self, ch: Angles, t, lse_t, s, lse_s):
        for side, (x, lse) in enumerate(((t, lse_t), (s, lse_s))):
            lse = torch.where(ch.present[side], lse, float("-inf"))
            agg, top = self.agg[side], self.shift[side]
            old_agg, old_lse = agg.index_select(0, ch.bonds), top.index_select(0, ch.bonds)
            agg.index_copy_(0, ch.bonds, merge_softmax([(old_agg, None, old_lse), (x, None, lse)]))
            top.index_copy_(0, ch.bonds, torch.logaddexp(old_lse, lse))

    def merged(self):
        return tuple(self.agg)


@dataclass
class _Cached:
    """Per bond/atom of a block: input ``h``; ``h1``, ``e2`` after atom attention; Refine's ``r``."""

    h: torch.Tensor
    h1: torch.Tensor = None
    e2: torch.Tensor = None
    r: torch.Tensor = None


class _StreamLines(Lines):
    """A block's per-angle parts by chunks, no graph: updates into ``mid``, what the backward reads into ``cached``."""

    def __init__(self, plan: Plan, k: int, mid: torch.Tensor, cached: _Cached):
        self.plan, self.k, self.mid, self.cached = plan, k, mid, cached

    def attention(self, block, e, a, g):
        return block.bonds_attended(e, *self.plan.attention_sums(self.k, a, e, out=self.mid).merged()), self.mid

    def refine(self, block, h, e, a, g, last):
        plan, cached = self.plan, self.cached
        cached.h1, cached.e2 = h, e
        r = torch.zeros_like(e)
        for ch, local in zip(plan.chunks, plan.local):
            out = plan.refine_rows(self.k, a[ch.rows], ch.of_atoms(h), ch.of_bonds(e), ch.of_bonds(g.rbf_3b), ch, local)
            r.index_add_(0, ch.bonds, out[0])
            if not last:
                a[ch.rows] = out[1]
        cached.r = r
        return block.bonds_refined(e, r), a


def streamed(plan: Plan, h, e, theta, rho, rbf_pair, rbf_3b) -> tuple[torch.Tensor, ...]:
    """The atoms after each block ``(h_1 … h_K)`` ``[N, d_n]`` from ``h`` ``[N, d_n]``, ``e`` ``[B, d_e]``, the angles
    ``theta``, ``rho`` ``[A]`` and bases ``rbf_pair``, ``rbf_3b`` ``[B, K]``, as one autograd node (see the module)."""
    inputs = (h, e, theta, rho, rbf_pair, rbf_3b, *plan.params)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in inputs)):  # no backward: nothing kept
        with torch.no_grad():
            return tuple(_forward(plan, h, e, theta, rho, rbf_pair, rbf_3b, keep=False)[0])
    return _Stream.apply(plan, *inputs)


def _forward(plan: Plan, h, e, theta, rho, rbf_pair, rbf_3b, keep: bool = True):
    """The blocks by chunks without a graph: ``(h_1 … h_K)``, and (``keep``) the kept angle states and ``_Cached``s."""
    cur = theta.new_empty(plan.n_angles, plan.width)
    for ch in plan.chunks:
        cur[ch.rows] = plan.embed(theta, rho, ch)
    g = dataclasses.replace(plan.graph, rbf_pair=rbf_pair, rbf_3b=rbf_3b)
    kept, cache, hs = {}, [], []
    for k, block in enumerate(plan.blocks):
        if keep and k in plan.kept:
            kept[k] = cur
        mid = torch.empty_like(cur) if k in kept else cur  # a kept state stays; else in place
        cached = _Cached(h)
        h, e, cur = block(h, e, cur, dataclasses.replace(g, lines=_StreamLines(plan, k, mid, cached)),
                          last=k == plan.last)
        if keep:
            cache.append(cached)
        hs.append(h)
        _release(cur)
    return hs, kept, cache


class _Stream(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: Plan, h, e, theta, rho, rbf_pair, rbf_3b, *params):
        hs, kept, cache = _forward(plan, h, e, theta, rho, rbf_pair, rbf_3b)
        ctx.set_materialize_grads(False)
        ctx.plan, ctx.kept, ctx.cache = plan, kept, cache
        ctx.save_for_backward(h, e, theta, rho, rbf_pair, rbf_3b)
        return tuple(hs)

    @staticmethod
    def backward(ctx, *grad_hs):
        with torch.no_grad():
            grads = _Backward(ctx.plan, ctx.saved_tensors, ctx.kept, ctx.cache).run(grad_hs)
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

    def inputs(self, k):
        """Block k's input features ``(h, e)``: the bonds' recomputed from block k − 1's sums."""
        if k == 0:
            return self.h0, self.e0
        prev = self.cache[k - 1]
        return self.cache[k].h, self.plan.tail(k - 1, prev.h1, prev.e2, prev.r, self.rbf_pair)[1]

    def angle_state(self, k):
        """``a_k`` ``[A, d_t]``: kept, or recomputed in place from the last kept one; None for block 0 (embedded)."""
        plan = self.plan
        if k in self.kept or k == 0:
            return self.kept.get(k)
        j = max((i for i in self.kept if i < k), default=0)
        if self.buffer is None:
            self.buffer = self.theta.new_empty(plan.n_angles, plan.width)
        for i in range(j, k):
            cached, e_i = self.cache[i], self.inputs(i)[1]
            att = plan.blocks[i].attn_block_line_graph
            for ch, local in zip(plan.chunks, plan.local):
                rows = ch.rows
                y = self.buffer[rows] if i > j else (self.kept[j][rows] if j else plan.embed(self.theta, self.rho, ch))
                mid = att.line_update(y, ch.of_bonds(e_i), local, plan.kernels)
                self.buffer[rows] = plan.refine_rows(i, mid, ch.of_atoms(cached.h1), ch.of_bonds(cached.e2),
                                                     ch.of_bonds(self.rbf_3b), ch, local)[1]
        return self.buffer

    def block(self, k, g_h, g_e, g_a):
        plan, cached = self.plan, self.cache[k]
        params = self.params
        a = self.angle_state(k)
        h_k, e_k = self.inputs(k)

        # the bonds' update by R and the atom-graph Refine
        with torch.enable_grad():
            leaves = _detached([cached.h1, cached.e2, cached.r, self.rbf_pair],
                               [True, True, True, self.rbf_pair.requires_grad])
            out = plan.tail(k, *leaves, rows=True)
            g_h1, g_e2, g_r, g_rbf, *g_p = _grads(out, leaves + params, [g_h, g_e])
        self.g_rbf_pair = _add(self.g_rbf_pair, g_rbf)
        self._add_params(g_p)
        del out, leaves

        _release(e_k)
        # pass 1: the line attention recomputed, Refine's per-angle part differentiated
        if g_a is None:
            g_a = self.theta.new_empty(plan.n_angles, plan.width)
            upstream = lambda rows: None  # noqa: E731 (the last block's angles reach no output)
        else:
            upstream = g_a.__getitem__
        wants = [True, True, self.rbf_3b.requires_grad]
        g_ref = [torch.zeros_like(x) if w else None for x, w in zip((cached.h1, cached.e2, self.rbf_3b), wants)]
        soft = Softmax(plan.n_bonds, plan.width, e_k)
        att = plan.blocks[k].line_attention
        for ch, local in zip(plan.chunks, plan.local):
            rows = ch.rows
            y = a[rows] if a is not None else plan.embed(self.theta, self.rho, ch)
            t, lse_t, s, lse_s, y_mid = att(y, ch.of_bonds(e_k), local, plan.kernels, partial=True)
            soft.add(ch, t, lse_t, s, lse_s)
            with torch.enable_grad():
                gathered = [ch.of_atoms(cached.h1), ch.of_bonds(cached.e2), ch.of_bonds(self.rbf_3b)]
                ins = _detached([y_mid, *gathered], [True] + wants)
                out = plan.refine_rows(k, *ins, ch, local)
                got = _grads(out[:1] if k == plan.last else out, ins + params,
                             [g_r.index_select(0, ch.bonds), upstream(rows)])
            g_a[rows] = got[0]
            for total, part, index in zip(g_ref, got[1:4], (ch.atoms, ch.bonds, ch.bonds)):
                if total is not None:
                    total.index_add_(0, index, part)
            self._add_params(got[4:])
        del out, ins, g_r
        _release(g_a)
        g_h1, g_e2 = _add(g_h1, g_ref[0]), _add(g_e2, g_ref[1])
        self.g_rbf_3b = _add(self.g_rbf_3b, g_ref[2])
        del g_ref

        # the atom-graph attention, then the line attention's bonds' update (one graph alive at a time)
        with torch.enable_grad():
            leaves = _detached([h_k, plan.blocks[k].bonds_attended(e_k, *soft.merged())], [True, True])
            out = plan.blocks[k].atom_attention(*leaves, plan.graph_with(self.rbf_pair, rows=True))
            g_hk, g_e1, *g_p = _grads(out, leaves + params, [g_h1, g_e2])
        self._add_params(g_p)
        del out, leaves
        with torch.enable_grad():
            leaves = _detached([e_k, *soft.agg], [True] * 3)
            g_ek, g_t, g_s, *g_p = _grads([plan.blocks[k].bonds_attended(*leaves)], leaves + params, [g_e1])
        self._add_params(g_p)
        agg, shift = soft.agg, soft.shift
        del leaves, soft

        _release(g_a)
        # pass 2: the line attention's per-angle part differentiated
        for ch, local in zip(plan.chunks, plan.local):
            rows = ch.rows
            with torch.enable_grad():
                if a is None:  # block 0: the embedding of θ differentiated too
                    ins = _detached([self.theta[rows], self.rho[rows]],
                                    [self.theta.requires_grad, self.rho.requires_grad])
                    y = plan.embedding(*ins, fused=plan.kernels.fused)
                else:
                    ins = _detached([a[rows]], [True])
                    y = ins[0]
                e_in = _detached([ch.of_bonds(e_k)], [True])
                t, lse_t, s, lse_s, y_new = att(y, e_in[0], local, plan.kernels, partial=True)
                parts = chunk_sums(ch, t, lse_t, s, lse_s, shift)
                ups = []  # ∂E/∂N = g, ∂E/∂D = −g·agg: the sums relative to shift = lse, where ΣD = 1
                for g_side, agg_side in ((g_t, agg[0]), (g_s, agg[1])):
                    g_b = None if g_side is None else g_side.index_select(0, ch.bonds)
                    ups += [g_b, None if g_b is None else -g_b * agg_side.index_select(0, ch.bonds)]
                got = _grads([*parts, y_new], ins + e_in + params, [*ups, g_a[rows]])
            if a is None:
                self._rows(rows, got[0], got[1])
            else:
                g_a[rows] = got[0]
            got = got[len(ins):]
            if got[0] is not None:
                g_ek.index_add_(0, ch.bonds, got[0])
            self._add_params(got[1:])
        return g_hk, g_ek, g_a

    def _rows(self, rows, g_theta, g_rho):
        """θ's and ρ's gradients of the chunk's ``rows``."""
        for name, g, like in (("g_theta", g_theta, self.theta), ("g_rho", g_rho, self.rho)):
            if g is None:
                continue
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros_like(like))
            getattr(self, name)[rows] = g


def _release(like: torch.Tensor) -> None:
    """Return the heap's free memory between passes (CPU, glibc): else its holes keep ~1/5 above the peak (Si512)."""
    if like.device.type == "cpu":
        heap.release_memory()


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b
