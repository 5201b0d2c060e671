"""Separable attention (spec §5): a per-channel softmax over the edges of each node.

Each softmax runs over the edges that share a node, so the cost is linear in the number
of edges. Used on the atom graph (nodes = atoms, edges = directed edges) and on the line
graph (nodes = bonds, edges = angles).
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import Segments, attention_pair, softmax_aggregate_reference
from .layers import apply_phi, call_phi, phi


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
        rewrite: bool = True,
        recompute_phi: bool = False,
        segments: tuple[Segments, Segments] | None = None,
        fused: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``d2u`` (``[2B]``, directed edge → bond) marks the atom graph; None on the line graph.
        ``rewrite`` selects the projection rewrite of Φ_edge's first layer (same numbers);
        ``recompute_phi`` recomputes Φ_edge in the backward pass instead of storing it.
        ``fused`` selects the fused operators of Φ and of both aggregations (:mod:`matris.kernels`,
        CPU and CUDA); ``segments`` (by target, by source) is the CSR order the CUDA kernels walk,
        made once per graph."""
        n = x.shape[0]
        directed = d2u is not None
        if rewrite:
            m = call_phi(self.edge_nonlinear_update, [(y, d2u), (x, tgt), (x, src)], recompute_phi, fused)
        else:
            y0 = y.index_select(0, d2u) if directed else y
            m = apply_phi(self.edge_nonlinear_update,
                          torch.cat([y0, x.index_select(0, tgt), x.index_select(0, src)], dim=-1), fused)
        # the logits are linear in y0 = y[d2u]: project per bond, then copy to both directions
        w_st = torch.cat([self.source_weight_linear.weight, self.target_weight_linear.weight])
        if fused:
            if directed:
                t_agg, s_agg = attention_pair(y @ w_st.T, None, d2u, m, tgt, src, n, segments=segments)
                return self._update(x, y, m, t_agg, s_agg, directed, fused)
            # the edges' residual update y' = m + w ⊙ y in the same pass over the angle rows
            t_agg, s_agg, y_new = attention_pair(y, w_st, None, m, tgt, src, n, res_weight=self.edge_res_weight,
                                                 segments=segments)
            return self._node_update(x, t_agg, s_agg, fused), y_new
        alpha = y @ w_st.T
        if directed:
            alpha = alpha.index_select(0, d2u)
        alpha_s, alpha_t = alpha.split(y.shape[-1], dim=-1)
        t_agg = softmax_aggregate_reference(alpha_t, m, tgt, n)
        s_agg = softmax_aggregate_reference(alpha_s, m, src, n)
        return self._update(x, y, m, t_agg, s_agg, directed, fused)

    def _update(self, x, y, m, t_agg, s_agg, directed, fused):
        y_new = torch.addcmul(pool_directed(m) if directed else m, self.edge_res_weight, y)
        return self._node_update(x, t_agg, s_agg, fused), y_new

    def _node_update(self, x, t_agg, s_agg, fused):
        # x' = Φ(...) + w ⊙ x as one op (addcmul): one pass and one allocation, not two
        return torch.addcmul(apply_phi(self.node_nonlinear_update, torch.cat([x, t_agg, s_agg], dim=-1), fused),
                             self.node_res_weight, x)
