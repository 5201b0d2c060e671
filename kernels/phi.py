"""The whole gated Φ of an edge update (spec §5), fused for the CPU: first layer, gathers,
activation, second layers and the gated epilogue in one pass over the rows
(``matris::gated_phi``, C++ kernel in ``csrc/cpu/phi.cpp``).

    pre  = R·W_rᵀ + Σ_k P_k[idx_k] + b₁                 [E, 2H]  (core ‖ gate halves)
    hid  = silu(pre)
    core = hid_c·W_cᵀ + b_c,   gate = hid_g·W_gᵀ + b_g  [E, d]
    out  = silu(N_c(core)) ⊙ σ(N_g(gate))               [E, d]

R ``[E, d_r]`` is the per-row term (the angle features on the line graph; None when every
term is gathered), ``P_k [n_k, 2H]`` the per-node projections of the projection rewrite
(``matris.model.layers``) and N the norm: RMSNorm ``N(x) = x·r·w``, ``r = 1/sqrt(mean(x²) + eps)``,
or LayerNorm ``N(x) = x̄·r·w + b`` with ``x̄ = x − mean(x)`` and ``r = 1/sqrt(mean(x̄²) + eps)``
(the published 10M models). This is ``GatedMLP.forward_terms`` with SiLU; the Triton kernels
:func:`gather_sum_activate` and :func:`gated_epilogue` compute the same quantities on GPU.

Why: on a CPU these tensors (29k angles × 256 floats for Si64) do not fit in cache, and the
composed PyTorch ops make about fifteen passes over them in each direction, each allocating
a fresh tensor. Here each thread runs every step on blocks of 24 of its rows while they are in
L2 (the GEMMs in a register kernel that reads the weights packed once per call). The forward keeps ``silu'(pre)`` in place of ``pre`` (so the backward
multiplies by it instead of recomputing it), ``core`` and ``gate`` (centred for LayerNorm),
``σ(gn)`` and the two row statistics r (4H + d + 2 floats per row, less than the composed ops
keep); the backward reads them once per block:

    G_cn = silu'(cn) ⊙ σ(gn) ⊙ G,       G_gn = σ'(gn) ⊙ silu(cn) ⊙ G,      X_c = w_c ⊙ G_cn
    G_core = r_c·X_c − core·r_c³·mean(X_c ⊙ core) [− r_c·mean(X_c) for LayerNorm]   (likewise gate)
    G_pre = silu'(pre) ⊙ [G_core·W_c ‖ G_gate·W_g]
    G_R = G_pre·W_r,   G_{P_k} = index_add(idx_k, G_pre)

The backward's ∂L/∂P_k are summed every ``chunk`` rows (threads own channel ranges, rows in
order: the same sums for any thread count).

The fused backward gives input gradients only (the weights are frozen at inference, see
``MatRIS.forward``). When weight gradients or a graph of the backward are wanted (training
on forces), it recomputes the PyTorch reference under autograd: exact second derivatives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from .backend import recompute_backward

Term = tuple[torch.Tensor, "torch.Tensor | None"]
# Rows per chunk of the backward's scatter: a [chunk, 2H] buffer of 4 MiB (4,096 float32 rows for
# H = 128), measured fastest on a 2-core EPYC (1 MiB L2 per core, 32 MiB L3) against 0.25-32 MiB.
CHUNK_BYTES = 4 << 20


def gated_phi_reference(rows: torch.Tensor | None, row_weight: torch.Tensor | None, terms: list[Term],
                        bias1: torch.Tensor, core_weight: torch.Tensor, core_bias: torch.Tensor,
                        gate_weight: torch.Tensor, gate_bias: torch.Tensor, core_norm: torch.Tensor,
                        gate_norm: torch.Tensor, eps: float, *, norm: str = "rms",
                        core_norm_bias: torch.Tensor | None = None,
                        gate_norm_bias: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch reference of the formula in the module docstring → ``[E, d]``.

    rows ``[E, d_r]`` and row_weight ``[2H, d_r]`` (or both None); terms ``(P_k [n_k, 2H],
    idx_k [E])``; bias1 ``[2H]``; core/gate weight ``[d, H]`` and bias ``[d]``; core/gate
    norm ``[d]`` (the norms' weights); eps the norms' epsilon. ``norm``: ``"rms"`` (RMSNorm) or
    ``"layer"`` (LayerNorm, with the biases ``core_norm_bias``/``gate_norm_bias [d]``, None for none).
    """
    pre = bias1
    if rows is not None:
        pre = pre + rows @ row_weight.T
    for proj, index in terms:
        pre = pre + proj.index_select(0, index)
    hid = F.silu(pre)
    h = core_weight.shape[1]
    core = F.linear(hid[:, :h], core_weight, core_bias)
    gate = F.linear(hid[:, h:], gate_weight, gate_bias)
    d = core.shape[-1]
    if norm == "layer":
        cn = F.layer_norm(core, (d,), core_norm, core_norm_bias, eps)
        gn = F.layer_norm(gate, (d,), gate_norm, gate_norm_bias, eps)
    else:
        cn, gn = F.rms_norm(core, (d,), core_norm, eps), F.rms_norm(gate, (d,), gate_norm, eps)
    return F.silu(cn) * torch.sigmoid(gn)


NORMS = ("rms", "layer")


def gated_phi(rows, row_weight, terms, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm, gate_norm,
              eps: float, chunk: int | None = None, *, norm: str = "rms", core_norm_bias=None,
              gate_norm_bias=None) -> torch.Tensor:
    """The fused Φ (same arguments as :func:`gated_phi_reference`; ``chunk``: rows per chunk of the
    backward's scatter, default sized to the cache). At least one term or ``rows`` must be given.
    Runs the operator ``matris::gated_phi`` (:mod:`.native`); where it cannot run (no compiler,
    tensors that are not float32/float64 CPU tensors) the reference, with the same numbers."""
    if norm not in NORMS:
        raise ValueError(f"gated_phi: norm must be one of {NORMS}, got {norm!r}")
    n = rows.shape[0] if rows is not None else terms[0][1].shape[0]
    projs, indices = [p for p, _ in terms], [i for _, i in terms]
    if n == 0 or not native.usable(bias1, *projs, *indices):
        return gated_phi_reference(rows, row_weight, terms, bias1, core_weight, core_bias, gate_weight, gate_bias,
                                   core_norm, gate_norm, eps, norm=norm, core_norm_bias=core_norm_bias,
                                   gate_norm_bias=gate_norm_bias)
    if chunk is None:
        chunk = max(64, CHUNK_BYTES // (bias1.shape[0] * bias1.element_size()))
    layer = norm == "layer"
    if layer:  # the loops read both biases: zeros stand in for a missing one
        core_norm_bias = core_norm_bias if core_norm_bias is not None else torch.zeros_like(core_norm)
        gate_norm_bias = gate_norm_bias if gate_norm_bias is not None else torch.zeros_like(gate_norm)
    else:
        core_norm_bias = gate_norm_bias = None
    return torch.ops.matris.gated_phi(rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias,
                                      core_norm, gate_norm, core_norm_bias, gate_norm_bias, projs, indices,
                                      float(eps), layer, int(chunk))[0]


# ---------------------------------------------------------------------------- registered operators
# matris::gated_phi (forward: the output and what the backward reads) and matris::gated_phi_backward
# (input gradients) are defined, with their CPU kernels, in the C++ library (csrc/ops.cpp,
# csrc/cpu/phi.cpp); here, once it is loaded, their fake kernels (shapes) and autograd: the backward
# operator where only input gradients are wanted (inference), else the reference under autograd
# (weight gradients, create_graph: exact second order).
def _phi_buffers(rows, indices, bias1, core_weight):
    n = rows.shape[0] if rows is not None else indices[0].shape[0]
    two_h, d = bias1.shape[0], core_weight.shape[0]
    shapes = ((n, d), (n, two_h), (n, d), (n, d), (n, 1), (n, 1), (n, d))
    return tuple(bias1.new_empty(shape) for shape in shapes)


def _phi_fake(rows, row_weight, bias1, core_weight, core_bias, gate_weight, gate_bias, core_norm, gate_norm,
              core_norm_bias, gate_norm_bias, projections, indices, eps, layer, chunk):
    return _phi_buffers(rows, indices, bias1, core_weight)


def _phi_grad_buffers(grad, row_weight, slope, projection_rows, want_rows, want_projections):
    """∂L/∂rows ``[E, d_r]`` and ∂L/∂P_k ``[n_k, 2H]``, or empty tensors where a gradient is not wanted."""
    g_rows = grad.new_empty((grad.shape[0], row_weight.shape[1]) if want_rows else (0,))
    g_projs = [slope.new_empty((rows, slope.shape[1])) if want else slope.new_empty((0,))
               for rows, want in zip(projection_rows, want_projections)]
    return g_rows, g_projs


def _phi_backward_fake(grad, row_weight, core_weight, gate_weight, core_norm, gate_norm, core_norm_bias, slope, core,
                       gate, r_c, r_g, sig, indices, projection_rows, want_rows, want_projections, layer, chunk):
    g_rows, g_projs = _phi_grad_buffers(grad, row_weight, slope, projection_rows, want_rows, want_projections)
    return [g_rows, *g_projs]


def _phi_setup(ctx, inputs, output):
    (rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, projs, indices, eps, layer, chunk) = inputs
    _, slope, core, gate, r_c, r_g, sig = output
    ctx.set_materialize_grads(False)  # only the first output is differentiable; the others get None
    ctx.save_for_backward(rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, slope, core, gate, r_c, r_g,
                          sig, *projs, *indices)
    ctx.eps, ctx.layer, ctx.chunk, ctx.n_terms = eps, layer, chunk, len(projs)
    ctx.want_rows = rows is not None and rows.requires_grad
    ctx.want_weights = any(t is not None and t.requires_grad for t in (row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc,
                                                                       nbg))
    ctx.want_projections = [p.requires_grad for p in projs]


def _phi_backward(ctx, grad, *_unused):
    saved = ctx.saved_tensors
    rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, slope, core, gate, r_c, r_g, sig = saved[:17]
    projs, indices = list(saved[17 : 17 + ctx.n_terms]), list(saved[17 + ctx.n_terms :])
    eps, layer = ctx.eps, ctx.layer
    if grad is None:  # Φ's output reaches no loss
        return (None, None, *[None] * 9, [None] * len(projs), [None] * len(indices), None, None, None)
    if torch.is_grad_enabled() or ctx.want_weights:
        # create_graph or weight gradients: the reference under autograd (exact second order)
        k = ctx.n_terms
        none = bias1.new_zeros(0)

        def ref(*xs):
            r = xs[0] if rows is not None else None
            rw = xs[1] if rows is not None else None
            return gated_phi_reference(r, rw, list(zip(xs[11 : 11 + k], indices)), *xs[2:9], eps,
                                       norm="layer" if layer else "rms", core_norm_bias=xs[9] if layer else None,
                                       gate_norm_bias=xs[10] if layer else None)

        inputs = (rows if rows is not None else none, row_weight if rows is not None else none, bias1, wc, bc, wg,
                  bg, nc, ng, nbc if layer else none, nbg if layer else none, *projs)
        g = recompute_backward(ref, inputs, grad)
        g_rows, g_rw = (g[0], g[1]) if rows is not None else (None, None)
        g_nb = (g[9], g[10]) if layer else (None, None)
        return (g_rows, g_rw, *g[2:9], *g_nb, list(g[11:]), [None] * k, None, None, None)
    grads = torch.ops.matris.gated_phi_backward(grad, row_weight, wc, wg, nc, ng, nbc, slope, core, gate, r_c, r_g, sig, indices,
                                  [p.shape[0] for p in projs], ctx.want_rows, ctx.want_projections, layer, ctx.chunk)
    g_rows = grads[0] if ctx.want_rows else None
    g_projs = [g if want else None for g, want in zip(grads[1:], ctx.want_projections)]
    return (g_rows, *[None] * 10, g_projs, [None] * len(indices), None, None, None)


def register_operators() -> None:
    """Fake kernels and autograd of the C++ operators (called by :mod:`.native` once it loaded them)."""
    torch.library.register_fake("matris::gated_phi")(_phi_fake)
    torch.library.register_fake("matris::gated_phi_backward")(_phi_backward_fake)
    torch.library.register_autograd("matris::gated_phi", _phi_backward, setup_context=_phi_setup)
