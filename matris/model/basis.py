"""Radial and angular basis functions (spec §3).

All functions take lengths in Å and angles in radians and return ``[n, K]`` tensors in the
dtype of their input. These PyTorch forms are the references; the operators of
``matris.kernels.basis`` (Triton kernels on CUDA, C++ kernels on a CPU) compute the same values
(``backend`` selects: "torch" the references, "triton"/"fused" or None the operators where they run). Constants that
the reference keeps in float32 (SH coefficients and factor, Gaussian centres) enter float64
computations as their float32 values, so float64 results match the reference to rounding; the
Fourier basis's constant term is 1/√2 in the compute dtype, as in the official 1.0 code.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..kernels import basis as fused
from ..kernels import use_triton
from ..kernels.backend import kernel_choice, operators_run


def _operators(backend: str | None, *tensors: torch.Tensor) -> bool:
    """Whether a basis runs its fused operator: not for ``backend="torch"`` (or ``MATRIS_KERNELS=torch``);
    ``"triton"`` insists on the Triton kernels; otherwise wherever the operator has a kernel."""
    backend = kernel_choice(backend)
    if backend == "torch":
        return False
    if backend == "triton":
        return use_triton(tensors[0].device, "triton")
    return operators_run(*tensors)

# Coefficients c_* of the SH radial functions R_{n,j}: row n, root j (float32 values).
# Source: the v0.9 reference release (see tests/fixtures/official-v0.9/sh_radial_coefficients.json).
SH_RADIAL_COEFFICIENTS: tuple[tuple[tuple[float, ...], ...], ...] = (
    (  # n = 0
        (3.1415927410125732,),
        (6.2831854820251465,),
        (9.42477798461914,),
        (12.566370964050293,),
    ),
    (  # n = 1
        (-1.0244648456573486, 4.493409633636475, 0.22799275815486908, 4.493409633636475),
        (-1.0083433389663696, 7.7252516746521, 0.1305256336927414, 7.7252516746521),
        (-1.0041964054107666, 10.904121398925781, 0.09209328889846802, 10.904121398925781),
        (-1.0025237798690796, 14.066193580627441, 0.0712718591094017, 14.066193580627441),
    ),
    (  # n = 2
        (
            -1.048079490661621, 5.763459205627441,
            0.5455470681190491, 5.763459205627441,
            0.09465618431568146, 5.763459205627441,
        ),
        (
            -1.0186179876327515, 9.095011711120605,
            0.33599230647087097, 9.095011711120605,
            0.036942481994628906, 9.095011711120605,
        ),
        (
            -1.010022759437561, 12.322940826416016,
            0.24588839709758759, 12.322940826416016,
            0.019953710958361626, 12.322940826416016,
        ),
        (
            -1.0062896013259888, 15.514602661132812,
            0.19458240270614624, 15.514602661132812,
            0.01254188735038042, 15.514602661132812,
        ),
    ),
    (  # n = 3
        (
            1.0694283246994019, 6.987932205200195,
            0.9182358384132385, 6.987932205200195,
            0.3285077214241028, 6.987932205200195,
            0.047010719776153564, 6.987932205200195,
        ),
        (
            1.0292173624038696, 10.417118072509766,
            0.5928034782409668, 10.417118072509766,
            0.1422666758298874, 10.417118072509766,
            0.013657009229063988, 10.417118072509766,
        ),
        (
            1.0165081024169922, 13.698022842407227,
            0.4452502727508545, 13.698022842407227,
            0.0812617763876915, 13.698022842407227,
            0.0059323725290596485, 13.698022842407227,
        ),
        (
            1.010696530342102, 16.923622131347656,
            0.3583263158798218, 16.923622131347656,
            0.05293286591768265, 16.923622131347656,
            0.003127750474959612, 16.923622131347656,
        ),
    ),
)

# 1/sqrt(2): the constant term of the Fourier basis, exact in the compute dtype as the official 1.0
# code computes it (in float32 it rounds to the value v0.9 kept, 0.7071067690849304, so float32
# results are those of both releases; in float64 they are 1.0's: see tests/test_parity.py).
FOURIER_CONSTANT = math.sqrt(0.5)
# the constant of the v0.9 reference release, which kept the float32 value in float64 too
FOURIER_CONSTANT_V09 = 0.7071067690849304


def polynomial_envelope(s: torch.Tensor, p: int) -> torch.Tensor:
    """Smooth cutoff ``f(s)`` of order ``p`` for ``s = r / cutoff``; zero for ``s >= 1``.

    ``f(s) = 1 − (p+1)(p+2)/2·s^p + p(p+2)·s^(p+1) − p(p+1)/2·s^(p+2)``.
    """
    a = (p + 1) * (p + 2) / 2
    b = p * (p + 2)
    c = p * (p + 1) / 2
    sp = s**p
    f = 1 - a * sp + b * sp * s - c * sp * s * s
    return torch.where(s < 1, f, torch.zeros_like(f))


def bessel_basis(r: torch.Tensor, frequencies: torch.Tensor, cutoff: float, p: int) -> torch.Tensor:
    """``[B]`` lengths → ``[B, K]``: ``sqrt(2/r_c) · sin(freq_k · r / r_c) / r · f(r / r_c)``."""
    r = r.unsqueeze(-1)
    s = r / cutoff
    return math.sqrt(2 / cutoff) * torch.sin(frequencies * s) / r * polynomial_envelope(s, p)


class BesselExpansion(nn.Module):
    """``b_k(r) = sqrt(2/r_c) · sin(freq_k · r / r_c) / r · f(r / r_c)`` → ``[n, K]``."""

    def __init__(self, num_radial: int, cutoff: float, envelope_exponent: int, learnable: bool = True):
        super().__init__()
        self.cutoff = float(cutoff)
        self.envelope_exponent = int(envelope_exponent)
        freq = torch.arange(1, num_radial + 1, dtype=torch.float32) * math.pi
        if learnable:
            self.frequencies = nn.Parameter(freq)
        else:
            self.register_buffer("frequencies", freq)

    def forward(self, r: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        if _operators(backend, r) and r.shape[0]:
            return fused.bessel(r, self.frequencies.to(r.dtype), self.cutoff, self.envelope_exponent)
        return bessel_basis(r, self.frequencies, self.cutoff, self.envelope_exponent)


class GaussianExpansion(nn.Module):
    """``g_k(r) = exp(−0.5 / (2·(μ_1 − μ_0))² · (r − μ_k)²)`` with float32 centres μ; no envelope."""

    def __init__(self, num_radial: int, cutoff: float):
        super().__init__()
        self.register_buffer("offset", torch.linspace(0, cutoff, num_radial, dtype=torch.float32))

    def forward(self, r: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        mu = self.offset.to(r.dtype)
        coeff = -0.5 / (2 * (mu[1] - mu[0])) ** 2
        return torch.exp(coeff * (r.unsqueeze(-1) - mu) ** 2)


def fourier_basis(theta: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """``[A]`` angles → ``[A, 2m+1]``: ``[c, sin(f θ)…, cos(f θ)…] / √π``."""
    x = theta.unsqueeze(-1) * frequencies
    const = torch.full_like(theta, FOURIER_CONSTANT).unsqueeze(-1)
    return torch.cat([const, torch.sin(x), torch.cos(x)], dim=-1) / math.sqrt(math.pi)


class FourierExpansion(nn.Module):
    """``[c, sin(f_1 θ)…sin(f_m θ), cos(f_1 θ)…cos(f_m θ)] / √π`` → ``[n_angles, 2m+1]``."""

    def __init__(self, num_angular: int, learnable: bool = True):
        super().__init__()
        m = (num_angular - 1) // 2
        freq = torch.arange(1, m + 1, dtype=torch.float32)
        if learnable:
            self.frequencies = nn.Parameter(freq)
        else:
            self.register_buffer("frequencies", freq)

    def forward(self, theta: torch.Tensor, rho: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
        if _operators(backend, theta) and theta.shape[0]:
            return fused.fourier(theta, self.frequencies.to(theta.dtype))
        return fourier_basis(theta, self.frequencies)


def _sh_radial(n: int, c: tuple[float, ...], rho: torch.Tensor) -> torch.Tensor:
    """Spherical-Bessel-like radial function ``R_{n,j}(ρ)`` with coefficients ``c``."""
    if n == 0:
        return torch.sin(c[0] * rho) / rho
    if n == 1:
        return (c[0] * rho * torch.cos(c[1] * rho) + c[2] * torch.sin(c[3] * rho)) / rho**2
    if n == 2:
        return (
            c[0] * rho**2 * torch.sin(c[1] * rho) - c[2] * rho * torch.cos(c[3] * rho) + c[4] * torch.sin(c[5] * rho)
        ) / rho**3
    return (
        c[0] * rho**3 * torch.cos(c[1] * rho)
        - c[2] * rho**2 * torch.sin(c[3] * rho)
        - c[4] * rho * torch.cos(c[5] * rho)
        + c[6] * torch.sin(c[7] * rho)
    ) / rho**4


def _legendre_y(ell: int, t: torch.Tensor) -> torch.Tensor:
    """Real spherical harmonic ``Y_l`` (m = 0, l = ``ell``) as a function of ``t = cos θ``."""
    if ell == 0:
        return torch.full_like(t, 0.5 * math.sqrt(1 / math.pi))
    if ell == 1:
        return math.sqrt(3 / (4 * math.pi)) * t
    if ell == 2:
        return math.sqrt(5 / (16 * math.pi)) * (3 * t**2 - 1)
    return math.sqrt(7 / (16 * math.pi)) * t * (5 * t**2 - 3)


def sh_basis(theta: torch.Tensor, rho: torch.Tensor, factor: torch.Tensor, max_l: int, max_n: int) -> torch.Tensor:
    """``[A]`` angles and radial arguments → ``[A, max_l·max_n]``; see :class:`SphericalExpansion`."""
    t = torch.cos(theta)
    ys = [_legendre_y(ell, t) for ell in range(max_l)]
    feats = []
    for n in range(max_n):
        for j in range(max_l):
            k = n * max_l + j
            feats.append(_sh_radial(n, SH_RADIAL_COEFFICIENTS[n][j], rho) * ys[k // max_n] * factor)
    return torch.stack(feats, dim=-1)


class SphericalExpansion(nn.Module):
    """SH angle basis: feature ``k = n·max_l + j`` is ``R_{n,j}(ρ) · Y_{⌊k/max_n⌋}(cos θ) · s``.

    ``ρ`` is the radial argument (``|u_src| / r_c`` in published models), ``s`` the stored
    float32 ``factor``. Output ``[n_angles, max_l·max_n]``.
    """

    def __init__(self, max_l: int, max_n: int, cutoff: float):
        super().__init__()
        self.max_l = int(max_l)
        self.max_n = int(max_n)
        self.register_buffer("factor", torch.tensor(math.sqrt(2 / float(cutoff) ** 3), dtype=torch.float32))

    def forward(self, theta: torch.Tensor, rho: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        if _operators(backend, theta, rho) and theta.shape[0]:
            return fused.spherical(theta, rho, self.factor, self.max_l, self.max_n)
        return sh_basis(theta, rho, self.factor.to(theta.dtype), self.max_l, self.max_n)
