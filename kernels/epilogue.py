"""Fused epilogue of the gated MLP Φ (spec §5): two norms, the activation, the sigmoid gate
and their product in one pass over the rows.

    out = act(N_c(core)) ⊙ σ(N_g(gate))        core, gate: [n_rows, d] (the two MLP outputs)

N is RMSNorm (``x·w / sqrt(mean(x²) + eps)``, eps = the dtype's machine epsilon, as
``nn.RMSNorm(eps=None)``) or LayerNorm (``(x − μ)·w / sqrt(var + eps) + b``, eps 1e-5). The
reference composes the PyTorch ops: about ten edge-sized tensors are written in the forward
pass and more are read back in the backward. The Triton kernel reads ``core`` and ``gate``
once and writes ``out``; the row statistics are recomputed in the backward kernel, which reads
the two inputs and the incoming gradient once and writes the two input gradients plus
per-program partial sums of the norm-weight gradients (summed by the wrapper).

First-order backward: the fused Triton kernel. With ``create_graph`` (training on forces),
the backward recomputes the PyTorch reference under autograd, which gives exact second
derivatives. ``benchmarks/kernels.py --check`` compares every path with the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import check_dtype, device_constants, recompute_backward, register_cpu, tile, triton_available, use_triton

ACTIVATIONS = ("silu", "relu", "gelu", "softplus", "sigmoid", "tanh")
NORMS = ("rms", "layer")


def _activate(z: torch.Tensor, act: str) -> torch.Tensor:
    # the functional forms of the nn modules that matris.model.layers.activation builds
    if act == "silu":
        return F.silu(z)
    if act == "relu":
        return F.relu(z)
    if act == "gelu":
        return F.gelu(z)  # exact erf form
    if act == "softplus":
        return F.softplus(z)  # beta 1, threshold 20
    if act == "sigmoid":
        return torch.sigmoid(z)
    if act == "tanh":
        return torch.tanh(z)
    raise ValueError(f"unknown activation {act!r}; use one of {ACTIVATIONS}")


def _normalize(x, weight, bias, norm: str, eps: float | None):
    if norm == "rms":
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    if norm == "layer":
        return F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5 if eps is None else eps)
    raise ValueError(f"unknown norm {norm!r}; use one of {NORMS}")


def gated_epilogue_reference(core, gate, core_weight, core_bias, gate_weight, gate_bias, norm: str, act: str,
                             eps: float | None = None) -> torch.Tensor:
    """PyTorch reference: ``act(N(core; w_c, b_c)) ⊙ σ(N(gate; w_g, b_g))`` → ``[n_rows, d]``.

    Biases are None for RMSNorm. ``eps`` None: the dtype's machine epsilon for RMSNorm, 1e-5
    for LayerNorm (the defaults of the modules the model builds).
    """
    a = _activate(_normalize(core, core_weight, core_bias, norm, eps), act)
    return a * torch.sigmoid(_normalize(gate, gate_weight, gate_bias, norm, eps))


def gated_epilogue(core, gate, core_weight, core_bias, gate_weight, gate_bias, norm: str, act: str,
                   eps: float | None = None, backend: str | None = None) -> torch.Tensor:
    """The fused epilogue (Triton) or its reference, chosen as in :mod:`matris.kernels.backend`."""
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; use one of {NORMS}")
    if act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; use one of {ACTIVATIONS}")
    if not use_triton(core.device, backend) or core.shape[0] == 0:
        return gated_epilogue_reference(core, gate, core_weight, core_bias, gate_weight, gate_bias, norm, act, eps)
    check_dtype(core, gate)
    if eps is None:
        eps = torch.finfo(core.dtype).eps if norm == "rms" else 1e-5
    if norm == "rms":  # one kernel signature for both norms: zero biases are never read
        core_bias = gate_bias = None
    return gated_epilogue_op(core, gate, core_weight, core_bias, gate_weight, gate_bias, norm, act, float(eps))


# Custom ops (torch.library) with their autograd formula: single nodes under torch.compile.
@torch.library.custom_op("matris::gated_epilogue", mutates_args=())
def gated_epilogue_op(core: torch.Tensor, gate: torch.Tensor, wc: torch.Tensor, bc: torch.Tensor | None,
                      wg: torch.Tensor, bg: torch.Tensor | None, norm: str, act: str, eps: float) -> torch.Tensor:
    """Triton forward of :func:`gated_epilogue` → ``[n_rows, d]``."""
    return _launch(core.contiguous(), gate.contiguous(), wc, bc, wg, bg, norm, act, eps, None, False)


@gated_epilogue_op.register_fake
def _(core, gate, wc, bc, wg, bg, norm, act, eps):
    return torch.empty_like(core)


@torch.library.custom_op("matris::gated_epilogue_backward", mutates_args=())
def gated_epilogue_backward_op(
    core: torch.Tensor, gate: torch.Tensor, wc: torch.Tensor, bc: torch.Tensor | None, wg: torch.Tensor,
    bg: torch.Tensor | None, norm: str, act: str, eps: float, grad: torch.Tensor, weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton backward: ``(∂L/∂core, ∂L/∂gate, weight sums [4, d])`` (the sums are empty
    without ``weight_grad``)."""
    gc, gg, parts = _launch(core.contiguous(), gate.contiguous(), wc, bc, wg, bg, norm, act, eps, grad.contiguous(),
                            weight_grad)
    return gc, gg, parts.sum(0) if weight_grad else core.new_empty(0)


@gated_epilogue_backward_op.register_fake
def _(core, gate, wc, bc, wg, bg, norm, act, eps, grad, weight_grad):
    return (torch.empty_like(core), torch.empty_like(gate),
            core.new_empty((4, core.shape[1]) if weight_grad else (0,)))


def _setup_context(ctx, inputs, output):
    core, gate, wc, bc, wg, bg, norm, act, eps = inputs
    ctx.save_for_backward(core, gate, wc, bc, wg, bg)
    ctx.norm, ctx.act, ctx.eps = norm, act, eps


def _backward(ctx, grad):
    core, gate, wc, bc, wg, bg = ctx.saved_tensors
    norm, act, eps = ctx.norm, ctx.act, ctx.eps
    if torch.is_grad_enabled():  # create_graph: backward through the reference, exact second order
        if norm == "rms":
            g = recompute_backward(lambda c, s, a, b: gated_epilogue_reference(c, s, a, None, b, None, norm, act, eps),
                                   (core, gate, wc, wg), grad)
            return g[0], g[1], g[2], None, g[3], None, None, None, None
        g = recompute_backward(lambda *t: gated_epilogue_reference(*t, norm, act, eps), (core, gate, wc, bc, wg, bg),
                               grad)
        return (*g, None, None, None)
    weight_grad = any(ctx.needs_input_grad[2:6])
    gc, gg, sums = gated_epilogue_backward_op(core, gate, wc, bc, wg, bg, norm, act, eps, grad, weight_grad)
    gwc = gbc = gwg = gbg = None
    if weight_grad:  # [4, d]: the weight gradients
        gwc, gbc, gwg, gbg = sums[0], sums[1], sums[2], sums[3]
        if norm == "rms":
            gbc = gbg = None
    return gc, gg, gwc, gbc, gwg, gbg, None, None, None


gated_epilogue_op.register_autograd(_backward, setup_context=_setup_context)


def _forward_cpu(core, gate, wc, bc, wg, bg, norm, act, eps):
    """The CPU kernel of ``matris::gated_epilogue``: its reference."""
    return gated_epilogue_reference(core, gate, wc, bc, wg, bg, norm, act, eps)


def activation_slope(z: torch.Tensor, act: str) -> torch.Tensor:
    """``act'(z)`` for the activations of :data:`ACTIVATIONS` (as the Triton kernels compute it)."""
    if act == "silu":
        sg = torch.sigmoid(z)
        return sg * (1 + z * (1 - sg))
    if act == "relu":
        return (z > 0).to(z.dtype)
    if act == "gelu":
        return 0.5 * (1 + torch.erf(z * 0.7071067811865476)) + z * torch.exp(-0.5 * z * z) * 0.3989422804014327
    if act == "softplus":
        return torch.where(z > 20, torch.ones_like(z), torch.sigmoid(z))
    if act == "sigmoid":
        sg = torch.sigmoid(z)
        return sg * (1 - sg)
    if act == "tanh":
        return 1 - torch.tanh(z) ** 2
    raise ValueError(f"unknown activation {act!r}; use one of {ACTIVATIONS}")


def _normalized(x, norm, eps):
    """``(x̂, r)``: the centred (LayerNorm) row times r = 1/sqrt(mean(x̂²) + eps), and r ``[n, 1]``."""
    if norm == "layer":
        x = x - x.mean(-1, keepdim=True)
    r = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return x * r, r


def _backward_cpu(core, gate, wc, bc, wg, bg, norm, act, eps, grad, weight_grad):
    """The CPU kernel of ``matris::gated_epilogue_backward``: the formulas of the Triton kernel
    (input gradients, and the weight sums as ``[4, d]``, zero bias rows for RMSNorm)."""
    c_hat, rc = _normalized(core, norm, eps)
    s_hat, rs = _normalized(gate, norm, eps)
    zc, zs = c_hat * wc, s_hat * wg
    if norm == "layer":
        zc, zs = zc + bc, zs + bg
    a, da, sig = _activate(zc, act), activation_slope(zc, act), torch.sigmoid(zs)
    dzc, dzs = grad * sig * da, grad * a * sig * (1 - sig)
    grads = []
    for dz, w, x_hat, r in ((dzc, wc, c_hat, rc), (dzs, wg, s_hat, rs)):
        dx = dz * w
        g = dx - x_hat * (dx * x_hat).mean(-1, keepdim=True)
        if norm == "layer":
            g = g - dx.mean(-1, keepdim=True)
        grads.append(g * r)
    if not weight_grad:
        return grads[0], grads[1], core.new_empty(0)
    return grads[0], grads[1], torch.stack([(dzc * c_hat).sum(0), dzc.sum(0), (dzs * s_hat).sum(0), dzs.sum(0)])


register_cpu(gated_epilogue_op, _forward_cpu)
register_cpu(gated_epilogue_backward_op, _backward_cpu)


# ---------------------------------------------------------------------------- Triton
BLOCK_ROWS = 4  # rows per tile: 4 × 128 over 128 threads keeps the backward under ~100 registers
WEIGHT_ITERS = 32  # tiles per program when the norm weights train
ACT_CODE = {name: k for k, name in enumerate(ACTIVATIONS)}
NORM_CODE = {name: k for k, name in enumerate(NORMS)}

if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _act_and_slope(z, ACT: tl.constexpr):
        """act(z) and act'(z) for the codes of ACTIVATIONS."""
        if ACT == 0:  # silu
            s = tl.sigmoid(z)
            a = z * s
            da = s + a * (1.0 - s)
        elif ACT == 1:  # relu
            a = tl.maximum(z, 0.0)
            da = tl.where(z > 0.0, 1.0, 0.0).to(z.dtype)
        elif ACT == 2:  # gelu, exact: ½z(1 + erf(z/√2)); slope Φ(z) + z·φ(z)
            cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
            a = z * cdf
            da = cdf + z * tl.exp(-0.5 * z * z) * 0.3989422804014327
        elif ACT == 3:  # softplus, beta 1, threshold 20 (as torch)
            big = z > 20.0
            zs = tl.where(big, 0.0, z)
            a = tl.where(big, z, tl.log(1.0 + tl.exp(zs)))
            da = tl.where(big, 1.0, tl.sigmoid(zs))
        elif ACT == 4:  # sigmoid
            a = tl.sigmoid(z)
            da = a * (1.0 - a)
        else:  # tanh = 2σ(2z) − 1 (tl has no tanh that covers float64)
            a = 2.0 * tl.sigmoid(2.0 * z) - 1.0
            da = 1.0 - a * a
        return a, da

    @triton.jit
    def _row_norm(x, cmask, D, eps, NORM: tl.constexpr):
        """x̂ (zero outside the row) and 1/σ per row: RMS (NORM 0) or Layer (NORM 1) statistics."""
        if NORM == 1:
            mu = tl.sum(x, axis=1) / D
            x = tl.where(cmask[None, :], x - mu[:, None], 0.0)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        return x * r[:, None], r

    @triton.jit
    def gated_epilogue_kernel(core_ptr, gate_ptr, wc_ptr, bc_ptr, wg_ptr, bg_ptr, eps_ptr, grad_ptr, out_ptr,
                              gcore_ptr, ggate_ptr, parts_ptr, n_rows, D, NORM: tl.constexpr, ACT: tl.constexpr,
                              BACKWARD: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BLOCK_R: tl.constexpr,
                              BLOCK_D: tl.constexpr, ITERS: tl.constexpr):
        """``ITERS`` tiles of ``[BLOCK_R, BLOCK_D]`` rows per program (small tiles keep the
        registers per thread low). Forward writes out; backward writes the input gradients and,
        with WEIGHT_GRAD, this program's sums of (dz·x̂, dz) for both norms."""
        pid = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        cmask = cols < D
        eps = tl.load(eps_ptr)
        wc = tl.load(wc_ptr + cols, mask=cmask, other=0.0)[None, :]
        wg = tl.load(wg_ptr + cols, mask=cmask, other=0.0)[None, :]
        if NORM == 1:
            bc = tl.load(bc_ptr + cols, mask=cmask, other=0.0)[None, :]
            bg = tl.load(bg_ptr + cols, mask=cmask, other=0.0)[None, :]
        sum_wc = tl.zeros([BLOCK_D], wc.dtype)
        sum_bc = tl.zeros([BLOCK_D], wc.dtype)
        sum_wg = tl.zeros([BLOCK_D], wc.dtype)
        sum_bg = tl.zeros([BLOCK_D], wc.dtype)
        r0 = pid * (ITERS * BLOCK_R)
        end = tl.minimum(r0 + ITERS * BLOCK_R, n_rows)
        while r0 < end:  # only the tiles that hold rows (a while loop: the interpreter needs it)
            rows = r0 + tl.arange(0, BLOCK_R)
            r0 += BLOCK_R
            mask = (rows < n_rows)[:, None] & cmask[None, :]
            offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
            c = tl.load(core_ptr + offs, mask=mask, other=0.0)
            s = tl.load(gate_ptr + offs, mask=mask, other=0.0)
            c_hat, rc = _row_norm(c, cmask, D, eps, NORM)
            s_hat, rs = _row_norm(s, cmask, D, eps, NORM)
            zc = c_hat * wc
            zs = s_hat * wg
            if NORM == 1:
                zc += bc
                zs += bg
            a, da = _act_and_slope(zc, ACT)
            sig = tl.sigmoid(zs)
            if not BACKWARD:
                tl.store(out_ptr + offs, a * sig, mask=mask)
            else:
                g = tl.load(grad_ptr + offs, mask=mask, other=0.0)
                dzc = g * sig * da
                dzs = g * a * sig * (1.0 - sig)
                dxc = dzc * wc
                dxs = dzs * wg
                # d/dx of x̂ = (x − μ)·r: r·(dx̂ − x̂·mean(dx̂·x̂) [− mean(dx̂) for LayerNorm])
                proj_c = tl.sum(dxc * c_hat, axis=1) / D
                proj_s = tl.sum(dxs * s_hat, axis=1) / D
                gc = dxc - c_hat * proj_c[:, None]
                gs = dxs - s_hat * proj_s[:, None]
                if NORM == 1:
                    gc -= (tl.sum(dxc, axis=1) / D)[:, None]
                    gs -= (tl.sum(dxs, axis=1) / D)[:, None]
                tl.store(gcore_ptr + offs, gc * rc[:, None], mask=mask)
                tl.store(ggate_ptr + offs, gs * rs[:, None], mask=mask)
                if WEIGHT_GRAD:
                    dzc = tl.where(mask, dzc, 0.0)
                    dzs = tl.where(mask, dzs, 0.0)
                    sum_wc += tl.sum(dzc * c_hat, axis=0)
                    sum_bc += tl.sum(dzc, axis=0)
                    sum_wg += tl.sum(dzs * s_hat, axis=0)
                    sum_bg += tl.sum(dzs, axis=0)
        if WEIGHT_GRAD:
            base = parts_ptr + pid.to(tl.int64) * 4 * D + cols
            tl.store(base, sum_wc, mask=cmask)
            tl.store(base + D, sum_bc, mask=cmask)
            tl.store(base + 2 * D, sum_wg, mask=cmask)
            tl.store(base + 3 * D, sum_bg, mask=cmask)


def _launch(core, gate, wc, bc, wg, bg, norm, act, eps, grad, weight_grad):
    n, d = core.shape
    eps_t = device_constants((eps,), core.dtype, core.device)
    wc, wg = wc.to(core.dtype).contiguous(), wg.to(core.dtype).contiguous()
    bc = bc.to(core.dtype).contiguous() if bc is not None else wc  # never read for RMSNorm
    bg = bg.to(core.dtype).contiguous() if bg is not None else wg
    # the weight sums loop over several tiles per program, so the partial sums stay small
    iters = WEIGHT_ITERS if weight_grad else 1
    block_r = tile(BLOCK_ROWS, 64)
    programs = triton.cdiv(n, block_r * iters)
    consts = dict(NORM=NORM_CODE[norm], ACT=ACT_CODE[act], BLOCK_R=block_r,
                  BLOCK_D=max(16, triton.next_power_of_2(d)), ITERS=iters)
    if grad is None:
        out = torch.empty_like(core)
        gated_epilogue_kernel[(programs,)](core, gate, wc, bc, wg, bg, eps_t, core, out, core, core, core, n, d,
                                           BACKWARD=False, WEIGHT_GRAD=False, **consts)
        return out
    gc, gg = torch.empty_like(core), torch.empty_like(gate)
    parts = torch.empty((programs, 4, d), dtype=core.dtype, device=core.device) if weight_grad else core
    gated_epilogue_kernel[(programs,)](core, gate, wc, bc, wg, bg, eps_t, grad, core, gc, gg, parts, n, d,
                                       BACKWARD=True, WEIGHT_GRAD=weight_grad, **consts)
    return gc, gg, parts if weight_grad else None
