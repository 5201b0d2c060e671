"""Inference's lowest memory levels: the angles streamed through the blocks by chunks.

The angles dominate memory: diamond Si at the published three-body cutoff has ~450 angles per
atom and ~20 per bond, and one angle state ``a`` ``[A, d_t]`` is 512 B per angle in float32.
Here the blocks run as one autograd node (:func:`streamed`) that keeps, per angle, only

- the angle state at the input of some blocks (``kept``: every block at level 2, every
  ``every``-th at the lowest level; block 0's is the embedding of θ, recomputed from it),
- and during the backward pass one gradient buffer ``∂E/∂a`` and, between kept states, one
  buffer that the states in between are recomputed into,

and, per bond and block, what the angles' passes cannot give back in time: the block's inputs
``h``, ``e``, the features after its atom-graph attention and Refine's sums ``R`` (a sum over all
angles that the backward needs before its first pass over them). Everything else per angle lives
for one chunk of rows at a time.

An angle's state after a block depends only on its state before it and on bond and atom
features (``a' = Φ(a, e[t], e[s]) + w ⊙ a``, then Refine's), so a chunk of angles can be pushed
through a block given the bonds' and atoms' features; only the bonds' sums need all angles: the
attention's softmax per bond is merged from the chunks' partial softmaxes (their aggregates and
log-sum-exps, :func:`matris.kernels.merge_softmax`), Refine's sums added. Each block's backward
makes two passes over the chunks of angles:

1. the line attention recomputed without a graph (its angles' update, and the bonds' softmax
   again), and Refine's per-angle work differentiated: ``∂E/∂a_mid`` replaces ``∂E/∂a_{k+1}`` in
   the gradient buffer, chunk by chunk, and the bonds' projections collect their gradients;
2. after the bonds' and atoms' part of the block is differentiated (its atom-graph Φ by row
   chunks, :mod:`matris.model.recompute`), the line attention's per-angle work differentiated,
   a chunk's partial softmax receiving ``∂t/∂T_c = β_c``, ``∂t/∂lse_c = β_c (T_c − t)`` with
   ``β_c = exp(lse_c − L)``: ``∂E/∂a_k`` replaces ``∂E/∂a_mid``.

The angles' forward work runs three times (the forward pass and each backward pass) and its
backward once, against once and once keeping everything; between kept states, the states in
between are recomputed from the last kept one (block by block, in place).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .. import heap
from ..kernels import merge_softmax, references
from .block import BlockGraph
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
        self.chunks = [_Chunk.of(g, slice(lo, min(lo + self.chunk, self.n_angles)))
                       for lo in range(0, self.n_angles, self.chunk)]

    # the bonds' and atoms' parts of block k, in the order the block runs them
    def middle(self, k, h, e, t_agg, s_agg):
        """The bonds' update by the line attention's aggregates, then the atom-graph attention: ``(h, e)``."""
        return self.atom_attention(k, h, self.bond_update(k, e, t_agg, s_agg))

    def bond_update(self, k, e, t_agg, s_agg):
        """The bonds' update by the line attention's aggregates ``[B, d_e]``."""
        return self.blocks[k].attn_block_line_graph.node_update(e, t_agg, s_agg)

    def atom_attention(self, k, h, e, rows=None):
        """The atom-graph attention: ``(h, e)``."""
        g = self.graph
        return self.blocks[k].attn_block_atom_graph(h, e, g.edge_target, g.edge_source, d2u=g.edge_bond, rows=rows,
                                                    segments=g.atom_segments)

    def tail(self, k, h, e, r, rbf_pair, rows=None):
        """The bonds' update by Refine's sums ``r``, then the atom-graph Refine: ``(h, e)``."""
        b, g = self.blocks[k], self.graph
        e = b.refine_block_line_graph.node_update(e, r)
        return b.refine_block_atom_graph(h, e, g.edge_target, g.edge_source, rbf_pair, d2u=g.edge_bond, rows=rows,
                                         update_edges=k != self.last)

    # the angles' parts, on a chunk of angles and the bonds and atoms it touches: their features
    # gathered (``_Chunk.gather``, ``gather_refine``) and projected by Φ's first layer here, so that
    # neither the projections of all bonds nor their gradients are ever alive, only the features'
    # gradients
    def attention_rows(self, k, y, e, ch: "_Chunk", sums=True):
        """``(T, lse_t, S, lse_s, a_mid)`` of the chunk from the bonds' features ``e`` at its
        bonds (``sums`` False: ``(a_mid,)``)."""
        att = self.blocks[k].attn_block_line_graph
        p_t, p_s = att.line_projections(e, ch.tgt, ch.src, self.width)
        return att.line_partial(y, p_t, p_s, ch.tgt, ch.src, ch.bonds.shape[0], sums=sums)

    def refine_rows(self, k, y, h, e, rbf_3b, ch: "_Chunk"):
        """``(R, a_next)`` of the chunk (the last block: ``(R,)``) from the atoms' features ``h`` at
        its atoms, the bonds' ``e`` and their basis ``rbf_3b`` at its bonds."""
        ref = self.blocks[k].refine_block_line_graph
        p_ref = ref.line_projections(e, ch.tgt, ch.src, h, ch.atom, rbf_3b, self.width)
        return _RefineRows(ref)(y, *p_ref, ch.tgt, ch.src, ch.atom, ch.bonds.shape[0], reference=self.reference,
                                update_edges=k != self.last)

    def embed(self, theta, rho, ch: "_Chunk"):
        return self.embedding(theta[ch.rows], rho[ch.rows])


@dataclass
class _Chunk:
    """A chunk of angles ``rows`` with the bonds and atoms it touches (``bonds`` ``[n_b]``, ``atoms``
    ``[n_a]``) and its angles' indices into those (``tgt``, ``src``, ``atom``): its work reads and
    writes only their rows, so a pass over all chunks costs the angles', not chunks × bonds.
    ``present``: the local bonds with angles here, by target and by source (``[n_b, 1]`` bool)."""

    rows: slice
    bonds: torch.Tensor
    tgt: torch.Tensor
    src: torch.Tensor
    atoms: torch.Tensor
    atom: torch.Tensor
    present: tuple

    @classmethod
    def of(cls, g: BlockGraph, rows: slice) -> "_Chunk":
        t, s = g.angle_target_bond[rows], g.angle_source_bond[rows]
        bonds, local = torch.unique(torch.cat([t, s]), return_inverse=True)
        atoms, atom = torch.unique(g.angle_atom[rows], return_inverse=True)
        tgt, src = local[: t.shape[0]], local[t.shape[0]:]
        present = tuple(torch.bincount(i, minlength=bonds.shape[0]).gt(0).unsqueeze(1) for i in (tgt, src))
        return cls(rows, bonds, tgt, src, atoms, atom, present)

    def gather(self, e):
        """The rows of the chunk's bonds of ``e`` (one row per bond), as a one-item list."""
        return [e.index_select(0, self.bonds)]

    def gather_refine(self, h, e, rbf_3b):
        """The rows of the chunk's atoms of ``h`` and of its bonds of ``e`` and ``rbf_3b``."""
        return [h.index_select(0, self.atoms), e.index_select(0, self.bonds), rbf_3b.index_select(0, self.bonds)]


class _Softmax:
    """The bonds' softmax over all angles ``[B, C]`` (aggregate and log-sum-exp), merged from the
    chunks' partial ones as they come."""

    def __init__(self, n_bonds: int, like: torch.Tensor):
        self.agg = like.new_zeros((n_bonds, like.shape[-1]))
        self.lse = like.new_full((n_bonds, like.shape[-1]), float("-inf"))

    def add(self, t, lse, present, bonds):
        """Merge the chunk's partial softmax ``(t, lse)`` of its ``bonds``."""
        lse = torch.where(present, lse, float("-inf"))
        old_agg, old_lse = self.agg.index_select(0, bonds), self.lse.index_select(0, bonds)
        self.agg.index_copy_(0, bonds, merge_softmax([(old_agg, None, old_lse), (t, None, lse)]))
        self.lse.index_copy_(0, bonds, torch.logaddexp(old_lse, lse))

    def upstream(self, g, t, lse, present, bonds):
        """The gradients of the chunk's ``(t, lse)`` from ``g`` ``[B, C]`` = ∂E/∂(the merged aggregate)."""
        top = self.lse.index_select(0, bonds)
        beta = torch.where(present, torch.exp(lse - torch.where(present, top, 0)), 0)
        g_t = g.index_select(0, bonds) * beta
        return g_t, g_t * (t - self.agg.index_select(0, bonds))


@dataclass
class _Cached:
    """Per bond (and atom) of one block: its atoms' input features, its features after the
    atom-graph attention and Refine's sums over the angles (its bonds' input features are the
    previous block's output, recomputed from that block's: :meth:`_Backward.inputs`)."""

    h: torch.Tensor
    h1: torch.Tensor = None
    e2: torch.Tensor = None
    r: torch.Tensor = None


def streamed(plan: Plan, h, e, theta, rho, rbf_pair, rbf_3b) -> tuple[torch.Tensor, ...]:
    """The atoms' features after each block ``(h_1 … h_K)`` ``[N, d_n]`` from the embeddings ``h``
    ``[N, d_n]``, ``e`` ``[B, d_e]``, the angles ``theta``, ``rho`` ``[A]`` and the bases ``rbf_pair``,
    ``rbf_3b`` ``[B, K]``, as one autograd node (see the module docstring)."""
    inputs = (h, e, theta, rho, rbf_pair, rbf_3b, *plan.params)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in inputs)):  # no backward: nothing kept
        with references(plan.reference), torch.no_grad():
            return tuple(_forward(plan, h, e, theta, rho, rbf_pair, rbf_3b, keep=False)[0])
    return _Stream.apply(plan, *inputs)


def _forward(plan: Plan, h, e, theta, rho, rbf_pair, rbf_3b, keep: bool = True):
    """The blocks by chunks without a graph: ``(h_1 … h_K)``, and (``keep``) the kept angle states and
    the blocks' per-bond sums the backward pass reads."""
    cur = theta.new_empty(plan.n_angles, plan.width)
    for ch in plan.chunks:
        cur[ch.rows] = plan.embed(theta, rho, ch)
    kept, cache, hs = {}, [], []
    for k in range(len(plan.blocks)):
        if keep and k in plan.kept:
            kept[k] = cur
        mid = torch.empty_like(cur) if k in kept else cur  # a kept state stays; else in place
        soft = _Softmax(plan.n_bonds, cur), _Softmax(plan.n_bonds, cur)
        for ch in plan.chunks:
            t, lse_t, s, lse_s, mid[ch.rows] = plan.attention_rows(k, cur[ch.rows], *ch.gather(e), ch)
            soft[0].add(t, lse_t, ch.present[0], ch.bonds)
            soft[1].add(s, lse_s, ch.present[1], ch.bonds)
        cached = _Cached(h)
        cached.h1, cached.e2 = plan.middle(k, h, e, soft[0].agg, soft[1].agg)
        del soft
        r = torch.zeros_like(e)
        for ch in plan.chunks:
            out = plan.refine_rows(k, mid[ch.rows], *ch.gather_refine(cached.h1, cached.e2, rbf_3b), ch)
            r.index_add_(0, ch.bonds, out[0])
            if k != plan.last:
                mid[ch.rows] = out[1]
        cached.r = r
        if keep:
            cache.append(cached)
        h, e = plan.tail(k, cached.h1, cached.e2, r, rbf_pair)
        hs.append(h)
        cur = mid
        _release(cur)
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

    def inputs(self, k):
        """Block k's input features ``(h, e)``: the bonds' recomputed from block k − 1's sums."""
        if k == 0:
            return self.h0, self.e0
        prev = self.cache[k - 1]
        return self.cache[k].h, self.plan.tail(k - 1, prev.h1, prev.e2, prev.r, self.rbf_pair)[1]

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
            e_i = self.inputs(i)[1]
            for ch in plan.chunks:
                rows = ch.rows
                y = self.buffer[rows] if i > j else (self.kept[j][rows] if j else plan.embed(self.theta, self.rho, ch))
                (mid,) = plan.attention_rows(i, y, *ch.gather(e_i), ch, sums=False)
                inputs = ch.gather_refine(cached.h1, cached.e2, self.rbf_3b)
                self.buffer[rows] = plan.refine_rows(i, mid, *inputs, ch)[1]
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
            out = plan.tail(k, *leaves, rows=plan.rows)
            g_h1, g_e2, g_r, g_rbf, *g_p = _grads(out, leaves + params, [g_h, g_e])
        self.g_rbf_pair = _add(self.g_rbf_pair, g_rbf)
        self._add_params(g_p)
        del out, leaves

        _release(e_k)
        # pass 1: the line attention recomputed, Refine's per-angle work differentiated
        wants = [True, True, self.rbf_3b.requires_grad]
        g_ref = [torch.zeros_like(x) if w else None for x, w in zip((cached.h1, cached.e2, self.rbf_3b), wants)]
        if g_a is None:
            g_a = self.theta.new_empty(plan.n_angles, plan.width)
            upstream = lambda rows: None  # noqa: E731 (the last block's angles reach no output)
        else:
            upstream = g_a.__getitem__
        soft = _Softmax(plan.n_bonds, g_a), _Softmax(plan.n_bonds, g_a)
        for ch in plan.chunks:
            rows = ch.rows
            y = a[rows] if a is not None else plan.embed(self.theta, self.rho, ch)
            t, lse_t, s, lse_s, mid = plan.attention_rows(k, y, *ch.gather(e_k), ch)
            soft[0].add(t, lse_t, ch.present[0], ch.bonds)
            soft[1].add(s, lse_s, ch.present[1], ch.bonds)
            with torch.enable_grad():
                ins = _detached([mid, *ch.gather_refine(cached.h1, cached.e2, self.rbf_3b)], [True] + wants)
                out = plan.refine_rows(k, *ins, ch)
                got = _grads(out, ins + params, [g_r.index_select(0, ch.bonds), upstream(rows)])
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

        # the atom-graph attention, then the line attention's update of the bonds (one graph alive at a time)
        with torch.enable_grad():
            leaves = _detached([h_k, plan.bond_update(k, e_k, soft[0].agg, soft[1].agg)], [True, True])
            out = plan.atom_attention(k, *leaves, rows=plan.rows)
            g_hk, g_e1, *g_p = _grads(out, leaves + params, [g_h1, g_e2])
        self._add_params(g_p)
        del out, leaves
        with torch.enable_grad():
            leaves = _detached([e_k, soft[0].agg, soft[1].agg], [True] * 3)
            g_ek, g_t, g_s, *g_p = _grads([plan.bond_update(k, *leaves)], leaves + params, [g_e1])
        self._add_params(g_p)
        del leaves

        _release(g_a)
        # pass 2: the line attention's per-angle work differentiated
        for ch in plan.chunks:
            rows = ch.rows
            with torch.enable_grad():
                if a is None:  # block 0: the embedding of θ differentiated too
                    ins = _detached([self.theta[rows], self.rho[rows]],
                                    [self.theta.requires_grad, self.rho.requires_grad])
                    y = plan.embedding(*ins)
                else:
                    ins = _detached([a[rows]], [True])
                    y = ins[0]
                e_in = _detached(ch.gather(e_k), [True])
                t, lse_t, s, lse_s, y_new = plan.attention_rows(k, y, *e_in, ch)
                ups = []
                for soft_k, g_agg, part, lse, present in ((soft[0], g_t, t, lse_t, ch.present[0]),
                                                          (soft[1], g_s, s, lse_s, ch.present[1])):
                    ups += (soft_k.upstream(g_agg, part.detach(), lse.detach(), present, ch.bonds)
                            if g_agg is not None else (None, None))
                got = _grads([t, lse_t, s, lse_s, y_new], ins + e_in + params, [*ups, g_a[rows]])
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
    """Give the heap's free memory back to the system between passes (CPU, glibc): a pass's
    transients of many sizes otherwise leave holes that the process's resident memory keeps, about
    a fifth more than what is alive at this level's peak (measured on Si512)."""
    if like.device.type == "cpu":
        heap.release_memory()


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b

