"""Small building blocks: activations, norms and MLPs (Φ, built from them, is in :mod:`matris.model.attention`)."""

from __future__ import annotations

import torch
from torch import nn


def activation(name: str) -> nn.Module:
    """The activation module for a config ``activation_type`` (GELU: the exact erf form)."""
    table = {"relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU, "softplus": nn.Softplus, "sigmoid": nn.Sigmoid,
             "tanh": nn.Tanh}
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


def ffn(d_in: int, d_out: int, bias: bool, dropout: float) -> MLP:
    """FFN of Refine: ``Lin(in→out) → SiLU → Dropout → Lin(out→out)``, always SiLU."""
    return MLP(d_in, d_out, d_out, "silu", bias, dropout)
