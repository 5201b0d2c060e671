"""Separable attention (spec §5): a per-channel softmax over the edges of each node.

Each softmax runs over the edges that share a node, so the cost is linear in the number
of edges. Used on the atom graph (nodes = atoms, edges = directed edges) and on the line
graph (nodes = bonds, edges = angles).
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import (
    Segments,
    attention_pair,
    attention_pair_lse,
    merge_softmax,
    scatter_sum,
)
from . import recompute
from .layers import RowRecompute, call_phi, phi, project_terms


def pool_directed(m: torch.Tensor) -> torch.Tensor:
    """``[2B, d]`` → ``[B, d]``: the mean of the two directed copies of each bond."""
    n_b = m.shape[0] // 2
    return (m[:n_b] + m[n_b:]) / 2


class SeparableAttention(nn.Module):
    """``(x, y) → (x', y')`` for node features x ``[n_nodes, d_x]`` and edge features y.

    On the atom graph (``directed=True``) y holds one row per bond ``[B, d_y]`` and edge rows
    are the ``2B`` directed edges (``y0 = y[d2u]``); on the line graph y is ``[A, d_y]``.
    """

    def __init__(self, config, d_x: int, d_y: int, d_hidden: int):
        super().__init__()
        self.node_res_weight = nn.Parameter(torch.ones(1, d_x))
        self.edge_res_weight = nn.Parameter(torch.ones(1, d_y))
        self.source_weight_linear = nn.Linear(d_y, d_y, bias=False)
        self.target_weight_linear = nn.Linear(d_y, d_y, bias=False)
        self.edge_nonlinear_update = phi(config, d_y + 2 * d_x, d_hidden, d_y)
        self.node_nonlinear_update = phi(config, d_x + 2 * d_y, d_hidden, d_x)

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        tgt: torch.Tensor,
        src: torch.Tensor,
        d2u: torch.Tensor | None = None,
        rows: RowRecompute | None = None,
        segments: tuple[Segments, Segments] | None = None,
        fused: bool = False,
        halo=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``d2u`` (``[2B]``, directed edge → bond) marks the atom graph; None on the line graph.
        ``rows``: the per-row work recomputed by row chunks in the backward passes (:class:`RowRecompute`).
        ``fused`` selects the fused operators of Φ and of both aggregations (:mod:`matris.kernels`,
        CPU and CUDA); ``segments`` (by target, by source) is the CSR order the CUDA kernels walk,
        made once per graph. ``halo`` (line graph, :class:`matris.model.block.BlockGraph`): a domain
        decomposition's rank, whose bonds' softmax runs per end and is merged across ranks."""
        n = x.shape[0]
        directed = d2u is not None
        if rows is not None and not directed:
            if rows.splits(y.shape[0]):
                return self._line_by_rows(x, y, tgt, src, rows)
            rows = None  # one chunk: as the rest of the block
        m = call_phi(self.edge_nonlinear_update, [(y, d2u), (x, tgt), (x, src)], rows, fused)
        w_st = self._logit_weight()
        if halo is not None:
            t, s, y_new, lse_t, lse_s = attention_pair_lse(y, w_st, None, m, halo.angle_target_end,
                                                           halo.angle_source_end, halo.n_ends,
                                                           res_weight=self.edge_res_weight, fused=fused)
            return self._node_update(x, *halo.line_softmax(t, lse_t, s, lse_s)), y_new
        if directed:
            # the logits are linear in y0 = y[d2u]: projected per bond, read per directed edge
            t_agg, s_agg = attention_pair(y @ w_st.T, None, d2u, m, tgt, src, n, segments=segments, fused=fused)
            y_new = torch.addcmul(pool_directed(m), self.edge_res_weight, y)
            return self._node_update(x, t_agg, s_agg), y_new
        # the edges' residual update y' = m + w ⊙ y in the same pass over the angle rows
        t_agg, s_agg, y_new = attention_pair(y, w_st, None, m, tgt, src, n, res_weight=self.edge_res_weight,
                                             segments=segments, fused=fused)
        return self._node_update(x, t_agg, s_agg), y_new

    def _line_by_rows(self, x, y, tgt, src, rows: RowRecompute):
        """The line-graph step inside training's block recomputation: everything per angle (Φ_edge,
        the logits, the softmax weights and their sums into bonds, the angles' residual update) is
        one node recomputed ``rows.chunk`` angles at a time in the backward passes
        (:func:`matris.model.recompute.recomputed`), so only one chunk of angle rows is alive.
        The softmax is split into its sums, ``t_agg = N/D`` with ``N = Σ w·m``, ``D = Σ w`` and
        ``w = exp(α − s)``: ``s`` (each bond's largest logit, per channel) is a constant that
        cancels in N/D, so the sums are row-wise and the gradients exact."""
        n, d = x.shape[0], y.shape[-1]
        with torch.no_grad():  # by chunks too: the logits of all angles at once would be [A, 2·d_y]
            w_st = self._logit_weight()
            shift = [y.new_full((n, d), float("-inf")) for _ in range(2)]
            for lo in range(0, y.shape[0], rows.chunk):
                alpha = y[lo : lo + rows.chunk] @ w_st.T
                for s, k, index in ((shift[0], 1, tgt), (shift[1], 0, src)):
                    idx = index[lo : lo + rows.chunk].unsqueeze(1).expand(-1, d)
                    s.scatter_reduce_(0, idx, alpha[:, k * d : (k + 1) * d], "amax", include_self=True)
            shift = [s.nan_to_num_(neginf=0.0) for s in shift]  # a bond without angles: 0, as segment_max
        # Φ_edge's first layer on the bonds, once (not per chunk): [n, 2·d_hidden] per term
        (p_t, _), (p_s, _) = project_terms(self.edge_nonlinear_update, [(x, tgt), (x, src)], d)

        def arguments(inputs, use_fast, cut):
            t, s = (tgt, src) if cut is None else (tgt[cut], src[cut])
            return (*inputs, t, s, *shift, n), {"fused": use_fast and rows.fast}

        n_t, d_t, n_s, d_s, y_new = recompute.recomputed(_AttentionRows(self), arguments, [y, p_t, p_s], rows.chunk,
                                               row_inputs=(True, False, False), n_rows=y.shape[0],
                                               row_outputs=(False, False, False, False, True))
        # a bond without angles has N = D = 0: its sums are 0, as the softmax's
        t_agg, s_agg = merge_softmax([(n_t, d_t, None)]), merge_softmax([(n_s, d_s, None)])
        return self._node_update(x, t_agg, s_agg), y_new

    def _logit_weight(self) -> torch.Tensor:
        """``[2·d_y, d_y]``: the source and target logit projections, stacked."""
        return torch.cat([self.source_weight_linear.weight, self.target_weight_linear.weight])

    def _node_update(self, x, t_agg, s_agg):
        # x' = Φ(...) + w ⊙ x as one op (addcmul): one pass and one allocation, not two
        return torch.addcmul(self.node_nonlinear_update(torch.cat([x, t_agg, s_agg], dim=-1)), self.node_res_weight, x)


class _AttentionRows(nn.Module):
    """The per-angle part of a line-graph attention step, row-wise in the angles ``y`` (see
    :meth:`SeparableAttention._line_by_rows`): ``(y [A, d_y], p_t, p_s [B, 2·d_hidden]) → (N_t, D_t,
    N_s, D_s)`` ``[B, d_y]`` (sums over the rows) and ``y' = m + w ⊙ y`` ``[A, d_y]``; ``p_t``,
    ``p_s``: the bonds' projections by Φ_edge's first layer (:func:`matris.model.layers.project_terms`),
    gathered at ``tgt`` and ``src``."""

    def __init__(self, attention: SeparableAttention):
        super().__init__()
        self.attention = attention

    def forward(self, y, p_t, p_s, tgt, src, shift_t, shift_s, n: int, fused: bool = False):
        att = self.attention
        m = att.edge_nonlinear_update.forward_terms([(y, None)], fused, [(p_t, tgt), (p_s, src)])
        alpha_s, alpha_t = (y @ att._logit_weight().T).split(y.shape[-1], dim=-1)
        sums = []
        for alpha, shift, index in ((alpha_t, shift_t, tgt), (alpha_s, shift_s, src)):
            w = torch.exp(alpha - shift.index_select(0, index))
            sums += [scatter_sum(w * m, index, n), scatter_sum(w, index, n)]
        return (*sums, torch.addcmul(m, att.edge_res_weight, y))
