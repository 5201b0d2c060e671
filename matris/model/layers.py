"""Small building blocks: activations, norms, MLPs and the gated MLP Φ (spec §5).

Φ's first Linear acts on a concatenation ``[y0 ‖ x[tgt] ‖ x[src]]``. ``forward_terms``
computes the same thing as ``W_y·y0 + (W_t·x)[tgt] + (W_s·x)[src]``: the node terms are
projected once per node and gathered per edge, so the wide concatenation is never built
(3–4× fewer multiply-adds in the first layer, and nothing edge-sized saved for its backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..kernels import gated_phi, gather_sum_activate_reference
from . import recompute


def activation(name: str) -> nn.Module:
    """The activation module for a config ``activation_type``."""
    table = {
        "relu": nn.ReLU,
        "silu": nn.SiLU,
        "gelu": nn.GELU,  # exact erf form
        "softplus": nn.Softplus,
        "sigmoid": nn.Sigmoid,
        "tanh": nn.Tanh,
    }
    return table[name]()


def norm(kind: str, dim: int) -> nn.Module:
    """RMSNorm with eps = the dtype's machine epsilon, or LayerNorm with eps 1e-5."""
    if kind == "rms":
        return nn.RMSNorm(dim, eps=None)
    return nn.LayerNorm(dim, eps=1e-5)


class MLP(nn.Module):
    """``Lin(in→hid) → act → Dropout → Lin(hid→out)``; state-dict keys ``layers.{0,3}``."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, act: str, bias: bool, dropout: float):
        super().__init__()
        self.act_name = act
        self.layers = nn.Sequential(
            nn.Linear(d_in, d_hidden, bias=bias),
            activation(act),
            nn.Dropout(dropout),
            nn.Linear(d_hidden, d_out, bias=bias),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


Term = tuple[torch.Tensor, "torch.Tensor | None"]


def first_layer(linears: list[nn.Linear], act: str, terms: list[Term], projected: list[Term] = ()) -> torch.Tensor:
    """``act(Σ_k (f_k · W[:, cols_k]ᵀ)[idx_k] + b)`` for the Linears stacked along their outputs.

    terms: ``(features [n_k, d_k], index [n_edges] or None)`` in the column order of the
    concatenation they replace, from its first column; index None means the rows are already per
    edge. projected: the other terms' projections ``(f_k · W[:, cols_k]ᵀ [n_k, Σ out], index)``,
    made beforehand (:func:`project_terms`). Returns ``[n_edges, Σ out]``, equal to
    ``act(cat(linears)(cat([f_k[idx_k]])))``, in composed PyTorch ops
    (:func:`matris.kernels.gather_sum_activate_reference`).
    """
    weight = torch.cat([lin.weight for lin in linears]) if len(linears) > 1 else linears[0].weight
    projections = _projections(weight, terms, 0) + list(projected)
    bias = None
    if linears[0].bias is not None:
        bias = torch.cat([lin.bias for lin in linears]) if len(linears) > 1 else linears[0].bias
    # index_select per term: its backward is index_add, faster than index_put
    return gather_sum_activate_reference(projections, bias, act)


def _projections(weight: torch.Tensor, terms: list[Term], col: int) -> list[Term]:
    """``[(f_k · W[:, cols_k]ᵀ, idx_k)]`` for ``terms`` placed from column ``col`` of ``weight``."""
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
        return self.forward_terms([(z, None)])

    def forward_terms(self, terms: list[Term], fused: bool = False, projected: list[Term] = ()) -> torch.Tensor:
        """``forward(cat([f[idx] for f, idx in terms]))`` without building the concatenation (the
        per-row term, index None, is multiplied inside the operator; the others are projected per
        node and gathered). ``fused``: the operator's kernel where it has one, else its reference.
        ``projected``: further terms, already projected (:func:`project_terms`), after ``terms``."""
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
    """``Norm(MLP(z))``, the ``graph_conv_mlp='MLP'`` variant of Φ; keys ``0.layers.*`` and ``1``.
    It has no fused form: the composed PyTorch ops on every device."""

    def forward_terms(self, terms: list[Term], fused: bool = False, projected: list[Term] = ()) -> torch.Tensor:
        """As :meth:`GatedMLP.forward_terms`; ``fused`` changes nothing (no fused form)."""
        layers = self[0].layers
        hidden = layers[2](first_layer([layers[0]], self[0].act_name, terms, projected))
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


@dataclass(frozen=True)
class RowRecompute:
    """Φ recomputed ``chunk`` rows at a time in the backward passes of a training step
    (:func:`recomputed_phi`); ``fast``: with the fused operators where no
    weight gradient is wanted."""

    chunk: int
    fast: bool

    def splits(self, n_rows: int) -> bool:
        """Whether ``n_rows`` rows make more than one chunk: a single chunk is computed as the rest of
        the block (recomputing it as a node of its own would save no memory and cost three passes:
        its forward and input gradients with the fast kernels, its first-order backward)."""
        return n_rows > self.chunk


def term_rows(terms: list[Term]) -> int:
    """The rows of Φ on ``terms`` (``(features, index)`` pairs, as :func:`first_layer`): the length
    of the first index, or of the first features where every term is per row."""
    return next((i.shape[0] for _, i in terms if i is not None), terms[0][0].shape[0])


def call_phi(module: nn.Module, terms: list[Term], rows: RowRecompute | None = None,
             fused: bool = False) -> torch.Tensor:
    """``module.forward_terms(terms)``; ``fused`` selects the fused operator. ``rows``: recomputed
    by row chunks in the backward passes where the rows make several chunks."""
    if rows is None or not rows.splits(term_rows(terms)):
        return module.forward_terms(terms, fused)
    return recomputed_phi(module, terms, rows.fast, rows.chunk)


def ffn(d_in: int, d_out: int, bias: bool, dropout: float) -> MLP:
    """FFN of Refine: ``Lin(in→out) → SiLU → Dropout → Lin(out→out)``, always SiLU."""
    return MLP(d_in, d_out, d_out, "silu", bias, dropout)


def recomputed_phi(module: nn.Module, terms: list, fast: bool, chunk: int) -> torch.Tensor:
    """``module.forward_terms(terms)`` (Φ: ``terms`` as in :func:`matris.model.layers.first_layer`)
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
        return (pairs[: len(lead)], pairs[len(lead):]), {"fused": use_fast and fast}

    (out,) = recompute.recomputed(_PhiTerms(module), arguments, feats, chunk, row_inputs, n_rows)
    return out


class _PhiTerms(nn.Module):
    """Φ's ``forward_terms`` as a module call returning a tuple (the form :func:`recomputed` takes)."""

    def __init__(self, phi: nn.Module):
        super().__init__()
        self.phi = phi

    def forward(self, terms, projected, fused=False):
        return (self.phi.forward_terms(terms, fused, projected),)
