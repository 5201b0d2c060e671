"""Small building blocks: activations, norms, MLPs and the gated MLP Φ (spec §5)."""

from __future__ import annotations

import torch
from torch import nn


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
        self.layers = nn.Sequential(
            nn.Linear(d_in, d_hidden, bias=bias),
            activation(act),
            nn.Dropout(dropout),
            nn.Linear(d_hidden, d_out, bias=bias),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class GatedMLP(nn.Module):
    """``Φ(z) = act(Norm_c(MLP_c(z))) ⊙ σ(Norm_g(MLP_g(z)))``, MLPs with bias."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, act: str, norm_type: str, dropout: float):
        super().__init__()
        self.mlp_core = MLP(d_in, d_hidden, d_out, act, True, dropout)
        self.mlp_gate = MLP(d_in, d_hidden, d_out, act, True, dropout)
        self.core_norm = norm(norm_type, d_out)
        self.gate_norm = norm(norm_type, d_out)
        self.act = activation(act)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        core = self.act(self.core_norm(self.mlp_core(z)))
        gate = torch.sigmoid(self.gate_norm(self.mlp_gate(z)))
        return core * gate


def phi(config, d_in: int, d_hidden: int, d_out: int) -> nn.Module:
    """Φ of a block: the gated MLP, or ``Norm(MLP(z))`` for ``graph_conv_mlp='MLP'``.

    The plain variant is an ``nn.Sequential`` so its keys read ``.0.layers.*`` and ``.1``.
    """
    if config.graph_conv_mlp == "GateMLP":
        return GatedMLP(d_in, d_hidden, d_out, config.activation_type, config.norm_type, config.dropout)
    return nn.Sequential(
        MLP(d_in, d_hidden, d_out, config.activation_type, config.use_bias, config.dropout),
        norm(config.norm_type, d_out),
    )


def ffn(d_in: int, d_out: int, bias: bool, dropout: float) -> MLP:
    """FFN of Refine: ``Lin(in→out) → SiLU → Dropout → Lin(out→out)``, always SiLU."""
    return MLP(d_in, d_out, d_out, "silu", bias, dropout)
