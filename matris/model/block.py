"""One interaction block (spec §5): line-graph attention, atom-graph attention, then Refine."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from ..kernels import references
from . import recompute
from .attention import SeparableAttention
from .config import MatRISConfig
from .recompute import RowRecompute
from .refine import Refine


@dataclass
class BlockGraph:
    """Indices and bases that every block reads, computed once per forward pass.

    edge_target, edge_source: ``[2B]`` atoms of each directed edge; edge_bond: ``[2B]`` d2u.
    angle_atom, angle_target_bond, angle_source_bond: ``[A]``.
    rbf_pair, rbf_3b: ``[B, K]`` radial bases of the bonds.
    checkpoint: 1 recomputes each of the four steps in the backward pass (inference memory level 1,
    same numbers); 0 keeps their activations.
    kernels: :func:`matris.kernels.choose`'s choice: ``"torch"`` runs each step inside
    :func:`matris.kernels.references`, else the operators' kernels (C++ on a CPU, Triton on CUDA).
    atom_segments, line_segments: (by target, by source) :class:`matris.kernels.Segments`, the
    CSR order the CUDA kernels walk (made once per graph); None on a CPU.
    row_chunks: training's block recomputation (:mod:`matris.model.recompute`) recomputes, inside
    it, the per-angle work of each line-graph step and the atom graph's Φ by row chunks (None:
    as the rest of the block).
    halo: a domain decomposition's rank (:class:`matris.domain.evaluate.RankHalo`; None for a whole
    system), called where a block reads what other ranks hold: its ``line_softmax`` and ``line_sums``
    merge the line graph's per-end results (``angle_target_end``, ``angle_source_end`` ``[A]`` number
    the angles' ends, ``n_ends`` of them, ``end_bond`` their bonds) into the bonds', its ``atoms``
    refreshes the ghost atoms' features after the atom-graph steps; ``has_angles`` is global.
    """

    edge_target: torch.Tensor
    edge_source: torch.Tensor
    edge_bond: torch.Tensor
    angle_atom: torch.Tensor
    angle_target_bond: torch.Tensor
    angle_source_bond: torch.Tensor
    rbf_pair: torch.Tensor
    rbf_3b: torch.Tensor
    checkpoint: int = 0
    kernels: str = "torch"
    atom_segments: tuple | None = None
    line_segments: tuple | None = None
    row_chunks: RowRecompute | None = None
    halo: object | None = None

    @property
    def has_angles(self) -> bool:
        return self.halo.has_angles if self.halo is not None else self.angle_atom.shape[0] > 0


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
        """``last``: the model's last block, whose Refine steps skip FFN_edge (their bond and angle
        updates reach no output; ``e`` and ``a`` come back as the attention left them)."""
        step = functools.partial(_step, g)
        # a bond without angles (a dimer, or a whole batch without any) takes the line-graph steps'
        # update of empty sums, as in the official MatRIS 1.0: the same alone and in any batch
        if g.has_angles:
            e, a = step(self.attn_block_line_graph, "line", e, a, g.angle_target_bond, g.angle_source_bond)
        else:
            e = call_with(g.kernels == "torch", self.attn_block_line_graph.empty_update, e)
        h, e = step(self.attn_block_atom_graph, "atom", h, e, g.edge_target, g.edge_source, d2u=g.edge_bond)
        if g.halo is not None:
            h = g.halo.atoms(h, "atom_attention")
        if g.has_angles:
            e, a = step(self.refine_block_line_graph, "line", e, a, g.angle_target_bond, g.angle_source_bond,
                        g.rbf_3b, extra=(h, g.angle_atom), update_edges=not last)
        else:
            e = call_with(g.kernels == "torch", self.refine_block_line_graph.empty_update, e)
        h, e = step(self.refine_block_atom_graph, "atom", h, e, g.edge_target, g.edge_source, g.rbf_pair,
                    d2u=g.edge_bond, update_edges=not last)
        if g.halo is not None and not last:
            h = g.halo.atoms(h, "atom_refine")
        return h, e, a


def _step(g: BlockGraph, module: nn.Module, kind: str, *args, **kwargs):
    """One step of a block (attention or Refine, on the ``"line"`` or ``"atom"`` graph) with the
    graph's kernels and memory setting."""
    kwargs["rows"] = g.row_chunks
    if isinstance(module, SeparableAttention):  # the CUDA kernels' CSR segments
        kwargs["segments"] = g.line_segments if kind == "line" else g.atom_segments
    if kind == "line" and g.halo is not None:
        kwargs["halo"] = g.halo
    reference = g.kernels == "torch"
    if g.checkpoint:  # the recomputation in the backward pass enters the same choice
        return torch.utils.checkpoint.checkpoint(call_with, reference, module, *args, use_reentrant=False, **kwargs)
    return call_with(reference, module, *args, **kwargs)


def call_with(reference: bool, module: nn.Module, *args, **kwargs):
    """``module(*args, **kwargs)`` on the operators' references (``reference``) or their kernels."""
    with references(reference):
        return module(*args, **kwargs)


def checkpointed_block(block: nn.Module, h: torch.Tensor, e: torch.Tensor, a: torch.Tensor, fast: BlockGraph,
                       exact: BlockGraph, last: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``block(h, e, a, graph, last)`` with its activations recomputed in the backward passes (see
    the module docstring). ``fast`` and ``exact``: the same graph with the call's fast kernels and
    with the composed ops (and the nested row recomputations); their ``rbf_pair`` and ``rbf_3b`` are
    the bases the block reads."""

    def arguments(inputs, use_fast, rows):
        h_, e_, a_, rbf_pair, rbf_3b = inputs
        g = dataclasses.replace(fast if use_fast else exact, rbf_pair=rbf_pair, rbf_3b=rbf_3b)
        return (h_, e_, a_, g), {"last": last}

    # where rows nest (the rows mode, rows that make several chunks) the first-order pass runs the
    # composed call, whose nested row nodes run theirs fast chunk by chunk: a whole block's rows
    # on the fast kernels would hold hundreds of MB per block of a 64-atom cell
    rc = exact.row_chunks
    nests = rc is not None and (rc.splits(exact.angle_atom.shape[0]) or rc.splits(exact.edge_target.shape[0]))
    return recompute.recomputed(block, arguments, [h, e, a, fast.rbf_pair, fast.rbf_3b], fast_first_order=not nests)
