"""Refine (spec §5): messages smoothed by a learned envelope of the radial basis, summed per node."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import references, refine_edges, scatter_sum
from . import recompute
from .attention import call_phi, phi, pool_directed, project_terms
from .layers import ffn
from .recompute import RowRecompute


class Refine(nn.Module):
    """``(x, y) → (x', y')`` with ``u = Φ(z)``, ``u_g = u ⊙ g``, ``R[n] = Σ_{tgt=n} u_g``.

    ``d_extra`` is the width of the atom features concatenated on the line graph
    (``z = [y0 ‖ h[c] ‖ x[tgt] ‖ x[src]]``); 0 on the atom graph. ``num_basis`` is the
    width of the radial basis that ``W_env`` (``learnable_envelope``) maps to ``d_y``.
    """

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

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        tgt: torch.Tensor,
        src: torch.Tensor,
        basis: torch.Tensor,
        extra: tuple[torch.Tensor, torch.Tensor] | None = None,
        d2u: torch.Tensor | None = None,
        rows: RowRecompute | None = None,
        update_edges: bool = True,
        halo=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """basis: ``[B, K]`` radial basis per bond. On the atom graph (``d2u`` given)
        g = W_env·basis[d2u]; on the line graph q = W_env·basis and g = q[src] ⊙ q[tgt].
        extra: ``(h, angle_atom)``, the atom term of the line graph. ``rows``: the per-row work
        recomputed by row chunks in the backward passes (:class:`RowRecompute`); the line graph's edge
        side is one operator (:func:`matris.kernels.refine_edges`). ``update_edges=False`` returns ``y`` unchanged
        without computing FFN_edge: the last block's edge update reaches no output. ``halo`` (line
        graph, :class:`matris.model.block.BlockGraph`): a domain decomposition's rank, whose bonds' sums
        run per end and are merged across ranks."""
        directed = d2u is not None
        if rows is not None and not directed:
            if rows.splits(y.shape[0]):
                return self._line_by_rows(x, y, tgt, src, basis, extra, update_edges, rows)
            rows = None  # one chunk: as the rest of the block
        q = self.learnable_envelope(basis)
        terms = [(y, d2u)] + ([extra] if extra is not None else []) + [(x, tgt), (x, src)]
        u = call_phi(self.edge_nonlinear_update, terms, rows)
        if not directed and not (self.training and self.edge_FFN.layers[2].p > 0):  # the line graph's edge side: one op
            n = x.shape[0]
            if halo is not None:  # the sums per end of each bond, merged across ranks
                q, src, tgt = q.index_select(0, halo.end_bond), halo.angle_source_end, halo.angle_target_end
                n = halo.n_ends
            out = refine_edges(u, q, src, tgt, n, *self.edge_update(y, update_edges))
            agg, y_new = out if update_edges else (out, y)
            if halo is not None:
                agg = halo.line_sums(agg)
            return self.node_update(x, agg), y_new
        u_g = u * (q.index_select(0, d2u) if directed else q.index_select(0, src) * q.index_select(0, tgt))
        x_new = self.node_update(x, scatter_sum(u_g, tgt, x.shape[0]))
        if not update_edges:
            return x_new, y
        delta = self.edge_FFN(u_g if self.smooth_delta_edge else u)
        return x_new, torch.addcmul(pool_directed(delta) if directed else delta, self.edge_res_weight, y)

    def edge_update(self, y: torch.Tensor, update_edges: bool) -> tuple:
        """The edge-update arguments of :func:`matris.kernels.refine_edges` (none: R alone)."""
        ffn = self.edge_FFN.layers
        return (y, self.edge_res_weight, ffn[0].weight, ffn[0].bias, ffn[3].weight, ffn[3].bias,
                self.smooth_delta_edge) if update_edges else ()

    def _line_by_rows(self, x, y, tgt, src, basis, extra, update_edges: bool, rows: RowRecompute):
        """The line-graph step inside training's block recomputation: everything per angle (Φ, the
        envelope, the sum into bonds, FFN_edge and the residual) is one node recomputed
        ``rows.chunk`` angles at a time in the backward passes (:func:`matris.model.recompute.recomputed`),
        so only one chunk of angle rows is alive; the bonds' FFN_node runs on the sums."""
        h, atom = extra
        n = x.shape[0]
        p_h, p_t, p_s, q = self.line_projections(x, tgt, src, h, atom, basis, y.shape[-1])

        def arguments(inputs, use_fast, cut):
            idx = (tgt, src, atom) if cut is None else (tgt[cut], src[cut], atom[cut])
            return (*inputs, *idx, n), {"reference": not (use_fast and rows.fast), "update_edges": update_edges}

        out = recompute.recomputed(_RefineRows(self), arguments, [y, p_h, p_t, p_s, q], rows.chunk,
                         row_inputs=(True, False, False, False, False), n_rows=y.shape[0],
                         row_outputs=(False, True) if update_edges else (False,))
        return self.node_update(x, out[0]), (out[1] if update_edges else y)

    def line_projections(self, x, tgt, src, h, atom, basis, col: int):
        """Φ's first layer on the atoms ``h`` and bonds ``x`` (gathered at ``atom``, ``tgt``, ``src``;
        from column ``col``) and the envelope ``q = W_env·basis``, once per step rather than per chunk
        of angles: ``(p_h [N, 2·d_hidden], p_t, p_s [B, 2·d_hidden], q [B, d_y])``."""
        (p_h, _), (p_t, _), (p_s, _) = project_terms(self.edge_nonlinear_update, [(h, atom), (x, tgt), (x, src)], col)
        return p_h, p_t, p_s, self.learnable_envelope(basis)

    def empty_update(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`node_update` of nodes that no edge touches (``R = 0``): a bond without angles."""
        return self.node_update(x, x.new_zeros(x.shape[0], self.edge_res_weight.shape[1]))

    def node_update(self, x: torch.Tensor, agg: torch.Tensor) -> torch.Tensor:
        """``x' = FFN_node(R) + w ⊙ x`` from the nodes' sums ``R`` (one addcmul)."""
        return torch.addcmul(self.node_FFN(agg), self.node_res_weight, x)


class _RefineRows(nn.Module):
    """The per-angle part of a line-graph Refine, row-wise in the angles ``y`` (see
    :meth:`Refine._line_by_rows`): ``(y [A, d_y], p_h [N, 2·d_hidden], p_t, p_s [B, 2·d_hidden],
    q [B, d_y])`` → ``R = Σ_{tgt} u ⊙ g`` ``[B, d_y]`` (a sum over the rows) and, ``update_edges``,
    ``y'`` ``[A, d_y]``; ``p_*``: the atoms' and bonds' projections by Φ's first layer
    (:func:`matris.model.attention.project_terms`), gathered at ``atom``, ``tgt`` and ``src``; ``q``:
    the bonds' envelope ``W_env·basis``; ``reference``: as :class:`matris.model.attention._AttentionRows`."""

    def __init__(self, refine: Refine):
        super().__init__()
        self.refine = refine

    def forward(self, y, p_h, p_t, p_s, q, tgt, src, atom, n: int, reference: bool = False,
                update_edges: bool = True):
        r = self.refine
        with references(reference):
            u = r.edge_nonlinear_update.forward_terms([(y, None)], [(p_h, atom), (p_t, tgt), (p_s, src)])
            out = refine_edges(u, q, src, tgt, n, *r.edge_update(y, update_edges))
        return tuple(out) if update_edges else (out,)
