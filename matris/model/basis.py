"""Radial and angular basis functions (spec §3).

Lengths in Å, angles in radians; outputs ``[n, K]`` in the input's dtype. The formulas are written once, as the PyTorch
references in ``matris.kernels.basis``, whose operators (Triton kernels on CUDA, C++ on a CPU) compute the same values
(``fused=False``: the references). Constants the reference keeps in float32 (SH coefficients and factor, Gaussian
centres) enter float64 as their float32 values, so float64 results match the reference to rounding."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..kernels import basis as ops
from ..kernels.basis import FOURIER_CONSTANT


def _frequencies(module: nn.Module, freq: torch.Tensor, learnable: bool) -> None:
    # a parameter where the basis learns them, else a buffer: the checkpoint key is "frequencies" either way
    if learnable:
        module.frequencies = nn.Parameter(freq)
    else:
        module.register_buffer("frequencies", freq)


class BesselExpansion(nn.Module):
    """``b_k(r) = sqrt(2/r_c) · sin(freq_k · r / r_c) / r · f(r / r_c)`` → ``[n, K]``."""

    def __init__(self, num_radial: int, cutoff: float, envelope_exponent: int, learnable: bool = True):
        super().__init__()
        self.cutoff = float(cutoff)
        self.envelope_exponent = int(envelope_exponent)
        _frequencies(self, torch.arange(1, num_radial + 1, dtype=torch.float32) * math.pi, learnable)

    def forward(self, r: torch.Tensor, fused: bool = True) -> torch.Tensor:
        return ops.bessel(r, self.frequencies, self.cutoff, self.envelope_exponent, fused)


class GaussianExpansion(nn.Module):
    """``g_k(r) = exp(−0.5 / (2·(μ_1 − μ_0))² · (r − μ_k)²)`` with float32 centres μ; no envelope."""

    def __init__(self, num_radial: int, cutoff: float):
        super().__init__()
        self.register_buffer("offset", torch.linspace(0, cutoff, num_radial, dtype=torch.float32))

    def forward(self, r: torch.Tensor, fused: bool = True) -> torch.Tensor:
        mu = self.offset.to(r.dtype)
        coeff = -0.5 / (2 * (mu[1] - mu[0])) ** 2
        return torch.exp(coeff * (r.unsqueeze(-1) - mu) ** 2)


class FourierExpansion(nn.Module):
    """``[c, sin(f_1 θ)…sin(f_m θ), cos(f_1 θ)…cos(f_m θ)] / √π`` → ``[n_angles, 2m+1]``."""

    def __init__(self, num_angular: int, learnable: bool = True, constant: float = FOURIER_CONSTANT):
        super().__init__()
        # c = 1/√2 in the compute dtype (official 1.0); v0.9 kept its float32 value (FOURIER_CONSTANT_V09, its fixtures)
        self.constant = float(constant)
        _frequencies(self, torch.arange(1, (num_angular - 1) // 2 + 1, dtype=torch.float32), learnable)

    def forward(self, theta: torch.Tensor, rho: torch.Tensor | None = None, fused: bool = True) -> torch.Tensor:
        return ops.fourier(theta, self.frequencies, self.constant, fused)


class SphericalExpansion(nn.Module):
    """SH angle basis: feature ``k = n·max_l + j`` is ``R_{n,j}(ρ) · Y_{⌊k/max_n⌋}(cos θ) · s``, ``ρ`` the radial
    argument (``|u_src| / r_c`` in published models), ``s`` the float32 ``factor``; ``[n_angles, max_l·max_n]``."""

    def __init__(self, max_l: int, max_n: int, cutoff: float):
        super().__init__()
        self.max_l = int(max_l)
        self.max_n = int(max_n)
        self.register_buffer("factor", torch.tensor(math.sqrt(2 / float(cutoff) ** 3), dtype=torch.float32))

    def forward(self, theta: torch.Tensor, rho: torch.Tensor, fused: bool = True) -> torch.Tensor:
        return ops.spherical(theta, rho, self.factor, self.max_l, self.max_n, fused)
