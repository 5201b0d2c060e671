"""The fused operators (``torch.ops.matris.*``): schema, fake (meta) kernels, autograd registration
and AOT dispatch with dynamic shapes, checked by ``torch.library.opcheck`` on float32 and float64
samples with a single row, row counts that are no multiple of the vector width, projection rows
that no row reads, and no rows at all; and each operator against its reference in float64.

In this process the operators run their C++ CPU kernels. Under ``TRITON_INTERPRET=1`` they run
their CUDA kernels (Triton, interpreted on CPU tensors): ``tests/test_triton_kernels.py`` runs this
file that way, and :func:`test_triton_kernels_return_what_the_cpu_kernels_return` compares the two
kernels' outputs, every tensor of each operator's forward and backward."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from matris.kernels import Segments, native
from matris.kernels.backend import interpreting, triton_available
from matris.kernels.phi import gated_phi_reference

RUNS = triton_available() if interpreting() else native.library() is not None
pytestmark = pytest.mark.skipif(not RUNS, reason="no kernel: no C++ compiler (or triton under TRITON_INTERPRET=1)")


def _phi_sample(dtype, e, layer, with_rows, seed=0, b=7, d_r=5, h=8, d=12, keep_hidden=False):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, grad=False, positive=False):
        t = torch.randn(*shape, generator=g, dtype=torch.float64)
        t = (t.abs() + 0.5 if positive else t).to(dtype)
        return t.requires_grad_(grad)

    rows = r(e, d_r, grad=True) if with_rows else None
    row_weight = r(2 * h, d_r) if with_rows else None
    # indices below b - 2: the last projection rows are read by no row
    projections = [r(b, 2 * h, grad=True), r(b, 2 * h)]  # the second frozen: no gradient asked for it
    indices = [torch.randint(0, b - 2, (e,), generator=g) for _ in projections]
    weights = [r(2 * h), r(d, h), r(d), r(d, h), r(d), r(d, positive=True), r(d, positive=True)]
    norm_biases = [r(d), r(d)] if layer else [None, None]
    eps = 1e-5 if layer else torch.finfo(dtype).eps
    args = (rows, row_weight, *weights, *norm_biases, projections, indices, eps, layer, 4, keep_hidden)
    return args


def _samples():
    for dtype in (torch.float64, torch.float32):
        for layer in (False, True):
            for e, with_rows, keep in ((1, True, False), (37, True, True), (37, False, False), (0, True, True)):
                yield pytest.param(dtype, layer, e, with_rows, keep,
                                   id=f"{str(dtype)[6:]}-{'layer' if layer else 'rms'}-{e}rows-{with_rows}-keep{keep}")


@pytest.mark.parametrize("dtype,layer,e,with_rows,keep", list(_samples()))
def test_gated_phi_operator_passes_opcheck(dtype, layer, e, with_rows, keep):
    args = _phi_sample(dtype, e, layer, with_rows, keep_hidden=keep)
    torch.library.opcheck(torch.ops.matris.gated_phi.default, args)


@pytest.mark.parametrize("layer", [False, True])
def test_gated_phi_operator_equals_its_reference_in_float64(layer):
    args = _phi_sample(torch.float64, 37, layer, True)
    rows, row_weight, *rest = args
    weights, (nbc, nbg), (projections, indices), eps = rest[:7], rest[7:9], rest[9:11], rest[11]
    got = torch.ops.matris.gated_phi(*args)[0]  # keep_hidden False: the input gradients only
    want = gated_phi_reference(rows, row_weight, list(zip(projections, indices)), *weights, eps,
                               norm="layer" if layer else "rms", core_norm_bias=nbc, gate_norm_bias=nbg)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(want)
    wanted = [rows, projections[0]]
    for a, b in zip(torch.autograd.grad(got, wanted, grad), torch.autograd.grad(want, wanted, grad)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _attention_sample(dtype, e, form, seed=1, n=7, c=6, d=5):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, grad=False):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_(grad)

    target = torch.randint(0, n - 2, (e,), generator=g)  # the last two nodes have no edges
    source = torch.randint(0, n, (e,), generator=g)
    m = r(e, c, grad=True)
    # the CSR order the CUDA kernel walks (the CPU kernel takes an empty list)
    csr = [t for seg in (Segments.from_index(target, n), Segments.from_index(source, n))
           for t in (seg.order, seg.offsets)] if interpreting() else []
    if form == "atom":  # per-bond projected logits read through an index
        b = 4
        return (r(b, 2 * c, grad=True), None, torch.randint(0, b, (e,), generator=g), m, target, source, n, None, csr)
    rows = r(e, c if form == "residual" else d, grad=True)
    res = r(1, c) if form == "residual" else None
    return (rows, r(2 * c, rows.shape[1]), None, m, target, source, n, res, csr)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("form", ["line", "residual", "atom"])
@pytest.mark.parametrize("e", [1, 37])
def test_attention_pair_operator_passes_opcheck(dtype, form, e):
    torch.library.opcheck(torch.ops.matris.attention_pair.default, _attention_sample(dtype, e, form))


@pytest.mark.parametrize("form", ["line", "residual", "atom"])
def test_attention_pair_lse_gradients_equal_the_reference_in_float64(form):
    """attention_pair_lse (the operator, its backward folding ∂L/∂lse in) against its reference:
    every output, and the input gradients for a loss on all of them, empty segments included."""
    from matris.kernels import attention_pair_lse

    rows, weight, row_index, m, target, source, n, res, _ = _attention_sample(torch.float64, 37, form)
    g = torch.Generator().manual_seed(5)
    results = []
    # the operator's own backward; with a weight gradient wanted, its reference recomputed under
    # autograd; the reference
    for fused, weight_grad in ((True, False), (True, True), (False, False)):
        xs = [rows.detach().clone().requires_grad_(True), m.detach().clone().requires_grad_(True)]
        w = weight.detach().clone().requires_grad_(weight_grad) if weight is not None else None
        out = [o for o in attention_pair_lse(xs[0], w, row_index, xs[1], target, source, n, res, fused=fused)
               if o is not None]
        g.manual_seed(5)
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in out)
        results.append([o.detach() for o in out] + list(torch.autograd.grad(loss, xs)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), (a - b).abs().max()


def _refine_sample(dtype, e, edges, smooth, seed=2, b=5, n=6, c=6):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, grad=False, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_(grad)

    src = torch.randint(0, b, (e,), generator=g)
    tgt = torch.randint(0, n - 2, (e,), generator=g)  # nodes without edges
    ffn = (r(e, c, grad=True), r(1, c), r(c, c, scale=0.3), r(c), r(c, c, scale=0.3), r(c)) if edges else \
        (None,) * 6
    return (r(e, c, grad=True), r(b, c, grad=True), src, tgt, n, *ffn, smooth, 4, edges)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("edges,smooth", [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("e", [1, 37])
def test_refine_edges_operator_passes_opcheck(dtype, edges, smooth, e):
    torch.library.opcheck(torch.ops.matris.refine_edges.default, _refine_sample(dtype, e, edges, smooth))


def _every_output(seed=3):
    """Each operator's forward outputs and backward outputs on fixed float64 samples (both norms, the
    three attention forms, Refine with and without the edge update)."""
    out = {}
    for layer in (False, True):
        args = _phi_sample(torch.float64, 37, layer, True, seed=seed)
        rows, row_weight, bias1, wc, bc, wg, bg, nc, ng, nbc, nbg, projs, indices, eps, lay, chunk, _ = args
        fwd = torch.ops.matris.gated_phi(*args[:-1], True)  # keep_hidden: hid too
        grad = torch.randn(fwd[0].shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        bwd = torch.ops.matris.gated_phi_backward(grad, row_weight, wc, wg, nc, ng, nbc, nbg, *fwd[1:6], indices,
                                                  [p.shape[0] for p in projs], True, [True, True], lay, chunk, True)
        out[f"phi-{layer}"] = [t.detach() for t in (*fwd, *bwd)]
    for form in ("line", "residual", "atom"):
        rows, w, ri, m, tgt, src, n, res, csr = _attention_sample(torch.float64, 37, form, seed=seed)
        fwd = torch.ops.matris.attention_pair(rows, w, ri, m, tgt, src, n, res, csr)
        g = torch.Generator().manual_seed(seed)
        g_t, g_s = (torch.randn(fwd[0].shape, generator=g, dtype=torch.float64) for _ in range(2))
        g_y = torch.randn(m.shape, generator=g, dtype=torch.float64) if res is not None else None
        bwd = torch.ops.matris.attention_pair_backward(g_t, g_s, g_y, rows, w, ri, m, tgt, src, fwd[3], fwd[1],
                                                       fwd[0], fwd[4], fwd[5], res, True, True, True)
        # α of the atom form is not returned by the CPU kernel either: both give an empty tensor
        out[f"attention-{form}"] = [t.detach() for t in (*fwd, *bwd)]
    for edges, smooth in ((True, False), (True, True), (False, False)):
        args = _refine_sample(torch.float64, 37, edges, smooth, seed=seed)
        u, q, src, tgt, n, y, rw, w1, b1, w2, b2, sm, chunk, _ = args
        fwd = torch.ops.matris.refine_edges(*args)
        g = torch.Generator().manual_seed(seed)
        g_agg = torch.randn(fwd[0].shape, generator=g, dtype=torch.float64)
        g_y = torch.randn(u.shape, generator=g, dtype=torch.float64) if edges else None
        bwd = torch.ops.matris.refine_edges_backward(g_agg, g_y, u, q, src, tgt, w1, w2, fwd[2], rw, sm, chunk,
                                                     True, True, edges, True)
        out[f"refine-{edges}-{smooth}"] = [t.detach() for t in (*fwd, *bwd)]
    return out


@pytest.mark.skipif(interpreting() or not triton_available(), reason="compares with the interpreted Triton kernels")
@pytest.mark.slow
def test_triton_kernels_return_what_the_cpu_kernels_return(tmp_path):
    """The same operator, its two kernels: every tensor of the forward (what the backward reads
    included) and of the backward, C++ here against Triton (interpreted) in a subprocess, float64."""
    dump = tmp_path / "triton.pt"
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import torch, test_operators as t; "
            f"torch.save(t._every_output(), {str(dump)!r})")
    env = {k: v for k, v in os.environ.items() if k != "MATRIS_KERNELS"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=dict(env, TRITON_INTERPRET="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    triton_out, cpu_out = torch.load(dump), _every_output()
    assert triton_out.keys() == cpu_out.keys()
    for key, tensors in cpu_out.items():
        assert len(tensors) == len(triton_out[key]), key
        for k, (want, got) in enumerate(zip(tensors, triton_out[key])):
            assert got.shape == want.shape, (key, k, got.shape, want.shape)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f"{key}: output {k}")


def _basis_samples(dtype, e, seed=4):
    """(name, operator, args) of each basis operator: bond lengths across the cutoff (the envelope's
    zero), angles over [0, π], SH radial arguments around 1/r_c; frequencies as a learnable tensor."""
    g = torch.Generator().manual_seed(seed)
    r = (torch.rand(e, generator=g, dtype=torch.float64) * 6.5 + 0.3).to(dtype).requires_grad_()
    theta = (torch.rand(e, generator=g, dtype=torch.float64) * 3.1).to(dtype).requires_grad_()
    rho = (torch.rand(e, generator=g, dtype=torch.float64) * 0.2 + 0.1).to(dtype).requires_grad_()
    freq_b = (torch.arange(1, 8, dtype=torch.float64) * 3.14159).to(dtype).requires_grad_()
    freq_f = torch.arange(1, 4, dtype=torch.float64).to(dtype).requires_grad_()
    factor = torch.tensor(0.2, dtype=dtype)
    return [("bessel", torch.ops.matris.bessel.default, (r, freq_b, 6.0, 8)),
            ("fourier", torch.ops.matris.fourier.default, (theta, freq_f, 0.5 ** 0.5)),
            ("spherical", torch.ops.matris.spherical.default, (theta, rho, factor, 4, 4))]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("e", [1, 37, 2500])  # 2500: more than one chunk of the frequency sums
def test_basis_operators_pass_opcheck(dtype, e):
    for name, op, args in _basis_samples(dtype, e):
        torch.library.opcheck(op, args)


def test_basis_operators_equal_their_references_in_float64():
    from matris.kernels.basis import bessel_reference, fourier_reference, sh_reference

    refs = {"bessel": lambda r, f, c, p: bessel_reference(r, f, c, p),
            "fourier": lambda t, f, c: fourier_reference(t, f, c),
            "spherical": lambda t, rho, fac, ml, mn: sh_reference(t, rho, fac, ml, mn)}
    for name, op, args in _basis_samples(torch.float64, 2500):
        got, want = op(*args), refs[name](*args)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)
        grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(5), dtype=want.dtype)
        wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        for a, b in zip(torch.autograd.grad(got, wanted, grad), torch.autograd.grad(want, wanted, grad)):
            # the frequencies' gradients are sums over 2,500 rows, in another order than the reference's
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12 * float(b.abs().max()) * 100, msg=name)
        small = [a.detach()[:9].requires_grad_() if isinstance(a, torch.Tensor) and a.shape == (2500,) else a
                 for a in args]
        assert torch.autograd.gradcheck(lambda *t: op(*t), small), name


@pytest.mark.skipif(interpreting() or native.library() is None, reason="the C++ kernels' thread counts")
def test_basis_frequency_sums_do_not_depend_on_the_thread_count():
    before = torch.get_num_threads()
    try:
        sums = []
        for threads in (1, 3):
            torch.set_num_threads(threads)
            r, f, c, p = _basis_samples(torch.float32, 5000)[0][2]
            sums.append(torch.ops.matris.bessel_backward(r.detach(), f.detach(), c, p, torch.ones(5000, 7), True))
        assert all(torch.equal(a, b) for a, b in zip(*sums))
    finally:
        torch.set_num_threads(before)
