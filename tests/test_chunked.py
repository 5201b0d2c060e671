"""The fused operators (kernels/phi.py, refine.py, aggregate.attention_pair: the C++ kernels of
kernels/csrc/cpu here, their Triton kernels under TRITON_INTERPRET=1, as tests/test_triton_kernels.py
runs this file) against their PyTorch references in float64: values, first derivatives through the
fused backward, gradcheck and exact second derivatives (gradgradcheck), and the whole model against
the composed ops on the fixtures."""

import pytest
import torch
from ase.io import read

from conftest import FIXTURES, FOLDERS, evaluate, load_fixture_model, load_reference, profiled_operator_counts
from matris.kernels import (
    attention_pair,
    attention_pair_reference,
    gated_phi,
    gated_phi_reference,
    native,
    refine_edges,
    refine_edges_reference,
)
from matris.kernels.backend import interpreting, triton_available
from matris.structures import to_system

F64 = torch.float64


@pytest.fixture
def loops():
    """The operators' kernels (without them the wrappers run their references: nothing to compare)."""
    if not (triton_available() if interpreting() else native.library() is not None):
        pytest.skip("the fused CPU library cannot be built here (no C++ compiler)")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def phi_case(rows_term: bool, seed=0, e=37, b=9, d_r=5, h=4, d=6):
    g = _gen(seed)
    def r(*s):
        return torch.randn(*s, generator=g, dtype=F64)

    rows = r(e, d_r) if rows_term else None
    row_weight = r(2 * h, d_r) if rows_term else None
    terms = [(r(b, 2 * h), torch.randint(0, b, (e,), generator=g)) for _ in range(2)]
    weights = [r(2 * h), r(d, h), r(d), r(d, h), r(d), r(d).abs() + 0.5, r(d).abs() + 0.5]
    return rows, row_weight, terms, weights


def phi_norm(norm: str, d=6, seed=5) -> dict:
    """The norm arguments of gated_phi: RMSNorm, or LayerNorm with biases."""
    if norm == "rms":
        return {}
    g = _gen(seed)
    return dict(norm="layer", core_norm_bias=torch.randn(d, generator=g, dtype=F64),
                gate_norm_bias=torch.randn(d, generator=g, dtype=F64))


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("rows_term", [True, False])
@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("weights", [False, True], ids=["inputs", "weights"])
def test_gated_phi_matches_reference(rows_term, chunk, norm, weights):
    """Values and first derivatives: of the inputs (the fused backward, as at inference), and with
    ``weights`` of every weight too (the fused backward's weight gradients, as in a training step's
    first-order passes)."""
    rows, rw, terms, w = phi_case(rows_term)
    eps = torch.finfo(F64).eps if norm == "rms" else 1e-5
    kw = phi_norm(norm)
    inputs = ([rows] if rows_term else []) + [p for p, _ in terms]
    if weights:
        inputs += ([rw] if rows_term else []) + w + [kw[k] for k in ("core_norm_bias", "gate_norm_bias") if k in kw]
    for x in inputs:
        x.requires_grad_(True)
    grad = torch.randn(37, 6, generator=_gen(1), dtype=F64)
    want = gated_phi_reference(rows, rw, terms, *w, eps, **kw)
    got = gated_phi(rows, rw, terms, *w, eps, chunk=chunk, **kw)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    for a, b in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(want, inputs, grad)):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_gated_phi_gradcheck_and_gradgradcheck(norm):
    rows, rw, terms, w = phi_case(True, e=11, b=4)
    eps = torch.finfo(F64).eps if norm == "rms" else 1e-5
    kw = phi_norm(norm)
    idx = [i for _, i in terms]
    (p1, _), (p2, _) = terms

    def inputs_only(r, a, b):  # frozen weights: the fused chunked backward
        return gated_phi(r, rw, [(a, idx[0]), (b, idx[1])], *w, eps, chunk=4, **kw)

    x = [t.clone().requires_grad_(True) for t in (rows, p1, p2)]
    assert torch.autograd.gradcheck(inputs_only, x)
    assert torch.autograd.gradgradcheck(inputs_only, x)

    biases = [kw[k] for k in ("core_norm_bias", "gate_norm_bias") if k in kw]

    def everything(r, rw_, a, b, *ws):  # weights too: the reference backward, exact second order
        more = dict(norm=norm, core_norm_bias=ws[7], gate_norm_bias=ws[8]) if biases else {}
        return gated_phi(r, rw_, [(a, idx[0]), (b, idx[1])], *ws[:7], eps, chunk=4, **more)

    x = [t.clone().requires_grad_(True) for t in (rows, rw, p1, p2, *w, *biases)]
    assert torch.autograd.gradcheck(everything, x)
    assert torch.autograd.gradgradcheck(everything, x)


def attention_case(projected: bool, seed=0, e=41, n=7, c=3, d=4):
    g = _gen(seed)
    def r(*s):
        return torch.randn(*s, generator=g, dtype=F64) * 3

    m = r(e, c)
    tgt = torch.randint(0, n - 2, (e,), generator=g)  # the last two nodes have no edges
    src = torch.randint(0, n, (e,), generator=g)
    if projected:
        return r(9, 2 * c), None, torch.randint(0, 9, (e,), generator=g), m, tgt, src, n
    return r(e, d), r(2 * c, d), None, m, tgt, src, n


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("projected", [False, True])
@pytest.mark.parametrize("chunk", [1, 6, 100])
def test_attention_pair_matches_reference(projected, chunk):
    rows, w, ri, m, tgt, src, n = attention_case(projected)
    rows.requires_grad_(True)
    m.requires_grad_(True)
    gt, gs = torch.randn(n, 3, generator=_gen(2), dtype=F64), torch.randn(n, 3, generator=_gen(3), dtype=F64)
    want = attention_pair_reference(rows, w, ri, m, tgt, src, n)
    got = attention_pair(rows, w, ri, m, tgt, src, n)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    assert torch.all(got[0][n - 2:] == 0)  # empty segments aggregate to zero, not NaN
    ga = torch.autograd.grad(got, [rows, m], [gt, gs])
    gb = torch.autograd.grad(want, [rows, m], [gt, gs])
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("projected", [False, True])
def test_attention_pair_gradcheck_and_gradgradcheck(projected):
    rows, w, ri, m, tgt, src, n = attention_case(projected, e=13, n=5)

    def fn(r, msg):
        return attention_pair(r, w, ri, msg, tgt, src, n)

    x = [rows.clone().requires_grad_(True), m.clone().requires_grad_(True)]
    assert torch.autograd.gradcheck(fn, x)
    assert torch.autograd.gradgradcheck(fn, x)


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("chunk", [1, 6, 100])
@pytest.mark.parametrize("weights", [False, True], ids=["inputs", "weights"])
def test_attention_pair_with_the_residual_matches_reference(chunk, weights):
    """The line-graph form with the edges' residual y' = m + w ⊙ rows computed in the same pass: its
    value and the gradients with y' used (∂L/∂m and ∂L/∂rows gain G_y' and w ⊙ G_y') or unused;
    with ``weights`` also the projection's and the residual weight's (the fused backward's)."""
    rows, w, _, m, tgt, src, n = attention_case(False, d=3)
    rw = torch.randn(1, 3, generator=_gen(4), dtype=F64)
    wanted = [rows, m] + ([w, rw] if weights else [])
    for x in wanted:
        x.requires_grad_(True)
    g = [torch.randn(n, 3, generator=_gen(2), dtype=F64), torch.randn(n, 3, generator=_gen(3), dtype=F64),
         torch.randn(m.shape, generator=_gen(5), dtype=F64)]
    want = attention_pair_reference(rows, w, None, m, tgt, src, n, res_weight=rw)
    got = attention_pair(rows, w, None, m, tgt, src, n, res_weight=rw)
    assert len(got) == 3
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    for used in (3, 2):
        ga = torch.autograd.grad(got[:used], wanted, g[:used], retain_graph=True, allow_unused=True)
        gb = torch.autograd.grad(want[:used], wanted, g[:used], retain_graph=True, allow_unused=True)
        for a, b in zip(ga, gb, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="line-graph"):
        attention_pair(*attention_case(True), res_weight=rw)


@pytest.mark.usefixtures("loops")
def test_attention_pair_with_the_residual_gradcheck_and_gradgradcheck():
    """Including the residual weight's gradient (training: the reference under autograd)."""
    rows, w, _, m, tgt, src, n = attention_case(False, e=13, n=5, d=3)

    def fn(r, msg, rw):
        return attention_pair(r, w, None, msg, tgt, src, n, res_weight=rw)

    x = [rows.clone().requires_grad_(True), m.clone().requires_grad_(True),
         torch.randn(1, 3, generator=_gen(6), dtype=F64, requires_grad=True)]
    assert torch.autograd.gradcheck(fn, x)
    assert torch.autograd.gradgradcheck(fn, x)
    assert torch.autograd.gradcheck(lambda r, msg: fn(r, msg, x[2].detach()), x[:2])  # frozen weight: fused


def refine_case(seed=0, e=29, b=6, c=4, bias=True):
    g = _gen(seed)
    def r(*s):
        return torch.randn(*s, generator=g, dtype=F64)

    return (r(e, c), r(b, c), torch.randint(0, b, (e,), generator=g), torch.randint(0, b - 1, (e,), generator=g), b,
            r(e, c), r(1, c), r(c, c), r(c) if bias else None, r(c, c), r(c) if bias else None)


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 100])
@pytest.mark.parametrize("weights", [False, True], ids=["inputs", "weights"])
def test_refine_edges_matches_reference(smooth, bias, chunk, weights):
    """Values and first derivatives of the inputs, with ``weights`` also of the FFN's and the
    residual's weights (the fused backward's weight gradients)."""
    u, q, src, tgt, n, y, rw, w1, b1, w2, b2 = refine_case(bias=bias)
    wanted = [u, q, y] + ([t for t in (rw, w1, b1, w2, b2) if t is not None] if weights else [])
    for t in wanted:
        t.requires_grad_(True)
    want = refine_edges_reference(u, q, src, tgt, n, y, rw, w1, b1, w2, b2, smooth)
    got = refine_edges(u, q, src, tgt, n, y, rw, w1, b1, w2, b2, smooth, chunk=chunk)
    gr, gy = torch.randn(n, 4, generator=_gen(5), dtype=F64), torch.randn(29, 4, generator=_gen(6), dtype=F64)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    for a, b in zip(torch.autograd.grad(got, wanted, [gr, gy]), torch.autograd.grad(want, wanted, [gr, gy]),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("smooth", [False, True])
def test_refine_edges_gradcheck_and_gradgradcheck(smooth):
    u, q, src, tgt, n, y, rw, w1, b1, w2, b2 = refine_case(e=11, b=4, c=3)

    def inputs_only(u_, q_, y_):
        return refine_edges(u_, q_, src, tgt, n, y_, rw, w1, b1, w2, b2, smooth, chunk=4)

    x = [t.clone().requires_grad_(True) for t in (u, q, y)]
    assert torch.autograd.gradcheck(inputs_only, x)
    assert torch.autograd.gradgradcheck(inputs_only, x)

    def everything(u_, q_, y_, rw_, w1_, b1_, w2_, b2_):
        return refine_edges(u_, q_, src, tgt, n, y_, rw_, w1_, b1_, w2_, b2_, smooth, chunk=4)

    x = [t.clone().requires_grad_(True) for t in (u, q, y, rw, w1, b1, w2, b2)]
    assert torch.autograd.gradcheck(everything, x)
    assert torch.autograd.gradgradcheck(everything, x)


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("chunk", [1, 7, 100])
def test_refine_edges_without_edge_update(chunk):
    """R alone (the last block, whose edge update reaches no output): values, input gradients,
    gradcheck and gradgradcheck against the reference."""
    u, q, src, tgt, n = refine_case()[:5]
    x = [u.clone().requires_grad_(True), q.clone().requires_grad_(True)]
    got = refine_edges(*x, src, tgt, n, chunk=chunk)
    want = refine_edges_reference(*x, src, tgt, n)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(got, refine_edges_reference(*x, src, tgt, n, *refine_case()[5:], False)[0])
    gr = torch.randn(n, 4, generator=_gen(5), dtype=F64)
    for a, b in zip(torch.autograd.grad(got, x, gr), torch.autograd.grad(want, x, gr)):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    x = [t.detach()[:11].clone().requires_grad_(True) if t.shape[0] == 29 else t.detach().clone().requires_grad_(True)
         for t in (u, q)]
    assert torch.autograd.gradcheck(lambda u_, q_: refine_edges(u_, q_, src[:11], tgt[:11], n, chunk=4), x)
    assert torch.autograd.gradgradcheck(lambda u_, q_: refine_edges(u_, q_, src[:11], tgt[:11], n, chunk=4), x)


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("folder", [f for f in FOLDERS if "float64" in f])
def test_chunked_model_equals_composed_ops(folder):
    """The default CPU path (fused) gives the composed ops' numbers to 1e-12 relative in float64
    (the fused loops' PyTorch forms are checked kernel by kernel above: one whole-model run). The
    fused run must call the operators' kernels, else it would compare the references with themselves."""
    model = load_fixture_model(folder, F64)
    systems = [to_system(a) for a in read(FIXTURES / folder / "structures.extxyz", ":")]
    assert load_reference(folder)["dtype"] == "float64"
    model.options.kernels = "torch"
    ref, _ = evaluate(model, systems)
    assert not profiled_operator_counts(lambda: evaluate(model, systems[:1]))
    model.options.kernels = "fused"
    got, _ = evaluate(model, systems)
    ran = profiled_operator_counts(lambda: evaluate(model, systems[:1]))
    assert {"attention_pair", "refine_edges"} <= set(ran), ran  # Φ too where its activation has a kernel
    for key in ("energy", "forces", "stress", "magmoms"):
        a, b = getattr(got, key), getattr(ref, key)
        err = (a - b).abs().max().item()
        assert err <= 1e-12 * b.abs().max().item(), f"{key}: {err:.2e}"


@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_last_block_skips_its_dead_edge_updates(backend, monkeypatch):
    """The energy reads atoms only, so the last block's FFN_edge (bonds and angles) reaches no
    output: it is not run; every other block runs both (values: the fixture parity tests)."""
    import matris.model.refine as refine_module

    chunked_calls = []

    def recording(*args, **kw):
        chunked_calls.append(len(args) > 5)  # y and the FFN's weights given: the edge update runs
        return refine_edges(*args, **kw)

    monkeypatch.setattr(refine_module, "refine_edges", recording)
    model = load_fixture_model("small_sh_float64", F64)
    model.options.kernels = backend
    calls = []
    for k, block in enumerate(model.interaction_block):
        for name in ("refine_block_line_graph", "refine_block_atom_graph"):
            ffn = getattr(block, name).edge_FFN
            ffn.register_forward_hook(lambda *_, k=k, name=name: calls.append((k, name)))
    systems = [to_system(a) for a in read(FIXTURES / "small_sh_float64" / "structures.extxyz", ":")]
    evaluate(model, systems[:1])
    last = len(model.interaction_block) - 1
    assert not [c for c in calls if c[0] == last]
    # the line-graph Refine runs its FFN inside refine_edges (its weights, not the module), the
    # operator's kernel or its reference
    assert set(calls) == {(k, "refine_block_atom_graph") for k in range(last)}
    assert chunked_calls == [True] * last + [False]
