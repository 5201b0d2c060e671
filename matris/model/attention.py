"""Separable attention (spec §5): a per-channel softmax over the edges of each node.

Each softmax runs over the edges that share a node, so the cost is linear in the number
of edges. Used on the atom graph (nodes = atoms, edges = directed edges) and on the line
graph (nodes = bonds, edges = angles).

Φ, the gated MLP of the attention's and of Refine's updates, is here too. Its first Linear acts on
a concatenation ``[y0 ‖ x[tgt] ‖ x[src]]``; ``forward_terms`` computes it as ``W_y·y0 + (W_t·x)[tgt]
+ (W_s·x)[src]``: the node terms are projected once per node and gathered per edge, so the wide
concatenation is never built (3–4× fewer multiply-adds in the first layer, and nothing edge-sized
saved for its backward).
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import (
    Segments,
    attention_pair,
    attention_pair_lse,
    gated_phi,
    gather_sum_activate_reference,
    merge_softmax,
    references,
    scatter_sum,
)
from . import recompute
from .layers import MLP, norm
from .recompute import RowRecompute


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
        halo=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``d2u`` (``[2B]``, directed edge → bond) marks the atom graph; None on the line graph.
        ``rows``: the per-row work recomputed by row chunks in the backward passes (:class:`RowRecompute`).
        ``segments`` (by target, by source) is the CSR order the CUDA kernels walk, made once per
        graph. ``halo`` (line graph, :class:`matris.model.block.BlockGraph`): a domain
        decomposition's rank, whose bonds' softmax runs per end and is merged across ranks."""
        n = x.shape[0]
        directed = d2u is not None
        if rows is not None and not directed:
            if rows.splits(y.shape[0]):
                return self._line_by_rows(x, y, tgt, src, rows)
            rows = None  # one chunk: as the rest of the block
        m = call_phi(self.edge_nonlinear_update, [(y, d2u), (x, tgt), (x, src)], rows)
        w_st = self._logit_weight()
        if halo is not None:
            t, s, y_new, lse_t, lse_s = attention_pair_lse(y, w_st, None, m, halo.angle_target_end,
                                                           halo.angle_source_end, halo.n_ends,
                                                           res_weight=self.edge_res_weight)
            return self.node_update(x, *halo.line_softmax(t, lse_t, s, lse_s)), y_new
        if directed:
            # the logits are linear in y0 = y[d2u]: projected per bond, read per directed edge
            t_agg, s_agg = attention_pair(y @ w_st.T, None, d2u, m, tgt, src, n, segments=segments)
            y_new = torch.addcmul(pool_directed(m), self.edge_res_weight, y)
            return self.node_update(x, t_agg, s_agg), y_new
        # the edges' residual update y' = m + w ⊙ y in the same pass over the angle rows
        t_agg, s_agg, y_new = attention_pair(y, w_st, None, m, tgt, src, n, res_weight=self.edge_res_weight,
                                             segments=segments)
        return self.node_update(x, t_agg, s_agg), y_new

    def _line_by_rows(self, x, y, tgt, src, rows: RowRecompute):
        """The line-graph step inside training's block recomputation: everything per angle (Φ_edge,
        the logits, the softmax weights and their sums into bonds, the angles' residual update) is
        one node recomputed ``rows.chunk`` angles at a time in the backward passes
        (:func:`matris.model.recompute.recomputed`), so only one chunk of angle rows is alive.
        The softmax is split into its sums, ``t_agg = N/D`` with ``N = Σ w·m``, ``D = Σ w`` and
        ``w = exp(α − s)``: ``s`` (each bond's largest logit, per channel) is a constant that
        cancels in N/D, so the sums are row-wise and the gradients exact."""
        n = x.shape[0]
        shift = self.bond_shift(y, tgt, src, n, rows.chunk)
        p_t, p_s = self.line_projections(x, tgt, src, y.shape[-1])

        def arguments(inputs, use_fast, cut):
            t, s = (tgt, src) if cut is None else (tgt[cut], src[cut])
            return (*inputs, t, s, *shift, n), {"reference": not (use_fast and rows.fast)}

        n_t, d_t, n_s, d_s, y_new = recompute.recomputed(_AttentionRows(self), arguments, [y, p_t, p_s], rows.chunk,
                                               row_inputs=(True, False, False), n_rows=y.shape[0],
                                               row_outputs=(False, False, False, False, True))
        # a bond without angles has N = D = 0: its sums are 0, as the softmax's
        return self.node_update(x, merge_softmax([(n_t, d_t, None)]), merge_softmax([(n_s, d_s, None)])), y_new

    def line_projections(self, x: torch.Tensor, tgt: torch.Tensor, src: torch.Tensor, col: int):
        """Φ_edge's first layer on the bonds ``x`` (their terms gathered at ``tgt`` and ``src``, from
        column ``col``), once per step rather than per chunk of angles: ``(p_t, p_s)`` ``[B, 2·d_hidden]``."""
        (p_t, _), (p_s, _) = project_terms(self.edge_nonlinear_update, [(x, tgt), (x, src)], col)
        return p_t, p_s

    def line_partial(self, y, p_t, p_s, tgt, src, n: int, sums: bool = True):
        """The line-graph step on a part of the angles ``y`` ``[a, d_y]`` (a chunk of rows), given the
        bonds' projections ``p_t``, ``p_s`` (:meth:`line_projections`): each bond's partial softmax
        over these angles, ``(T, lse_t, S, lse_s)`` ``[n, d_y]`` (0 for a bond without angles here;
        :func:`matris.kernels.merge_softmax` combines parts), and the angles' update ``y' = m + w ⊙ y``.
        ``sums`` False: ``(y',)`` alone."""
        m = self.edge_nonlinear_update.forward_terms([(y, None)], [(p_t, tgt), (p_s, src)])
        if not sums:
            return (torch.addcmul(m, self.edge_res_weight, y),)
        t, s, y_new, lse_t, lse_s = attention_pair_lse(y, self._logit_weight(), None, m, tgt, src, n,
                                                       res_weight=self.edge_res_weight)
        return t, lse_t, s, lse_s, y_new

    @torch.no_grad()
    def bond_shift(self, y: torch.Tensor, tgt: torch.Tensor, src: torch.Tensor, n: int, chunk: int):
        """Each bond's largest logit per channel over its angles ``y`` (target side, source side;
        0 for a bond without angles): the softmax's constant shift, by chunks of angles (the logits
        of all angles at once would be ``[A, 2·d_y]``)."""
        d = y.shape[-1]
        w_st = self._logit_weight()
        shift = [y.new_full((n, d), float("-inf")) for _ in range(2)]
        for lo in range(0, y.shape[0], chunk):
            alpha = y[lo : lo + chunk] @ w_st.T
            for s, k, index in ((shift[0], 1, tgt), (shift[1], 0, src)):
                idx = index[lo : lo + chunk].unsqueeze(1).expand(-1, d)
                s.scatter_reduce_(0, idx, alpha[:, k * d : (k + 1) * d], "amax", include_self=True)
        return [s.nan_to_num_(neginf=0.0) for s in shift]  # a bond without angles: 0, as segment_max

    def _logit_weight(self) -> torch.Tensor:
        """``[2·d_y, d_y]``: the source and target logit projections, stacked."""
        return torch.cat([self.source_weight_linear.weight, self.target_weight_linear.weight])

    def empty_update(self, x):
        """:meth:`node_update` of nodes that no edge touches (both sums zero): a bond without angles."""
        zero = x.new_zeros(x.shape[0], self.edge_res_weight.shape[1])
        return self.node_update(x, zero, zero)

    def node_update(self, x, t_agg, s_agg):
        # x' = Φ(...) + w ⊙ x as one op (addcmul): one pass and one allocation, not two
        return torch.addcmul(self.node_nonlinear_update(torch.cat([x, t_agg, s_agg], dim=-1)), self.node_res_weight, x)


class _AttentionRows(nn.Module):
    """The per-angle part of a line-graph attention step, row-wise in the angles ``y`` (see
    :meth:`SeparableAttention._line_by_rows`): ``(y [A, d_y], p_t, p_s [B, 2·d_hidden]) → (N_t, D_t,
    N_s, D_s)`` ``[B, d_y]`` (sums over the rows) and ``y' = m + w ⊙ y`` ``[A, d_y]``; ``p_t``,
    ``p_s``: the bonds' projections by Φ_edge's first layer (:func:`matris.model.attention.project_terms`),
    gathered at ``tgt`` and ``src``; ``reference``: the references (a recomputation's composed call)."""

    def __init__(self, attention: SeparableAttention):
        super().__init__()
        self.attention = attention

    def forward(self, y, p_t, p_s, tgt, src, shift_t, shift_s, n: int, reference: bool = False):
        att = self.attention
        with references(reference):
            m = att.edge_nonlinear_update.forward_terms([(y, None)], [(p_t, tgt), (p_s, src)])
        alpha_s, alpha_t = (y @ att._logit_weight().T).split(y.shape[-1], dim=-1)
        sums = []
        for alpha, shift, index in ((alpha_t, shift_t, tgt), (alpha_s, shift_s, src)):
            w = torch.exp(alpha - shift.index_select(0, index))
            sums += [scatter_sum(w * m, index, n), scatter_sum(w, index, n)]
        return (*sums, torch.addcmul(m, att.edge_res_weight, y))

Term = tuple[torch.Tensor, "torch.Tensor | None"]


def _projections(weight: torch.Tensor, terms: list[Term], col: int) -> list[Term]:
    """``[(f_k · W[:, cols_k]ᵀ, idx_k)]`` for ``terms`` (``(features [n_k, d_k], index [n_edges] or
    None)``, None: already per edge) placed from column ``col`` of ``weight``: Φ's first layer on
    the concatenation ``cat([f_k[idx_k]])`` is the sum of these, gathered."""
    out = []
    for feat, index in terms:
        width = feat.shape[-1]
        out.append((feat @ weight[:, col : col + width].T, index))
        col += width
    return out


def project_terms(module: nn.Module, terms: list[Term], col: int) -> list[Term]:
    """The first-layer projections ``(f_k · W[:, cols_k]ᵀ [n_k, Σ out], idx_k)`` of Φ's ``terms``
    placed from column ``col`` of its input: what ``forward_terms(..., projected=)`` takes. A
    row-chunked recomputation (:mod:`matris.model.recompute`) takes the per-node terms so,
    projected once per step rather than once per chunk of rows."""
    return _projections(first_weight(module), terms, col)


def first_weight(module: nn.Module) -> torch.Tensor:
    """Φ's first-layer weight ``[Σ out, d_in]`` (the gated MLP's core and gate rows stacked)."""
    if isinstance(module, GatedMLP):
        return torch.cat([module.mlp_core.layers[0].weight, module.mlp_gate.layers[0].weight])
    return module[0].layers[0].weight


class GatedMLP(nn.Module):
    """``Φ(z) = act(Norm_c(MLP_c(z))) ⊙ σ(Norm_g(MLP_g(z)))``, MLPs with bias: the operator
    :func:`matris.kernels.gated_phi` (its kernel where one applies, else its reference)."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, act: str, norm_type: str, dropout: float):
        super().__init__()
        self.mlp_core = MLP(d_in, d_hidden, d_out, act, True, dropout)
        self.mlp_gate = MLP(d_in, d_hidden, d_out, act, True, dropout)
        self.core_norm = norm(norm_type, d_out)
        self.gate_norm = norm(norm_type, d_out)
        self.act_name, self.norm_type = act, norm_type

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        # one input (the node updates): its two Linears, the reference, bit for bit the published code
        with references():
            return self.forward_terms([(z, None)])

    def forward_terms(self, terms: list[Term], projected: list[Term] = ()) -> torch.Tensor:
        """``forward(cat([f[idx] for f, idx in terms]))`` without building the concatenation (the
        per-row term, index None, is multiplied inside the operator; the others are projected per
        node and gathered). ``projected``: further terms, already projected (:func:`project_terms`), after ``terms``."""
        c0, g0 = self.mlp_core.layers[0], self.mlp_gate.layers[0]
        c3, g3 = self.mlp_core.layers[3], self.mlp_gate.layers[3]
        weight = first_weight(self)
        rows = row_weight = None
        if terms and terms[0][1] is None:  # the per-row term (first, when there is one)
            rows, terms = terms[0][0], terms[1:]
            row_weight = weight[:, : rows.shape[-1]]
        gathered = _projections(weight, terms, 0 if rows is None else rows.shape[-1]) + list(projected)
        cn, gn = self.core_norm, self.gate_norm
        eps = cn.eps if cn.eps is not None else torch.finfo(weight.dtype).eps
        return gated_phi(rows, row_weight, gathered, torch.cat([c0.bias, g0.bias]), c3.weight, c3.bias, g3.weight,
                         g3.bias, cn.weight, gn.weight, eps, norm=self.norm_type,
                         core_norm_bias=getattr(cn, "bias", None), gate_norm_bias=getattr(gn, "bias", None),
                         act=self.act_name, dropout=self.mlp_core.layers[2])


class NormedMLP(nn.Sequential):
    """``Norm(MLP(z))``, the ``graph_conv_mlp='MLP'`` variant of Φ; keys ``0.layers.*`` and ``1``.
    It has no fused form: the composed PyTorch ops on every device."""

    def forward_terms(self, terms: list[Term], projected: list[Term] = ()) -> torch.Tensor:
        """As :meth:`GatedMLP.forward_terms`."""
        layers = self[0].layers
        first = _projections(layers[0].weight, terms, 0) + list(projected)
        hidden = layers[2](gather_sum_activate_reference(first, layers[0].bias, self[0].act_name))
        return self[1](layers[3](hidden))


def phi(config, d_in: int, d_hidden: int, d_out: int) -> nn.Module:
    """Φ of a block: the gated MLP, or ``Norm(MLP(z))`` for ``graph_conv_mlp='MLP'``.

    The plain variant is an ``nn.Sequential`` so its keys read ``.0.layers.*`` and ``.1``.
    """
    if config.graph_conv_mlp == "GateMLP":
        return GatedMLP(d_in, d_hidden, d_out, config.activation_type, config.norm_type, config.dropout)
    return NormedMLP(
        MLP(d_in, d_hidden, d_out, config.activation_type, config.use_bias, config.dropout),
        norm(config.norm_type, d_out),
    )


def term_rows(terms: list[Term]) -> int:
    """The rows of Φ on ``terms`` (``(features, index)`` pairs, as :func:`_projections`): the length
    of the first index, or of the first features where every term is per row."""
    return next((i.shape[0] for _, i in terms if i is not None), terms[0][0].shape[0])


def call_phi(module: nn.Module, terms: list[Term], rows: RowRecompute | None = None) -> torch.Tensor:
    """``module.forward_terms(terms)``; ``rows``: recomputed by row chunks in the backward passes
    where the rows make several chunks."""
    if rows is None or not rows.splits(term_rows(terms)):
        return module.forward_terms(terms)
    return recomputed_phi(module, terms, rows.fast, rows.chunk)


def recomputed_phi(module: nn.Module, terms: list, fast: bool, chunk: int) -> torch.Tensor:
    """``module.forward_terms(terms)`` (Φ: ``terms`` as in :func:`_projections`)
    as a node recomputed ``chunk`` rows at a time in the backward passes: inside a block's
    second-order recomputation, Φ's intermediates (the widest of the block) are then alive for one
    chunk of rows only. The terms gathered per row are projected by the first layer here, once,
    and the node takes the projections (per chunk they would be projected again). ``fast``: the
    fused operators where no weight gradient is wanted."""
    n_rows = term_rows(terms)
    lead = [] if terms[0][1] is not None else [terms[0]]  # a per-row term stays in the node
    rest = project_terms(module, terms[len(lead):], sum(f.shape[-1] for f, _ in lead))
    parts = lead + rest
    feats = [f for f, _ in parts]
    indices = [i for _, i in parts]
    row_inputs = tuple(i is None for i in indices)

    def arguments(inputs, use_fast, rows):
        cut = indices if rows is None else [i[rows] if i is not None else None for i in indices]
        pairs = list(zip(inputs, cut))
        return (pairs[: len(lead)], pairs[len(lead):]), {"reference": not (use_fast and fast)}

    (out,) = recompute.recomputed(_PhiTerms(module), arguments, feats, chunk, row_inputs, n_rows)
    return out


class _PhiTerms(nn.Module):
    """Φ's ``forward_terms`` as a module call returning a tuple (the form :func:`recomputed` takes)."""

    def __init__(self, phi: nn.Module):
        super().__init__()
        self.phi = phi

    def forward(self, terms, projected, reference=False):
        with references(reference):
            return (self.phi.forward_terms(terms, projected),)
