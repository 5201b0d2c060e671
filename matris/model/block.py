"""One interaction block (spec §5), written once as its parts; every memory path drives the same parts.

A block maps atoms ``h`` ``[N, d_n]``, bonds ``e`` ``[B, d_e]`` and angles ``a`` ``[A, d_t]`` to new ones in four
steps (:meth:`InteractionBlock.forward`, the one place they are written): line-graph attention, atom-graph attention,
line-graph Refine, atom-graph Refine. The atom-graph steps are per bond and atom; each line-graph step is

- a **per-angle part** (:meth:`~InteractionBlock.line_attention`, :meth:`~InteractionBlock.line_refine`), the model's
  widest work (~20 angles per bond): row-wise in the angles given their bonds' and atoms' features, so it runs on any
  chunk of angles (:class:`Angles`, reading and writing only the bonds and atoms the chunk touches);
- a **reduction into the bonds**: Refine's sums ``R`` added over chunks; the attention's softmax merged from the
  chunks' ``(T_c, lse_c)`` (aggregate and log-sum-exp, :func:`matris.kernels.attention_pair_lse`), which relative to
  a shift ``s`` per bond are the sums ``N_c = T_c·exp(lse_c − s)``, ``D_c = exp(lse_c − s)`` (:meth:`Angles.sums`):
  the softmax is ``ΣN_c / ΣD_c``. ``s`` is the bond's largest logit where each chunk is its own autograd node
  (:meth:`~matris.model.attention.SeparableAttention.logit_max`), or, streamed, the running log-sum-exp of the chunks
  merged so far, the sums then ``(agg, 1)`` (:class:`matris.model.stream.Softmax`);
- the **bonds' update** from those (:meth:`~InteractionBlock.bonds_attended`, ``bonds_refined``).

A memory path drives the per-angle parts: all angles at once (:class:`Lines`, levels 0 and 1), a domain rank's with
the halo's merges (:class:`HaloLines`), nodes recomputed by chunks (training's rows, :class:`RowLines`), or chunks
streamed without a graph with a hand-written backward (levels 2–3, :mod:`matris.model.stream`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from ..kernels import REFERENCES, Kernels, merge_softmax
from . import recompute
from .attention import SeparableAttention
from .config import MatRISConfig
from .recompute import RowRecompute
from .refine import Refine


@dataclass(eq=False)
class Angles:
    """Some angles (all, a chunk, a rank's) in a local numbering of the bonds and atoms they touch.

    tgt, src ``[a]``: each angle's local target and source bond (of ``n``); atom ``[a]``: its local centre atom; bonds
    ``[n]``, atoms: the bond and atom of each local number (None: the graph's); rows: the angles' slice (None: all);
    present: (by target, by source) ``[n, 1]`` if a local bond has angles here (None: it holds all of each bond's)."""

    tgt: torch.Tensor
    src: torch.Tensor
    atom: torch.Tensor
    n: int
    bonds: torch.Tensor | None = None
    atoms: torch.Tensor | None = None
    rows: slice | None = None
    present: tuple | None = None

    @classmethod
    def chunk(cls, g: "BlockGraph", rows: slice) -> "Angles":
        """The angles ``rows`` of ``g`` on the bonds and atoms they touch (all chunks: O(A) work, not chunks × B)."""
        t, s = g.angle_target_bond[rows], g.angle_source_bond[rows]
        bonds, local = torch.unique(torch.cat([t, s]), return_inverse=True)
        atoms, atom = torch.unique(g.angle_atom[rows], return_inverse=True)
        tgt, src = local[: t.shape[0]], local[t.shape[0]:]
        present = tuple(torch.bincount(i, minlength=bonds.shape[0]).gt(0).unsqueeze(1) for i in (tgt, src))
        return cls(tgt, src, atom, bonds.shape[0], bonds, atoms, rows, present)

    def of_bonds(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.bonds is None else x.index_select(0, self.bonds)

    def of_atoms(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.atoms is None else x.index_select(0, self.atoms)

    def to_bonds(self, x: torch.Tensor, n_bonds: int) -> torch.Tensor:
        """Local rows ``[n, C]`` → ``[n_bonds, C]`` (zero at the bonds not touched)."""
        return x if self.bonds is None else x.new_zeros((n_bonds, x.shape[1])).index_copy(0, self.bonds, x)

    def sums(self, t: torch.Tensor, lse: torch.Tensor, side: int, shift: torch.Tensor):
        """``(N, D)`` ``[n, C]`` of one side's partial softmax ``(T, lse)`` (side 0: by target, 1: by source) relative
        to the local bonds' ``shift`` (module docstring); 0 at a bond without angles on that side here."""
        d = torch.exp(torch.where(self.present[side], lse - shift, float("-inf")))
        return t * d, d


@dataclass
class BlockGraph:
    """Indices and bases that every block reads, computed once per forward pass.

    edge_target, edge_source: ``[2B]`` atoms of each directed edge; edge_bond: ``[2B]`` d2u.
    angle_atom, angle_target_bond, angle_source_bond: ``[A]``. rbf_pair, rbf_3b: ``[B, K]`` radial bases of the bonds.
    kernels: the call's kernels (:class:`matris.kernels.Kernels`, with the CUDA kernels' CSR segments).
    checkpoint: 1 recomputes each of the four steps in the backward pass (inference memory level 1, same numbers).
    rows: in training's block recomputation, the per-angle parts and atom-graph Φ by row chunks (:class:`RowLines`).
    halo: a domain rank (:class:`matris.domain.evaluate.RankHalo`; None: a whole system): the line graph numbered by
    its bonds' ends (``angle_target_end``, ``angle_source_end`` ``[A]``, ``n_ends``, ``end_bond``), ``line_softmax``,
    ``line_sums`` merge into the bonds', ``atoms`` refreshes ghost atoms after atom-graph steps; ``has_angles``: global.
    lines: the driver of the per-angle parts (default: :class:`Lines`, or :class:`HaloLines`)."""

    edge_target: torch.Tensor
    edge_source: torch.Tensor
    edge_bond: torch.Tensor
    angle_atom: torch.Tensor
    angle_target_bond: torch.Tensor
    angle_source_bond: torch.Tensor
    rbf_pair: torch.Tensor
    rbf_3b: torch.Tensor
    kernels: Kernels = REFERENCES
    checkpoint: int = 0
    rows: RowRecompute | None = None
    halo: object | None = None
    lines: "Lines | None" = None

    def __post_init__(self):
        if self.lines is None:
            self.lines = HaloLines() if self.halo is not None else Lines()

    @property
    def has_angles(self) -> bool:
        return self.halo.has_angles if self.halo is not None else self.angle_atom.shape[0] > 0

    @property
    def n_bonds(self) -> int:
        return self.rbf_3b.shape[0]

    def angles(self) -> Angles:
        """All angles: in the bonds' numbering, or a rank's bonds' ends."""
        if self.halo is not None:
            h = self.halo
            return Angles(h.angle_target_end, h.angle_source_end, self.angle_atom, h.n_ends, bonds=h.end_bond)
        return Angles(self.angle_target_bond, self.angle_source_bond, self.angle_atom, self.n_bonds)

    def rows_of(self, rows: slice) -> Angles:
        """The angles ``rows`` in the graph's numbering (training's row chunks: their sums land in all bonds)."""
        return Angles(self.angle_target_bond[rows], self.angle_source_bond[rows], self.angle_atom[rows], self.n_bonds,
                      rows=rows)


class InteractionBlock(nn.Module):
    """``(h, e, a) → (h, e, a)``: atoms ``[N, d_n]``, bonds ``[B, d_e]``, angles ``[A, d_t]``."""

    def __init__(self, config: MatRISConfig):
        super().__init__()
        d_n, d_e, d_t = config.node_feat_dim, config.edge_feat_dim, config.three_body_feat_dim
        self.attn_block_atom_graph = SeparableAttention(config, d_n, d_e, d_n)
        self.attn_block_line_graph = SeparableAttention(config, d_e, d_t, d_e)
        self.refine_block_atom_graph = Refine(
            config, d_n, d_e, d_n, config.num_radial, smooth_delta_edge=config.use_smoothed_for_delta_edge
        )
        self.refine_block_line_graph = Refine(config, d_e, d_t, d_e, config.num_angular, d_extra=d_n)

    def forward(
        self, h: torch.Tensor, e: torch.Tensor, a: torch.Tensor, g: BlockGraph, last: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``last``: the last block; its Refine skips FFN_edge (unread): ``e``, ``a`` return as attention left them."""
        # a bond without angles takes the update of empty sums, as in official MatRIS 1.0: the same alone or batched
        if g.has_angles:
            e, a = _step(g, g.lines.attention, self, e, a, g)
        else:
            e = self.attn_block_line_graph.empty_update(e)
        h, e = _step(g, self.atom_attention, h, e, g)
        if g.halo is not None:
            h = g.halo.atoms(h, "atom_attention")
        if g.has_angles:
            e, a = _step(g, g.lines.refine, self, h, e, a, g, last)
        else:
            e = self.refine_block_line_graph.empty_update(e)
        h, e = _step(g, self.atom_refine, h, e, g, last)
        if g.halo is not None and not last:
            h = g.halo.atoms(h, "atom_refine")
        return h, e, a

    # the per-angle parts: on the angles ``angles`` (rows ``a`` of them) and their bonds' and atoms' rows
    def line_attention(self, a, e, angles: Angles, k: Kernels, partial: bool = False, shift=None, projected=None):
        """``(T, lse_t, S, lse_s, a_mid)``: the bonds' softmax over these angles (``partial``: with the log-sum-exps,
        for a merge; ``shift`` (all bonds): the sums relative to it) and the angles' update
        (:meth:`matris.model.attention.SeparableAttention.line_part`); ``projected`` (all bonds) in place of ``e``."""
        local = None if shift is None else [angles.of_bonds(x) for x in shift]
        proj = None if projected is None else [angles.of_bonds(p) for p in projected]
        return self.attn_block_line_graph.line_part(a, None if e is None else angles.of_bonds(e), angles, k, partial,
                                                    local, proj)

    def line_refine(self, a, h, e, rbf_3b, angles: Angles, k: Kernels, last: bool = False, projected=None):
        """``(R, a_next)``: Refine's sums over these angles ``[n, d_e]`` and the angles' update; ``projected``
        ``(p_h, p_t, p_s, q)`` (all atoms and bonds, :meth:`matris.model.refine.Refine.line_projections`) in place of
        ``h``, ``e``, ``rbf_3b``."""
        ref = self.refine_block_line_graph
        if projected is not None:
            p_h, p_t, p_s, q = projected
            local = (angles.of_atoms(p_h), angles.of_bonds(p_t), angles.of_bonds(p_s), angles.of_bonds(q))
            return ref.line_part(a, None, None, None, angles, k, not last, projected=local)
        return ref.line_part(a, angles.of_bonds(e), angles.of_atoms(h), angles.of_bonds(rbf_3b), angles, k, not last)

    # the bonds' and atoms' parts
    def bonds_attended(self, e, t, s):
        """The bonds' update by the line attention's softmax aggregates ``T``, ``S`` ``[B, d_t]``."""
        return self.attn_block_line_graph.node_update(e, t, s)

    def bonds_refined(self, e, r):
        """The bonds' update by the line Refine's sums ``R`` ``[B, d_t]``."""
        return self.refine_block_line_graph.node_update(e, r)

    def atom_attention(self, h, e, g: BlockGraph):
        return self.attn_block_atom_graph(h, e, g.edge_target, g.edge_source, g.edge_bond, g.kernels, g.rows)

    def atom_refine(self, h, e, g: BlockGraph, last: bool = False):
        return self.refine_block_atom_graph(h, e, g.edge_target, g.edge_source, g.rbf_pair, g.edge_bond, g.kernels,
                                            g.rows, update_edges=not last)


def _step(g: BlockGraph, fn, *args):
    """One step of a block; at memory level 1 recomputed in the backward pass (on the same kernels: an argument)."""
    if g.checkpoint:
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


class Lines:
    """The per-angle parts on all angles at once, with the whole graph's kernels (levels 0, 1)."""

    def attention(self, block: InteractionBlock, e, a, g: BlockGraph):
        t, _, s, _, a_mid = block.line_attention(a, e, g.angles(), g.kernels)
        return block.bonds_attended(e, t, s), a_mid

    def refine(self, block: InteractionBlock, h, e, a, g: BlockGraph, last: bool):
        r, a_next = block.line_refine(a, h, e, g.rbf_3b, g.angles(), g.kernels, last)
        return block.bonds_refined(e, r), a_next


class HaloLines(Lines):
    """A domain rank's angles by its bonds' ends, merged across ranks by the halo (in the module docstring's form)."""

    def attention(self, block, e, a, g):
        t, lse_t, s, lse_s, a_mid = block.line_attention(a, e, g.angles(), g.kernels, partial=True)
        return block.bonds_attended(e, *g.halo.line_softmax(t, lse_t, s, lse_s)), a_mid

    def refine(self, block, h, e, a, g, last):
        r, a_next = block.line_refine(a, h, e, g.rbf_3b, g.angles(), g.kernels, last)
        return block.bonds_refined(e, g.halo.line_sums(r)), a_next


class RowLines(Lines):
    """Inside training's block recomputation: each per-angle part is one node recomputed ``g.rows.chunk`` angles at a
    time in the backward passes (:func:`matris.model.recompute.recomputed`); the sums are its summed outputs."""

    def attention(self, block, e, a, g):
        n_angles, rows = a.shape[0], g.rows
        if not rows.splits(n_angles):  # one chunk: as the rest of the block
            return super().attention(block, e, a, g)
        shift = block.attn_block_line_graph.logit_max(a, g.angle_target_bond, g.angle_source_bond, g.n_bonds,
                                                      rows.chunk)
        # Φ_edge's first layer on the bonds once per step, not per chunk: the node's inputs are those terms
        p = block.attn_block_line_graph.line_projections(e, a.shape[1])
        out = recompute.recomputed(_Part(block, "attention"), _arguments(g, shift), [a, *p], rows.chunk,
                                   row_inputs=(True, False, False), n_rows=n_angles,
                                   row_outputs=(False, False, False, False, True))
        n_t, d_t, n_s, d_s, a_mid = out
        # a bond without angles has N = D = 0: its aggregates are 0, as the softmax's
        return block.bonds_attended(e, merge_softmax([(n_t, d_t, None)]), merge_softmax([(n_s, d_s, None)])), a_mid

    def refine(self, block, h, e, a, g, last):
        n_angles, rows = a.shape[0], g.rows
        if not rows.splits(n_angles):
            return super().refine(block, h, e, a, g, last)
        p = block.refine_block_line_graph.line_projections(e, h, g.rbf_3b, a.shape[1])
        out = recompute.recomputed(_Part(block, "refine"), _arguments(g, last), [a, *p], rows.chunk,
                                   row_inputs=(True, False, False, False, False), n_rows=n_angles,
                                   row_outputs=(False,) if last else (False, True))
        return block.bonds_refined(e, out[0]), (a if last else out[1])


def _arguments(g: BlockGraph, extra):
    """A recomputed :class:`_Part`'s ``arguments``: inputs, chunk of ``rows`` (None: all), bonds, ``extra``, kernels."""
    n_angles = g.angle_atom.shape[0]

    def arguments(inputs, use_fast, rows):
        k = g.rows.kernels if use_fast else REFERENCES
        return (*inputs, g.rows_of(rows or slice(0, n_angles)), g.n_bonds, extra, k), {}

    return arguments


class _Part(nn.Module):
    """A per-angle part on a chunk reduced into all bonds, as a module for :func:`matris.model.recompute.recomputed`:
    ``"attention"`` ``(a, p_t, p_s, angles, n_bonds, shift, k)`` → ``(N_t, D_t, N_s, D_s)`` ``[B, d_t]``, ``a_mid``;
    ``"refine"`` ``(a, p_h, p_t, p_s, q, angles, n_bonds, last, k)`` → ``R`` ``[B, d_t]`` (and ``a_next``); the ``p``:
    the atoms' and bonds' terms of Φ_edge's first layer, projected once per step (``line_projections``)."""

    def __init__(self, block: InteractionBlock, part: str):
        super().__init__()
        # the step's own parameters only (the gradients the node returns); the block is not a submodule
        self.step = block.attn_block_line_graph if part == "attention" else block.refine_block_line_graph
        object.__setattr__(self, "block", block)
        self.part = part

    def forward(self, *args):
        if self.part == "attention":
            a, p_t, p_s, angles, n_bonds, shift, k = args
            *sums, a_mid = self.block.line_attention(a, None, angles, k, shift=shift, projected=(p_t, p_s))
            return (*[angles.to_bonds(x, n_bonds) for x in sums], a_mid)
        a, p_h, p_t, p_s, q, angles, n_bonds, last, k = args
        r, a_next = self.block.line_refine(a, None, None, None, angles, k, last, projected=(p_h, p_t, p_s, q))
        return (angles.to_bonds(r, n_bonds),) if last else (angles.to_bonds(r, n_bonds), a_next)


def checkpointed_block(block: nn.Module, h: torch.Tensor, e: torch.Tensor, a: torch.Tensor, fast: BlockGraph,
                       exact: BlockGraph, last: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``block(h, e, a, graph, last)`` with activations recomputed in the backward (:mod:`matris.model.recompute`);
    ``fast``, ``exact``: the graph on the fast kernels / the references (and nested rows), with the bases it reads."""

    def arguments(inputs, use_fast, rows):
        h_, e_, a_, rbf_pair, rbf_3b = inputs
        g = dataclasses.replace(fast if use_fast else exact, rbf_pair=rbf_pair, rbf_3b=rbf_3b)
        return (h_, e_, a_, g), {"last": last}

    # nested rows: first order runs composed, its row nodes fast by chunk (all rows fast: 100s of MB at 64 atoms)
    rc = exact.rows
    nests = rc is not None and (rc.splits(exact.angle_atom.shape[0]) or rc.splits(exact.edge_target.shape[0]))
    return recompute.recomputed(block, arguments, [h, e, a, fast.rbf_pair, fast.rbf_3b], fast_first_order=not nests)
