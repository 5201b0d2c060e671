"""Refine (spec §5): messages smoothed by a learned envelope of the radial basis, summed per node."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import Kernels, refine_edges, scatter_sum
from .attention import call_phi, phi, pool_directed, project_terms
from .layers import ffn
from .recompute import RowRecompute


class Refine(nn.Module):
    """``(x, y) → (x', y')`` with ``u = Φ(z)``, ``u_g = u ⊙ g``, ``R[n] = Σ_{tgt=n} u_g``. ``d_extra``: the width of
    the atom features concatenated on the line graph (``z = [y0 ‖ h[c] ‖ x[tgt] ‖ x[src]]``), 0 on the atom graph;
    ``num_basis``: the radial basis width that ``W_env`` (``learnable_envelope``) maps to ``d_y``."""

    def __init__(self, config, d_x: int, d_y: int, d_hidden: int, num_basis: int, d_extra: int = 0,
                 smooth_delta_edge: bool = False):
        super().__init__()
        self.smooth_delta_edge = smooth_delta_edge
        self.node_res_weight = nn.Parameter(torch.ones(1, d_x))
        self.edge_res_weight = nn.Parameter(torch.ones(1, d_y))
        self.edge_nonlinear_update = phi(config, d_y + d_extra + 2 * d_x, d_hidden, d_y)
        self.node_FFN = ffn(d_y, d_x, config.use_bias, config.dropout)
        self.edge_FFN = ffn(d_y, d_y, config.use_bias, config.dropout)
        self.learnable_envelope = nn.Linear(num_basis, d_y, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor, tgt: torch.Tensor, src: torch.Tensor, basis: torch.Tensor,
                d2u: torch.Tensor, k: Kernels, rows: RowRecompute | None = None, update_edges: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Atom-graph step: bonds ``y`` ``[B, d_y]``, basis ``basis`` ``[B, K]`` (g = W_env·basis[d2u]), the rest as in
        :meth:`matris.model.attention.SeparableAttention.forward`; ``update_edges=False``: ``y`` kept (last block)."""
        u = call_phi(self.edge_nonlinear_update, [(y, d2u), (x, tgt), (x, src)], rows, k.fused)
        u_g = u * self.learnable_envelope(basis).index_select(0, d2u)
        x_new = self.node_update(x, scatter_sum(u_g, tgt, x.shape[0]))
        if not update_edges:
            return x_new, y
        delta = self.edge_FFN(u_g if self.smooth_delta_edge else u)
        return x_new, torch.addcmul(pool_directed(delta), self.edge_res_weight, y)

    def line_part(self, y: torch.Tensor, x: torch.Tensor | None, h: torch.Tensor | None, basis: torch.Tensor | None,
                  angles, k: Kernels, update_edges: bool = True, projected=None):
        """Line-graph per-angle part on angles ``y`` ``[a, d_y]`` with their bonds' ``x`` and ``basis`` ``[n, ·]`` and
        atoms' ``h`` (``angles``: :class:`matris.model.block.Angles`): bonds' sums ``R = Σ_{tgt} u ⊙ q[src] ⊙ q[tgt]``
        ``[n, d_y]`` (``q = W_env·basis``) and the angles' update ``y'`` (``y`` if not ``update_edges``). One operator,
        :func:`matris.kernels.refine_edges`, unless FFN_edge's dropout is active (training): then the composed ops.
        ``projected`` ``(p_h, p_t, p_s, q)``: the atoms' and bonds' terms and ``q`` in place of ``h``, ``x``, ``basis``
        (:meth:`line_projections`)."""
        if projected is None:
            q = self.learnable_envelope(basis)
            terms = [(y, None), (h, angles.atom), (x, angles.tgt), (x, angles.src)]
            u = self.edge_nonlinear_update.forward_terms(terms, fused=k.fused)
        else:
            *p, q = projected
            gathered = list(zip(p, (angles.atom, angles.tgt, angles.src)))
            u = self.edge_nonlinear_update.forward_terms([(y, None)], gathered, fused=k.fused)
        if not (self.training and self.edge_FFN.layers[2].p > 0):
            out = refine_edges(u, q, angles.src, angles.tgt, angles.n, *self.edge_update(y, update_edges),
                               fused=k.fused)
            return out if update_edges else (out, y)
        u_g = u * q.index_select(0, angles.src) * q.index_select(0, angles.tgt)
        agg = scatter_sum(u_g, angles.tgt, angles.n)
        if not update_edges:
            return agg, y
        return agg, torch.addcmul(self.edge_FFN(u_g if self.smooth_delta_edge else u), self.edge_res_weight, y)

    def line_projections(self, x: torch.Tensor, h: torch.Tensor, basis: torch.Tensor, col: int) -> list:
        """``(p_h, p_t, p_s, q)``: Φ_edge's first layer on the atoms ``h`` and bonds ``x`` (``col``: the angles' width)
        and ``q = W_env·basis`` ``[B, d_y]``, once per step rather than per chunk (``line_part(projected=)``)."""
        terms = project_terms(self.edge_nonlinear_update, [(h, None), (x, None), (x, None)], col)
        return [p for p, _ in terms] + [self.learnable_envelope(basis)]

    def edge_update(self, y: torch.Tensor, update_edges: bool) -> tuple:
        """The edge-update arguments of :func:`matris.kernels.refine_edges` (none: R alone)."""
        ffn = self.edge_FFN.layers
        return (y, self.edge_res_weight, ffn[0].weight, ffn[0].bias, ffn[3].weight, ffn[3].bias,
                self.smooth_delta_edge) if update_edges else ()

    def empty_update(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`node_update` of nodes that no edge touches (``R = 0``): a bond without angles."""
        return self.node_update(x, x.new_zeros(x.shape[0], self.edge_res_weight.shape[1]))

    def node_update(self, x: torch.Tensor, agg: torch.Tensor) -> torch.Tensor:
        """``x' = FFN_node(R) + w ⊙ x`` from the nodes' sums ``R`` (one addcmul)."""
        return torch.addcmul(self.node_FFN(agg), self.node_res_weight, x)
