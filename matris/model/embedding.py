"""Embeddings of atoms, bonds and angles (spec §4). Their SiLU is fixed, whatever the config."""

from __future__ import annotations

import torch
from torch import nn

from .basis import BesselExpansion, FourierExpansion, GaussianExpansion, SphericalExpansion
from .config import MatRISConfig


class SwishLayer(nn.Module):
    """``SiLU(W·x)``, W without bias; key ``linear``."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.linear = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.linear(x))


class AtomEmbedding(nn.Module):
    """``h_i = SiLU(W_a · Emb[Z_i − 1])`` → ``[N, d_n]``."""

    def __init__(self, dim: int, num_elements: int = 94):
        super().__init__()
        self.embedding = nn.Embedding(num_elements, dim)
        self.atom_swish_layer = SwishLayer(dim, dim)

    def forward(self, atomic_numbers: torch.Tensor) -> torch.Tensor:
        return self.atom_swish_layer(self.embedding(atomic_numbers - 1))


def _radial(config: MatRISConfig, cutoff: float) -> nn.Module:
    if config.distance_expansion == "Bessel":
        return BesselExpansion(config.num_radial, cutoff, config.envelope_exponent, config.learnable_basis)
    return GaussianExpansion(config.num_radial, cutoff)


class EdgeEmbedding(nn.Module):
    """Radial bases of bonds and the bond embedding ``e = SiLU(W_3·LayerNorm(W_2·W_1·rbf_pair))``."""

    def __init__(self, config: MatRISConfig):
        super().__init__()
        d = config.edge_feat_dim
        self.pairwise_rbf_expansion = _radial(config, config.pairwise_cutoff)
        self.threebody_rbf_expansion = _radial(config, config.three_body_cutoff)
        self.edge_linear1 = nn.Linear(config.num_radial, d, bias=False)
        self.edge_linear2 = nn.Linear(d, d, bias=False)
        self.edge_init_norm = nn.LayerNorm(d, eps=1e-5)
        self.swish_layer = SwishLayer(d, d)

    def forward(self, bond_length: torch.Tensor, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """bond_length ``[B]`` Å → (e ``[B, d_e]``, rbf_pair ``[B, K]``, rbf_3b ``[B, K]``); ``fused``: kernels."""
        rbf_pair = self.pairwise_rbf_expansion(bond_length, fused)
        rbf_3b = self.threebody_rbf_expansion(bond_length, fused)
        e = self.swish_layer(self.edge_init_norm(self.edge_linear2(self.edge_linear1(rbf_pair))))
        return e, rbf_pair, rbf_3b


class ThreeBodyEmbedding(nn.Module):
    """Angle embedding ``a = SiLU(W_s · W_t · basis(θ))`` → ``[A, d_t]``."""

    def __init__(self, config: MatRISConfig):
        super().__init__()
        if config.three_body_expansion.lower() == "sh":
            self.expansion = SphericalExpansion(config.max_l, config.max_n, config.pairwise_cutoff)
        else:
            self.expansion = FourierExpansion(config.num_angular, config.learnable_basis)
        self.angle_embedding = nn.Linear(config.three_body_basis_size, config.three_body_feat_dim, bias=False)
        self.swish_layer = SwishLayer(config.three_body_feat_dim, config.three_body_feat_dim)

    def forward(self, theta: torch.Tensor, rho: torch.Tensor, fused: bool = True) -> torch.Tensor:
        return self.swish_layer(self.angle_embedding(self.expansion(theta, rho, fused)))
