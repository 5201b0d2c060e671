"""Separable attention (spec §5): a per-channel softmax over the edges of each node.

Each softmax runs over the edges that share a node, so the cost is linear in the number of edges. Used on the atom
graph (nodes = atoms, edges = directed edges) and on the line graph (nodes = bonds, edges = angles).

Φ, the gated MLP of the attention's and Refine's updates, is here too. ``forward_terms`` computes its first Linear on
``[y0 ‖ x[tgt] ‖ x[src]]`` as ``W_y·y0 + (W_t·x)[tgt] + (W_s·x)[src]`` (node terms projected per node, gathered per
edge), never building the wide concatenation (3–4× fewer first-layer multiply-adds, nothing edge-sized saved)."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import Kernels, attention_pair, attention_pair_lse, gated_phi, gather_sum_activate_reference
from . import recompute
from .layers import MLP, norm
from .recompute import RowRecompute


def pool_directed(m: torch.Tensor) -> torch.Tensor:
    """``[2B, d]`` → ``[B, d]``: the mean of the two directed copies of each bond."""
    n_b = m.shape[0] // 2
    return (m[:n_b] + m[n_b:]) / 2


class SeparableAttention(nn.Module):
    """``(x, y) → (x', y')`` for node features x ``[n_nodes, d_x]`` and edge features y: per bond ``[B, d_y]`` on the
    atom graph (:meth:`forward`; edge rows are the ``2B`` directed edges, ``y0 = y[d2u]``), ``[A, d_y]`` for some angles
    on the line graph (:meth:`line_part`, part of :mod:`matris.model.block`'s decomposition)."""

    def __init__(self, config, d_x: int, d_y: int, d_hidden: int):
        super().__init__()
        self.node_res_weight = nn.Parameter(torch.ones(1, d_x))
        self.edge_res_weight = nn.Parameter(torch.ones(1, d_y))
        self.source_weight_linear = nn.Linear(d_y, d_y, bias=False)
        self.target_weight_linear = nn.Linear(d_y, d_y, bias=False)
        self.edge_nonlinear_update = phi(config, d_y + 2 * d_x, d_hidden, d_y)
        self.node_nonlinear_update = phi(config, d_x + 2 * d_y, d_hidden, d_x)

    def forward(self, x: torch.Tensor, y: torch.Tensor, tgt: torch.Tensor, src: torch.Tensor, d2u: torch.Tensor,
                k: Kernels, rows: RowRecompute | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Atom-graph step: atoms ``x`` ``[N, d_x]``, bonds ``y`` ``[B, d_y]``, directed edges' atoms ``tgt``, ``src``
        and bonds ``d2u`` ``[2B]``; ``k``: kernels (with CSR segments); ``rows``: Φ recomputed by row chunks."""
        m = call_phi(self.edge_nonlinear_update, [(y, d2u), (x, tgt), (x, src)], rows, k.fused)
        # the logits are linear in y0 = y[d2u]: projected per bond, read per directed edge
        t_agg, s_agg = attention_pair(y @ self._logit_weight().T, None, d2u, m, tgt, src, x.shape[0],
                                      segments=k.atom_segments, fused=k.fused)
        return self.node_update(x, t_agg, s_agg), torch.addcmul(pool_directed(m), self.edge_res_weight, y)

    def line_part(self, y: torch.Tensor, x: torch.Tensor | None, angles, k: Kernels, partial: bool = False, shift=None,
                  projected=None):
        """Line-graph per-angle part on angles ``y`` ``[a, d_y]``, their bonds' features ``x`` ``[n, d_x]`` (``angles``:
        :class:`matris.model.block.Angles`, local numbering): each bond's softmax over them ``(T, lse_t, S, lse_s)``
        ``[n, d_y]`` and the angles' update ``y' = m + w ⊙ y``; ``partial``: with log-sum-exps (the caller merges).
        ``shift`` ``(s_t, s_s)`` ``[n, d_y]``: instead the sums ``(N_t, D_t, N_s, D_s)`` relative to it
        (:meth:`matris.model.block.Angles.sums`), straight from the logits: ``w = exp(α − s)``, ``N = Σ w·m``,
        ``D = Σ w`` (a shorter graph to differentiate twice than through ``lse``: training's rows). ``projected``
        ``(p_t, p_s)`` ``[n, ·]``: the bonds' terms of Φ_edge's first layer in place of ``x``
        (:meth:`line_projections`)."""
        if projected is None:
            m = self.edge_nonlinear_update.forward_terms([(y, None), (x, angles.tgt), (x, angles.src)], fused=k.fused)
        else:
            m = self.edge_nonlinear_update.forward_terms([(y, None)], list(zip(projected, (angles.tgt, angles.src))),
                                                         fused=k.fused)
        if shift is not None:
            alpha_s, alpha_t = (y @ self._logit_weight().T).split(y.shape[-1], dim=-1)
            sums = []
            for alpha, top, index in ((alpha_t, shift[0], angles.tgt), (alpha_s, shift[1], angles.src)):
                w = torch.exp(alpha - top.index_select(0, index))
                sums += [m.new_zeros(angles.n, m.shape[1]).index_add(0, index, w * m),
                         w.new_zeros(angles.n, w.shape[1]).index_add(0, index, w)]
            return (*sums, torch.addcmul(m, self.edge_res_weight, y))
        if partial:
            t, s, y_new, lse_t, lse_s = attention_pair_lse(y, self._logit_weight(), None, m, angles.tgt, angles.src,
                                                           angles.n, res_weight=self.edge_res_weight, fused=k.fused)
            return t, lse_t, s, lse_s, y_new
        t, s, y_new = attention_pair(y, self._logit_weight(), None, m, angles.tgt, angles.src, angles.n,
                                     res_weight=self.edge_res_weight, segments=k.line_segments, fused=k.fused)
        return t, None, s, None, y_new

    def line_projections(self, x: torch.Tensor, col: int) -> list:
        """Φ_edge's first layer on the bonds ``x`` ``[B, d_x]``: their target and source terms ``[B, ·]`` (``col``: the
        angles' width), once per step rather than per chunk of angles (training's rows: ``line_part(projected=)``)."""
        return [p for p, _ in project_terms(self.edge_nonlinear_update, [(x, None), (x, None)], col)]

    def line_update(self, y: torch.Tensor, x: torch.Tensor, angles, k: Kernels) -> torch.Tensor:
        """The angles' update ``y' = m + w ⊙ y`` of :meth:`line_part` alone (no softmax)."""
        m = self.edge_nonlinear_update.forward_terms([(y, None), (x, angles.tgt), (x, angles.src)], fused=k.fused)
        return torch.addcmul(m, self.edge_res_weight, y)

    @torch.no_grad()
    def logit_max(self, y: torch.Tensor, tgt: torch.Tensor, src: torch.Tensor, n: int, chunk: int):
        """Each bond's largest logit per channel over its angles ``y`` (target side, source side; 0 for a bond without
        angles) ``[n, d_y]`` each: the split softmax's shift, by chunks of angles (all at once: ``[A, 2·d_y]``)."""
        d = y.shape[-1]
        w_st = self._logit_weight()
        shift = [y.new_full((n, d), float("-inf")) for _ in range(2)]
        for lo in range(0, y.shape[0], chunk):
            alpha = y[lo : lo + chunk] @ w_st.T
            for s, side, index in ((shift[0], 1, tgt), (shift[1], 0, src)):
                idx = index[lo : lo + chunk].unsqueeze(1).expand(-1, d)
                s.scatter_reduce_(0, idx, alpha[:, side * d : (side + 1) * d], "amax", include_self=True)
        return [s.nan_to_num_(neginf=0.0) for s in shift]

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


Term = tuple[torch.Tensor, "torch.Tensor | None"]


def _projections(weight: torch.Tensor, terms: list[Term], col: int) -> list[Term]:
    """``[(f_k · W[:, cols_k]ᵀ, idx_k)]`` for ``terms`` (``(features [n_k, d_k], index [n_edges] or None)``, None: per
    edge) from column ``col`` of ``weight``: Φ's first layer on ``cat([f_k[idx_k]])`` is their gathered sum."""
    out = []
    for feat, index in terms:
        width = feat.shape[-1]
        out.append((feat @ weight[:, col : col + width].T, index))
        col += width
    return out


def project_terms(module: nn.Module, terms: list[Term], col: int) -> list[Term]:
    """:func:`_projections` by Φ's first-layer weight (``[n_k, Σ out]`` each): ``forward_terms``'s ``projected=``."""
    return _projections(first_weight(module), terms, col)


def first_weight(module: nn.Module) -> torch.Tensor:
    """Φ's first-layer weight ``[Σ out, d_in]`` (the gated MLP's core and gate rows stacked)."""
    if isinstance(module, GatedMLP):
        return torch.cat([module.mlp_core.layers[0].weight, module.mlp_gate.layers[0].weight])
    return module[0].layers[0].weight


class GatedMLP(nn.Module):
    """``Φ(z) = act(Norm_c(MLP_c(z))) ⊙ σ(Norm_g(MLP_g(z)))``, MLPs with bias: :func:`matris.kernels.gated_phi`."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, act: str, norm_type: str, dropout: float):
        super().__init__()
        self.mlp_core = MLP(d_in, d_hidden, d_out, act, True, dropout)
        self.mlp_gate = MLP(d_in, d_hidden, d_out, act, True, dropout)
        self.core_norm = norm(norm_type, d_out)
        self.gate_norm = norm(norm_type, d_out)
        self.act_name, self.norm_type = act, norm_type

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.forward_terms([(z, None)], fused=False)  # node updates: the reference, bit for bit as published

    def forward_terms(self, terms: list[Term], projected: list[Term] = (), fused: bool = True) -> torch.Tensor:
        """``forward(cat([f[idx] for f, idx in terms]))`` without building the concatenation (the per-row term, index
        None, is multiplied inside the operator; the others are projected per node and gathered). ``projected``:
        further terms, already projected (:func:`project_terms`), after ``terms``. ``fused=False``: the reference."""
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
                         act=self.act_name, dropout=self.mlp_core.layers[2], fused=fused)


class NormedMLP(nn.Sequential):
    """``Norm(MLP(z))``: Φ for ``graph_conv_mlp='MLP'``, keys ``0.layers.*`` and ``1``; no fused form (PyTorch ops)."""

    def forward_terms(self, terms: list[Term], projected: list[Term] = (), fused: bool = True) -> torch.Tensor:
        """As :meth:`GatedMLP.forward_terms` (no fused form: ``fused`` is ignored)."""
        layers = self[0].layers
        first = _projections(layers[0].weight, terms, 0) + list(projected)
        hidden = layers[2](gather_sum_activate_reference(first, layers[0].bias, self[0].act_name))
        return self[1](layers[3](hidden))


def phi(config, d_in: int, d_hidden: int, d_out: int) -> nn.Module:
    """Φ of a block: :class:`GatedMLP`, or :class:`NormedMLP` (an ``nn.Sequential``) for ``graph_conv_mlp='MLP'``."""
    if config.graph_conv_mlp == "GateMLP":
        return GatedMLP(d_in, d_hidden, d_out, config.activation_type, config.norm_type, config.dropout)
    return NormedMLP(MLP(d_in, d_hidden, d_out, config.activation_type, config.use_bias, config.dropout),
                     norm(config.norm_type, d_out))


def term_rows(terms: list[Term]) -> int:
    """The rows of Φ on ``terms`` (as in :func:`_projections`): the first index's length, else the first features'."""
    return next((i.shape[0] for _, i in terms if i is not None), terms[0][0].shape[0])


def call_phi(module: nn.Module, terms: list[Term], rows: RowRecompute | None, fused: bool) -> torch.Tensor:
    """``module.forward_terms(terms, fused=fused)``; ``rows``: recomputed by row chunks in backward (if several)."""
    if rows is None or not rows.splits(term_rows(terms)):
        return module.forward_terms(terms, fused=fused)
    return recomputed_phi(module, terms, rows.kernels.fused, rows.chunk)


def recomputed_phi(module: nn.Module, terms: list, fast: bool, chunk: int) -> torch.Tensor:
    """``module.forward_terms(terms)`` (``terms`` as in :func:`_projections`) recomputed ``chunk`` rows at a time in the
    backward passes: in a block's second-order recomputation Φ's intermediates (the block's widest) live one chunk at a
    time. Gathered terms are projected here, once, not per chunk. ``fast``: fused ops where no weight grad is wanted."""
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
        return (pairs[: len(lead)], pairs[len(lead):]), {"fused": use_fast and fast}

    (out,) = recompute.recomputed(_PhiTerms(module), arguments, feats, chunk, row_inputs, n_rows)
    return out


class _PhiTerms(nn.Module):
    """Φ's ``forward_terms`` as a module returning a tuple: the form :func:`matris.model.recompute.recomputed` takes."""

    def __init__(self, phi: nn.Module):
        super().__init__()
        self.phi = phi

    def forward(self, terms, projected, fused=False):
        return (self.phi.forward_terms(terms, projected, fused),)
