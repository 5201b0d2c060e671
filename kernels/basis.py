"""Fused basis functions: Bessel × polynomial envelope, Fourier and SH angle bases (spec §3).

Each basis is an operator (``matris::bessel``, ``fourier``, ``spherical``): a Triton CUDA kernel and a C++ CPU kernel
(``csrc/cpu/basis.cpp``, same formulas), each writing all K columns of its rows. A second kernel gives the analytic
first-order backward: ∂/∂input (bond length r; angle θ, SH radial argument ρ) and per-element ∂/∂frequencies, summed
over rows by the wrapper; with create_graph (training on forces) it recomputes the reference under autograd (exact
second order). ``matris/model/basis.py`` calls the references; ``benchmarks/kernels.py --check`` compares all paths.
"""

from __future__ import annotations

import functools
import math

import torch

from .backend import LIB, device_constants, operators_run, recompute_backward, register_triton, tile, triton_available

SQRT_PI = math.sqrt(math.pi)


# ---------------------------------------------------------------------------- references
# The PyTorch forms: the kernels' ground truth, create_graph backward and no-kernel path. SH radial coefficients c_*
# of R_{n,j}, row n, root j: v0.9's float32 values (tests/fixtures/official-v0.9/sh_radial_coefficients.json).
SH_RADIAL_COEFFICIENTS: tuple[tuple[tuple[float, ...], ...], ...] = (
    (  # n = 0
        (3.1415927410125732,), (6.2831854820251465,), (9.42477798461914,), (12.566370964050293,),
    ),
    (  # n = 1
        (-1.0244648456573486, 4.493409633636475, 0.22799275815486908, 4.493409633636475),
        (-1.0083433389663696, 7.7252516746521, 0.1305256336927414, 7.7252516746521),
        (-1.0041964054107666, 10.904121398925781, 0.09209328889846802, 10.904121398925781),
        (-1.0025237798690796, 14.066193580627441, 0.0712718591094017, 14.066193580627441),
    ),
    (  # n = 2
        (-1.048079490661621, 5.763459205627441, 0.5455470681190491, 5.763459205627441,
         0.09465618431568146, 5.763459205627441),
        (-1.0186179876327515, 9.095011711120605, 0.33599230647087097, 9.095011711120605,
         0.036942481994628906, 9.095011711120605),
        (-1.010022759437561, 12.322940826416016, 0.24588839709758759, 12.322940826416016,
         0.019953710958361626, 12.322940826416016),
        (-1.0062896013259888, 15.514602661132812, 0.19458240270614624, 15.514602661132812,
         0.01254188735038042, 15.514602661132812),
    ),
    (  # n = 3
        (1.0694283246994019, 6.987932205200195, 0.9182358384132385, 6.987932205200195,
         0.3285077214241028, 6.987932205200195, 0.047010719776153564, 6.987932205200195),
        (1.0292173624038696, 10.417118072509766, 0.5928034782409668, 10.417118072509766,
         0.1422666758298874, 10.417118072509766, 0.013657009229063988, 10.417118072509766),
        (1.0165081024169922, 13.698022842407227, 0.4452502727508545, 13.698022842407227,
         0.0812617763876915, 13.698022842407227, 0.0059323725290596485, 13.698022842407227),
        (1.010696530342102, 16.923622131347656, 0.3583263158798218, 16.923622131347656,
         0.05293286591768265, 16.923622131347656, 0.003127750474959612, 16.923622131347656),
    ),
)

# Fourier constant 1/sqrt(2), exact in the compute dtype as in official 1.0 (float32: v0.9's too; tests/test_parity.py)
FOURIER_CONSTANT = math.sqrt(0.5)
FOURIER_CONSTANT_V09 = 0.7071067690849304  # v0.9 kept the float32 value in float64 too


def polynomial_envelope(s: torch.Tensor, p: int) -> torch.Tensor:
    """Smooth cutoff of order ``p`` for ``s = r / cutoff``, zero for ``s >= 1``:
    ``f(s) = 1 − (p+1)(p+2)/2·s^p + p(p+2)·s^(p+1) − p(p+1)/2·s^(p+2)``."""
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


def fourier_basis(theta: torch.Tensor, frequencies: torch.Tensor, constant: float = FOURIER_CONSTANT) -> torch.Tensor:
    """``[A]`` angles → ``[A, 2m+1]``: ``[c, sin(f θ)…, cos(f θ)…] / √π``, ``c`` e.g. :data:`FOURIER_CONSTANT`."""
    x = theta.unsqueeze(-1) * frequencies
    const = torch.full_like(theta, constant).unsqueeze(-1)
    return torch.cat([const, torch.sin(x), torch.cos(x)], dim=-1) / math.sqrt(math.pi)


def sh_radial_reference(n: int, c: tuple[float, ...], rho: torch.Tensor) -> torch.Tensor:
    """Spherical-Bessel-like radial function ``R_{n,j}(ρ)`` with coefficients ``c``."""
    if n == 0:
        return torch.sin(c[0] * rho) / rho
    if n == 1:
        return (c[0] * rho * torch.cos(c[1] * rho) + c[2] * torch.sin(c[3] * rho)) / rho**2
    if n == 2:
        return (c[0] * rho**2 * torch.sin(c[1] * rho) - c[2] * rho * torch.cos(c[3] * rho)
                + c[4] * torch.sin(c[5] * rho)) / rho**3
    return (c[0] * rho**3 * torch.cos(c[1] * rho) - c[2] * rho**2 * torch.sin(c[3] * rho)
            - c[4] * rho * torch.cos(c[5] * rho) + c[6] * torch.sin(c[7] * rho)) / rho**4


# normalisations of Y_l (m = 0), l = 0..3, as the kernel reads them
SH_NORMS = (0.5 * math.sqrt(1 / math.pi), math.sqrt(3 / (4 * math.pi)), math.sqrt(5 / (16 * math.pi)),
            math.sqrt(7 / (16 * math.pi)))


def legendre_reference(ell: int, t: torch.Tensor) -> torch.Tensor:
    """Real spherical harmonic ``Y_l`` (m = 0, l = ``ell``) as a function of ``t = cos θ``."""
    if ell == 0:
        return torch.full_like(t, SH_NORMS[0])
    return SH_NORMS[ell] * (t if ell == 1 else 3 * t**2 - 1 if ell == 2 else t * (5 * t**2 - 3))


def sh_basis(theta: torch.Tensor, rho: torch.Tensor, factor: torch.Tensor, max_l: int, max_n: int) -> torch.Tensor:
    """``[A]`` angles and radial arguments → ``[A, max_l·max_n]``; see ``matris.model.basis.SphericalExpansion``."""
    t = torch.cos(theta)
    ys = [legendre_reference(ell, t) for ell in range(max_l)]
    feats = []
    for n in range(max_n):
        for j in range(max_l):
            k = n * max_l + j
            feats.append(sh_radial_reference(n, SH_RADIAL_COEFFICIENTS[n][j], rho) * ys[k // max_n] * factor)
    return torch.stack(feats, dim=-1)


bessel_reference = bessel_basis
fourier_reference = fourier_basis
sh_reference = sh_basis


@functools.lru_cache(maxsize=16)
def sh_coefficient_table(dtype, device) -> torch.Tensor:
    """``[4, 4, 8]`` float32 coefficients of R_{n,j}, zero-padded; cached per dtype and device (read-only)."""
    rows = [[[float(c) for c in coeffs] + [0.0] * (8 - len(coeffs)) for coeffs in n_rows]
            for n_rows in SH_RADIAL_COEFFICIENTS]
    return torch.tensor(rows, dtype=torch.float64, device=device).to(dtype).contiguous()


# ---------------------------------------------------------------------------- registered operators
# CUDA kernels in Triton below (CPU too under TRITON_INTERPRET=1), CPU kernels from the C++ library (kernels/native.py);
# fake kernels and autograd make single nodes under torch.compile. create_graph backward: the references.
LIB.define("bessel(Tensor r, Tensor frequencies, float cutoff, int p) -> Tensor")
LIB.define("bessel_backward(Tensor r, Tensor frequencies, float cutoff, int p, Tensor grad, bool freq_grad) "
           "-> (Tensor, Tensor)")
LIB.define("fourier(Tensor theta, Tensor frequencies, float constant) -> Tensor")
LIB.define("fourier_backward(Tensor theta, Tensor frequencies, Tensor grad, bool freq_grad) -> (Tensor, Tensor)")
LIB.define("spherical(Tensor theta, Tensor rho, Tensor factor, int max_l, int max_n) -> Tensor")
LIB.define("spherical_backward(Tensor theta, Tensor rho, Tensor factor, int max_l, int max_n, Tensor grad) "
           "-> (Tensor, Tensor)")


def _grads_fake(x, frequencies, freq_grad):  # (∂L/∂x, ∂L/∂frequencies or empty)
    return torch.empty_like(x), frequencies.new_empty(frequencies.shape if freq_grad else (0,))


torch.library.register_fake("matris::bessel")(lambda r, f, cutoff, p: r.new_empty((r.shape[0], f.shape[0])))
torch.library.register_fake("matris::bessel_backward")(lambda r, f, cutoff, p, grad, fg: _grads_fake(r, f, fg))
torch.library.register_fake("matris::fourier")(lambda t, f, constant: t.new_empty((t.shape[0], 2 * f.shape[0] + 1)))
torch.library.register_fake("matris::fourier_backward")(lambda t, f, grad, fg: _grads_fake(t, f, fg))
torch.library.register_fake("matris::spherical")(lambda t, rho, factor, max_l, max_n: t.new_empty((t.shape[0],
                                                                                                   max_l * max_n)))
torch.library.register_fake("matris::spherical_backward")(lambda t, rho, *_: (torch.empty_like(t),
                                                                              torch.empty_like(rho)))


def _bessel_setup(ctx, inputs, output):
    r, freq, cutoff, p = inputs
    ctx.save_for_backward(r, freq)
    ctx.cutoff, ctx.p = cutoff, p


def _bessel_backward(ctx, grad):
    r, freq = ctx.saved_tensors
    if torch.is_grad_enabled():
        return (*recompute_backward(lambda a, b: bessel_reference(a, b, ctx.cutoff, ctx.p), (r, freq), grad),
                None, None)
    want_f = ctx.needs_input_grad[1]  # frozen frequencies (inference): no per-element sums
    g_r, g_f = torch.ops.matris.bessel_backward(r, freq, ctx.cutoff, ctx.p, grad, want_f)
    return g_r, g_f if want_f else None, None, None


def _fourier_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:2])


def _fourier_backward(ctx, grad):
    theta, freq = ctx.saved_tensors
    if torch.is_grad_enabled():
        return (*recompute_backward(fourier_reference, (theta, freq), grad), None)
    want_f = ctx.needs_input_grad[1]
    g_t, g_f = torch.ops.matris.fourier_backward(theta, freq, grad, want_f)
    return g_t, g_f if want_f else None, None


def _sh_setup(ctx, inputs, output):
    theta, rho, factor, max_l, max_n = inputs
    ctx.save_for_backward(theta, rho, factor)
    ctx.max_l, ctx.max_n = max_l, max_n


def _sh_backward(ctx, grad):
    theta, rho, factor = ctx.saved_tensors
    if torch.is_grad_enabled():
        g_t, g_r = recompute_backward(lambda a, b: sh_reference(a, b, factor, ctx.max_l, ctx.max_n), (theta, rho), grad)
        return g_t, g_r, None, None, None
    g_t, g_r = torch.ops.matris.spherical_backward(theta, rho, factor, ctx.max_l, ctx.max_n, grad)
    return g_t, g_r, None, None, None


torch.library.register_autograd("matris::bessel", _bessel_backward, setup_context=_bessel_setup)
torch.library.register_autograd("matris::fourier", _fourier_backward, setup_context=_fourier_setup)
torch.library.register_autograd("matris::spherical", _sh_backward, setup_context=_sh_setup)


def bessel(r, frequencies, cutoff: float, p: int, fused: bool = True):
    """``[B]`` → ``[B, K]`` Bessel × envelope: the operator (``fused`` and a kernel here), else :func:`bessel_basis`."""
    if not (fused and r.shape[0] and operators_run(r)):
        return bessel_basis(r, frequencies, cutoff, p)
    return torch.ops.matris.bessel(r, frequencies.to(r.dtype), float(cutoff), int(p))


def fourier(theta, frequencies, constant: float = FOURIER_CONSTANT, fused: bool = True):
    """``[A]`` → ``[A, 2m+1]`` Fourier angle basis (as :func:`bessel`; reference :func:`fourier_basis`)."""
    if not (fused and theta.shape[0] and operators_run(theta)):
        return fourier_basis(theta, frequencies, constant)
    return torch.ops.matris.fourier(theta, frequencies.to(theta.dtype), float(constant))


def spherical(theta, rho, factor, max_l: int, max_n: int, fused: bool = True):
    """``[A]``, ``[A]`` → ``[A, max_l·max_n]`` SH angle basis (as :func:`bessel`; reference :func:`sh_basis`)."""
    if not (fused and theta.shape[0] and operators_run(theta, rho)):
        return sh_basis(theta, rho, factor.to(theta.dtype), max_l, max_n)
    return torch.ops.matris.spherical(theta, rho, factor.to(theta.dtype), int(max_l), int(max_n))


# ---------------------------------------------------------------------------- Triton
BLOCK_ROWS = 64

if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _envelope(s, P: tl.constexpr):
        sp = s
        for _ in tl.static_range(P - 1):
            sp = sp * s
        a = (P + 1) * (P + 2) / 2
        b = P * (P + 2)
        c = P * (P + 1) / 2
        f = 1 - a * sp + b * sp * s - c * sp * s * s
        df = (-a * P * sp + b * (P + 1) * sp * s - c * (P + 2) * sp * s * s) / s
        inside = s < 1
        return tl.where(inside, f, 0.0), tl.where(inside, df, 0.0)

    @triton.jit
    def bessel_kernel(r_ptr, f_ptr, out_ptr, grad_ptr, grad_r_ptr, consts_ptr, n_rows,
                      K: tl.constexpr, KP: tl.constexpr, P: tl.constexpr, BACKWARD: tl.constexpr,
                      FREQ_GRAD: tl.constexpr, BLOCK: tl.constexpr):
        """Forward: out[b, k]. Backward: grad_r[b] and, with FREQ_GRAD, per-element ∂/∂freq · grad into out.
        consts: [cutoff, sqrt(2/cutoff)] in the working dtype (scalar arguments would be fp32)."""
        cutoff = tl.load(consts_ptr)
        norm = tl.load(consts_ptr + 1)
        rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, KP)
        rmask = rows < n_rows
        mask = rmask[:, None] & (cols < K)[None, :]
        r = tl.load(r_ptr + rows, mask=rmask, other=1.0)
        freq = tl.load(f_ptr + cols, mask=cols < K, other=0.0)
        s = r / cutoff
        env, denv = _envelope(s, P)
        x = freq[None, :] * s[:, None]
        sin_x = tl.sin(x)
        offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
        if BACKWARD:
            g = tl.load(grad_ptr + offs, mask=mask, other=0.0)
            cos_x = tl.cos(x)
            rr = r[:, None]
            d_r = norm * (cos_x * freq[None, :] / cutoff / rr * env[:, None] - sin_x / (rr * rr) * env[:, None]
                          + sin_x / rr * denv[:, None] / cutoff)
            tl.store(grad_r_ptr + rows, tl.sum(tl.where(mask, g * d_r, 0.0), axis=1), mask=rmask)
            if FREQ_GRAD:
                d_f = norm * cos_x * s[:, None] / rr * env[:, None]
                tl.store(out_ptr + offs, g * d_f, mask=mask)
        else:
            tl.store(out_ptr + offs, norm * sin_x / r[:, None] * env[:, None], mask=mask)

    @triton.jit
    def fourier_kernel(t_ptr, f_ptr, out_ptr, grad_ptr, grad_t_ptr, consts_ptr, n_rows, M: tl.constexpr,
                       MP: tl.constexpr, BACKWARD: tl.constexpr, FREQ_GRAD: tl.constexpr, BLOCK: tl.constexpr):
        """Columns: [c, sin(f_1θ)…sin(f_mθ), cos(f_1θ)…cos(f_mθ)] / √π; consts: [c, 1/√π]."""
        const = tl.load(consts_ptr)
        inv_sqrt_pi = tl.load(consts_ptr + 1)
        rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, MP)
        rmask = rows < n_rows
        mask = rmask[:, None] & (cols < M)[None, :]
        theta = tl.load(t_ptr + rows, mask=rmask, other=0.0)
        freq = tl.load(f_ptr + cols, mask=cols < M, other=0.0)
        x = theta[:, None] * freq[None, :]
        sin_x = tl.sin(x)
        cos_x = tl.cos(x)
        width = 2 * M + 1
        base = rows.to(tl.int64)[:, None] * width
        if BACKWARD:
            g_sin = tl.load(grad_ptr + base + 1 + cols[None, :], mask=mask, other=0.0)
            g_cos = tl.load(grad_ptr + base + 1 + M + cols[None, :], mask=mask, other=0.0)
            common = (g_sin * cos_x - g_cos * sin_x) * inv_sqrt_pi
            tl.store(grad_t_ptr + rows, tl.sum(tl.where(mask, common * freq[None, :], 0.0), axis=1), mask=rmask)
            if FREQ_GRAD:
                tl.store(out_ptr + rows.to(tl.int64)[:, None] * M + cols[None, :], common * theta[:, None], mask=mask)
        else:
            tl.store(out_ptr + rows.to(tl.int64) * width, tl.zeros_like(theta) + const * inv_sqrt_pi, mask=rmask)
            tl.store(out_ptr + base + 1 + cols[None, :], sin_x * inv_sqrt_pi, mask=mask)
            tl.store(out_ptr + base + 1 + M + cols[None, :], cos_x * inv_sqrt_pi, mask=mask)

    @triton.jit
    def _sh_radial(coef_ptr, n: tl.constexpr, j: tl.constexpr, rho):
        """R_{n,j}(ρ) and dR/dρ."""
        base = coef_ptr + (n * 4 + j) * 8
        c0 = tl.load(base + 0)
        c1 = tl.load(base + 1)
        if n == 0:
            val = tl.sin(c0 * rho) / rho
            der = c0 * tl.cos(c0 * rho) / rho - tl.sin(c0 * rho) / (rho * rho)
        else:
            c2 = tl.load(base + 2)
            c3 = tl.load(base + 3)
            if n == 1:
                num = c0 * rho * tl.cos(c1 * rho) + c2 * tl.sin(c3 * rho)
                dnum = c0 * tl.cos(c1 * rho) - c0 * c1 * rho * tl.sin(c1 * rho) + c2 * c3 * tl.cos(c3 * rho)
                den = rho * rho
            else:
                c4 = tl.load(base + 4)
                c5 = tl.load(base + 5)
                if n == 2:
                    num = c0 * rho * rho * tl.sin(c1 * rho) - c2 * rho * tl.cos(c3 * rho) + c4 * tl.sin(c5 * rho)
                    dnum = (2 * c0 * rho * tl.sin(c1 * rho) + c0 * c1 * rho * rho * tl.cos(c1 * rho)
                            - c2 * tl.cos(c3 * rho) + c2 * c3 * rho * tl.sin(c3 * rho) + c4 * c5 * tl.cos(c5 * rho))
                    den = rho * rho * rho
                else:
                    c6 = tl.load(base + 6)
                    c7 = tl.load(base + 7)
                    r2 = rho * rho
                    num = (c0 * r2 * rho * tl.cos(c1 * rho) - c2 * r2 * tl.sin(c3 * rho)
                           - c4 * rho * tl.cos(c5 * rho) + c6 * tl.sin(c7 * rho))
                    dnum = (3 * c0 * r2 * tl.cos(c1 * rho) - c0 * c1 * r2 * rho * tl.sin(c1 * rho)
                            - 2 * c2 * rho * tl.sin(c3 * rho) - c2 * c3 * r2 * tl.cos(c3 * rho)
                            - c4 * tl.cos(c5 * rho) + c4 * c5 * rho * tl.sin(c5 * rho) + c6 * c7 * tl.cos(c7 * rho))
                    den = r2 * r2
            val = num / den
            der = dnum / den - (n + 1) * num / (den * rho)
        return val, der

    @triton.jit
    def _legendre(ell: tl.constexpr, t, consts_ptr):
        """Y_l(t) and dY_l/dt (m = 0) for l = ell; the normalisations are consts[1 + ell]."""
        c = tl.load(consts_ptr + 1 + ell)
        if ell == 0:
            return tl.zeros_like(t) + c, tl.zeros_like(t)
        elif ell == 1:
            return c * t, tl.zeros_like(t) + c
        elif ell == 2:
            return c * (3 * t * t - 1), c * 6 * t
        else:
            return c * t * (5 * t * t - 3), c * (15 * t * t - 3)

    @triton.jit
    def sh_kernel(t_ptr, rho_ptr, coef_ptr, out_ptr, grad_ptr, grad_t_ptr, grad_rho_ptr, consts_ptr, n_rows,
                  MAX_L: tl.constexpr, MAX_N: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
        """Feature k = n·max_l + j is R_{n,j}(ρ)·Y_{k // max_n}(cos θ)·factor; consts: [factor, Y_0…Y_3 norms]."""
        factor = tl.load(consts_ptr)
        rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        rmask = rows < n_rows
        theta = tl.load(t_ptr + rows, mask=rmask, other=0.0)
        rho = tl.load(rho_ptr + rows, mask=rmask, other=1.0)
        t = tl.cos(theta)
        base = rows.to(tl.int64) * (MAX_L * MAX_N)
        g_t = tl.zeros_like(theta)
        g_r = tl.zeros_like(theta)
        for n in tl.static_range(MAX_N):
            for j in tl.static_range(MAX_L):
                radial, d_radial = _sh_radial(coef_ptr, n, j, rho)
                y, dy = _legendre((n * MAX_L + j) // MAX_N, t, consts_ptr)
                if BACKWARD:
                    g = tl.load(grad_ptr + base + (n * MAX_L + j), mask=rmask, other=0.0) * factor
                    g_t += g * radial * dy
                    g_r += g * d_radial * y
                else:
                    tl.store(out_ptr + base + (n * MAX_L + j), radial * y * factor, mask=rmask)
        if BACKWARD:
            tl.store(grad_t_ptr + rows, -tl.sin(theta) * g_t, mask=rmask)
            tl.store(grad_rho_ptr + rows, g_r, mask=rmask)


def _block() -> int:
    return tile(BLOCK_ROWS, 512)


def _grid(n):
    return (max(1, triton.cdiv(n, _block())),)


def _launch_bessel(r, freq, cutoff, p, grad, freq_grad=True):
    n, k = r.shape[0], freq.shape[0]
    out = torch.empty((n, k) if grad is None or freq_grad else (0, k), dtype=r.dtype, device=r.device)
    grad_r = torch.empty_like(r) if grad is not None else r
    if n:
        consts = device_constants((cutoff, math.sqrt(2 / cutoff)), r.dtype, r.device)
        bessel_kernel[_grid(n)](r, freq, out, grad if grad is not None else out, grad_r, consts, n,
                                K=k, KP=triton.next_power_of_2(k), P=p,
                                BACKWARD=grad is not None, FREQ_GRAD=grad is not None and freq_grad, BLOCK=_block())
    return (grad_r, out) if grad is not None else out


def _launch_fourier(theta, freq, grad, freq_grad=True, constant=0.0):
    n, m = theta.shape[0], freq.shape[0]
    if grad is None:
        out = torch.empty((n, 2 * m + 1), dtype=theta.dtype, device=theta.device)
    else:
        out = torch.empty((n if freq_grad else 0, m), dtype=theta.dtype, device=theta.device)
    grad_t = torch.empty_like(theta) if grad is not None else theta
    if n:
        consts = device_constants((constant, 1 / SQRT_PI), theta.dtype, theta.device)
        fourier_kernel[_grid(n)](theta, freq, out, grad if grad is not None else out, grad_t, consts, n,
                                 M=m, MP=max(1, triton.next_power_of_2(m)), BACKWARD=grad is not None,
                                 FREQ_GRAD=grad is not None and freq_grad, BLOCK=_block())
    return (grad_t, out) if grad is not None else out


def _launch_sh(theta, rho, factor, max_l, max_n, grad):
    n = theta.shape[0]
    coef = sh_coefficient_table(theta.dtype, theta.device)
    # factor: the model's buffer, on the device already; the norms are made once per device
    consts = torch.cat([factor.reshape(1).to(device=theta.device, dtype=theta.dtype),
                        device_constants(SH_NORMS, theta.dtype, theta.device)])
    if grad is None:
        out = torch.empty((n, max_l * max_n), dtype=theta.dtype, device=theta.device)
        if n:
            sh_kernel[_grid(n)](theta, rho, coef, out, out, theta, theta, consts, n, MAX_L=max_l, MAX_N=max_n,
                                BACKWARD=False, BLOCK=_block())
        return out
    grad_t, grad_rho = torch.empty_like(theta), torch.empty_like(rho)
    if n:
        sh_kernel[_grid(n)](theta, rho, coef, grad, grad, grad_t, grad_rho, consts, n, MAX_L=max_l, MAX_N=max_n,
                            BACKWARD=True, BLOCK=_block())
    return grad_t, grad_rho


def _bessel_backward_triton(r, freq, cutoff, p, grad, freq_grad):
    g_r, g_f = _launch_bessel(r.contiguous(), freq.contiguous(), cutoff, p, grad.contiguous(), freq_grad)
    return g_r, g_f.sum(0) if freq_grad else freq.new_empty(0)


def _fourier_backward_triton(theta, freq, grad, freq_grad):
    g_t, g_f = _launch_fourier(theta.contiguous(), freq.contiguous(), grad.contiguous(), freq_grad)
    return g_t, g_f.sum(0) if freq_grad else freq.new_empty(0)


register_triton("bessel", lambda r, freq, cutoff, p: _launch_bessel(r.contiguous(), freq.contiguous(), cutoff, p, None))
register_triton("bessel_backward", _bessel_backward_triton)
register_triton("fourier", lambda theta, freq, constant: _launch_fourier(theta.contiguous(), freq.contiguous(), None,
                                                                         constant=constant))
register_triton("fourier_backward", _fourier_backward_triton)
register_triton("spherical", lambda theta, rho, factor, max_l, max_n: _launch_sh(
    theta.contiguous(), rho.contiguous(), factor, max_l, max_n, None))
register_triton("spherical_backward", lambda theta, rho, factor, max_l, max_n, grad: _launch_sh(
    theta.contiguous(), rho.contiguous(), factor, max_l, max_n, grad.contiguous()))
