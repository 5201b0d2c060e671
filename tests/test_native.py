"""The fused CPU loops (kernels/native.cpp): their exp, float32 agreement with the PyTorch forms,
determinism across thread counts, and how the library is built, cached and turned off.
(Float64 agreement with the references, gradcheck and gradgradcheck: tests/test_chunked.py.)"""

import math
import warnings

import pytest
import torch

from matris.kernels import attention_pair, gated_phi, native, refine_edges

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C++ compiler: the fused loops are off")


def test_vexp_is_accurate_to_a_few_ulp_and_handles_the_ends():
    f64, f32 = native.library()("vexp", torch.float64), native.library()("vexp", torch.float32)
    worst64 = max(abs(f64(x) - math.exp(x)) / math.exp(x) for x in torch.linspace(-700, 700, 4001).tolist())
    assert worst64 < 4 * 2.2e-16
    xs = torch.linspace(-86, 88, 4001, dtype=torch.float32)
    exact = torch.exp(xs.double())
    got = torch.tensor([f32(x) for x in xs.tolist()], dtype=torch.float64)
    assert ((got - exact).abs() / exact).max() < 4 * 1.2e-7
    assert f64(float("-inf")) == 0.0 and f64(-800.0) == 0.0 and f32(-100.0) == 0.0
    assert math.isnan(f64(float("nan")))
    assert f64(0.0) == 1.0 and f32(0.0) == 1.0


def _cases(dtype, seed=0, e=300, b=23, c=32):
    g = torch.Generator().manual_seed(seed)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(dtype)

    src, tgt = torch.randint(0, b, (e,), generator=g), torch.randint(0, b - 3, (e,), generator=g)
    atom = torch.randint(0, 5, (e,), generator=g)
    phi = (r(e, c), r(2 * c, c, scale=0.2), [(r(b, 2 * c), tgt), (r(b, 2 * c), src), (r(5, 2 * c), atom)],
           [r(2 * c), r(c, c, scale=0.2), r(c), r(c, c, scale=0.2), r(c), r(c).abs() + 0.5, r(c).abs() + 0.5])
    attn = (r(e, c), r(2 * c, c, scale=0.3), r(e, c), tgt, src, b)
    refine = (r(e, c), r(b, c), src, tgt, b, r(e, c), r(1, c), r(c, c, scale=0.2), r(c), r(c, c, scale=0.2), r(c))
    return phi, attn, refine


def _run_all(dtype, chunk=64, c=32):
    """Values and input gradients of the three chunked kernels (frozen weights: fused backwards)."""
    (rows, rw, terms, w), (a_rows, wst, m, tgt, src, b), rf = _cases(dtype, c=c)
    eps = torch.finfo(dtype).eps
    outs = []
    x = [rows.clone().requires_grad_(True)] + [p.clone().requires_grad_(True) for p, _ in terms]
    y = gated_phi(x[0], rw, [(p, i) for p, (_, i) in zip(x[1:], terms)], *w, eps, chunk=chunk)
    outs += [y, *torch.autograd.grad(y, x, torch.ones_like(y))]
    x = [a_rows.clone().requires_grad_(True), m.clone().requires_grad_(True)]
    t, s = attention_pair(x[0], wst, None, x[1], tgt, src, b, chunk=chunk)
    outs += [t, s, *torch.autograd.grad([t, s], x, [torch.ones_like(t), torch.full_like(s, 0.5)])]
    res = torch.linspace(0.5, 1.5, c, dtype=dtype).view(1, c)  # with the edges' residual y' = m + w ⊙ rows
    t, s, yn = attention_pair(x[0], wst, None, x[1], tgt, src, b, chunk=chunk, res_weight=res)
    outs += [t, s, yn, *torch.autograd.grad([t, s, yn], x, [torch.ones_like(t), torch.full_like(s, 0.5),
                                                            torch.linspace(-1, 1, yn.numel(), dtype=dtype).view_as(yn)])]
    x2 = [x[0].detach()[:b].clone().requires_grad_(True), x[1]]  # atom-graph form: per-node logits, gathered
    proj = x2[0] @ wst.T
    t, s = attention_pair(proj, None, src, x2[1], tgt, src, b, chunk=chunk)
    outs += [t, s, *torch.autograd.grad([t, s], x2, [torch.ones_like(t), torch.full_like(s, 0.5)])]
    u, q, rs, rt, n, yy, rwt, w1, b1, w2, b2 = rf
    for smooth in (False, True):
        x = [u.clone().requires_grad_(True), q.clone().requires_grad_(True), yy.clone().requires_grad_(True)]
        agg, yn = refine_edges(x[0], x[1], rs, rt, n, x[2], rwt, w1, b1, w2, b2, smooth, chunk=chunk)
        outs += [agg, yn, *torch.autograd.grad([agg, yn], x, [torch.ones_like(agg), torch.ones_like(yn)])]
    x = [u.clone().requires_grad_(True), q.clone().requires_grad_(True)]
    agg = refine_edges(x[0], x[1], rs, rt, n, chunk=chunk)  # R alone (the last block)
    outs += [agg, *torch.autograd.grad(agg, x, torch.ones_like(agg))]
    return outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("c", [32, 6])  # 6: rows that are no whole number of vectors (the loops' remainders)
def test_agrees_with_the_references(dtype, c):
    """The fused loops (on) against the PyTorch references (what the kernels run with them off)."""
    got = _run_all(dtype, c=c)
    previous = native.set_enabled(False)
    try:
        want = _run_all(dtype, c=c)
    finally:
        native.set_enabled(previous)
    tol = 2e-5 if dtype == torch.float32 else 1e-12
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_results_do_not_depend_on_the_thread_count():
    """Rows split over threads, scatters split over channels: the same sums in the same order."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run_all(torch.float64, chunk=50)
        torch.set_num_threads(3)
        three = _run_all(torch.float64, chunk=50)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, three, strict=True):
        assert torch.equal(a, b)


def test_build_is_cached_atomic_and_keyed(tmp_path, monkeypatch):
    monkeypatch.setenv("MATRIS_NATIVE_CACHE", str(tmp_path / "elsewhere"))
    assert native.cache_root() == tmp_path / "elsewhere"
    monkeypatch.delenv("MATRIS_NATIVE_CACHE")
    monkeypatch.setenv("MATRIS_CACHE", str(tmp_path))
    lib = native.build()
    assert lib.is_file() and lib.parent.parent == tmp_path / "native"
    stamp = lib.stat().st_mtime_ns
    assert native.build() == lib and lib.stat().st_mtime_ns == stamp  # cached: not rebuilt
    assert not [p for p in lib.parent.iterdir() if p.name.startswith(".")]  # no temporary left behind
    assert native.build(force=True) == lib


@pytest.fixture
def fresh_load():
    """native.library() loads anew inside the test, and the real library is back afterwards."""
    native._load.cache_clear()
    yield
    native._load.cache_clear()


def test_without_a_compiler_the_cpu_path_warns_once_and_uses_pytorch_ops(tmp_path, monkeypatch, fresh_load):
    """No compiler on hand: one RuntimeWarning naming the problem, then the PyTorch forms (same
    numbers); MATRIS_NATIVE=1 makes it an error, MATRIS_NATIVE=0 turns the loops off silently."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("MATRIS_NATIVE_CACHE", str(tmp_path / "native"))
    monkeypatch.delenv("MATRIS_NATIVE", raising=False)
    with pytest.warns(RuntimeWarning, match="no C.. compiler.*MATRIS_NATIVE=0") as record:
        assert native.library() is None
        assert native.library() is None  # cached: warned once
    assert len(record) == 1
    rows = torch.randn(20, 4, dtype=torch.float64)
    assert not native.usable(rows)
    native._load.cache_clear()
    monkeypatch.setenv("MATRIS_NATIVE", "1")
    with pytest.raises(native.NativeBuildError, match="no C.. compiler"):
        native.library()
    native._load.cache_clear()
    monkeypatch.setenv("MATRIS_NATIVE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.library() is None


def test_a_broken_compiler_names_itself(tmp_path, monkeypatch):
    fake = tmp_path / "cxx"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo fake 1.0; exit 0; fi\necho 'boom' >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.delenv("MATRIS_NATIVE_CACHE", raising=False)
    monkeypatch.setenv("MATRIS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(native.NativeBuildError, match="boom"):
        native.build()
    assert not list((tmp_path / "cache" / "native").rglob("*.so"))  # the temporary was removed


def _gemm_direct(a: torch.Tensor, b: torch.Tensor, threads: int = 2) -> torch.Tensor:
    """The library's float32 GEMM called directly (the AVX2 kernel, or its portable form where the
    build has no AVX2): ``a [m, k]`` with a row stride, ``b [k, n]`` with any strides."""
    lib = native.library()
    k, n = b.shape
    packed = torch.empty(k * n)
    lib.gemm_pack(b.data_ptr(), k, n, b.stride(0), b.stride(1), packed.data_ptr())
    out = torch.full((a.shape[0], n), float("nan"))
    lib.gemm(a.data_ptr(), a.shape[0], k, a.stride(0), packed.data_ptr(), n, out.data_ptr(), n, None, 0, threads)
    return out


@pytest.mark.parametrize("m,k,n", [(1, 1, 16), (5, 3, 32), (6, 128, 128), (7, 128, 256), (50, 256, 128),
                                   (4097, 128, 256)])
def test_native_gemm_is_a_float32_product_within_its_rounding_bound(m, k, n):
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randn(m, k + 5, generator=g)[:, 2 : 2 + k]  # rows with a stride, like the chunk slices
    b = torch.randn(n, k, generator=g).T  # a transposed weight, as the forward passes it
    got = _gemm_direct(a, b).double()
    want = a.double() @ b.double()
    # one fused multiply-add chain per element: |error| ≤ k·u·Σ|a||b| (u = 2⁻²⁴)
    bound = k * 2.0**-24 * (a.abs().double() @ b.abs().double())
    assert ((got - want).abs() <= bound).all()
    assert torch.equal(_gemm_direct(a, b, threads=1), _gemm_direct(a, b, threads=3))


def test_matmul_uses_the_native_gemm_where_it_applies_and_torch_mm_elsewhere(monkeypatch):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(300, 64, generator=g)
    w = torch.randn(128, 64, generator=g)
    mm = native.Matmul(w.T)
    out = mm(a, out=torch.empty(300, 128))
    assert (mm.lib is not None) == native.gemm_enabled()
    if mm.lib is not None:
        assert torch.equal(out, _gemm_direct(a, w.T))
    torch.testing.assert_close(out, a @ w.T, rtol=1e-5, atol=1e-5)
    # with a factor (the backward's silu'): the product times it, exactly, in strided views too
    factor = torch.randn(300, 256, generator=g)[:, 128:]
    scaled = mm(a, out=torch.empty(300, 512)[:, :128], scale=factor)
    assert torch.equal(scaled, out * factor)
    # float64, a width that is no multiple of 16, and the native GEMM turned off: torch.mm, bit for bit
    for x, b in ((a.double(), w.T.double()), (a, w[:24].T)):
        fallback = native.Matmul(b)
        assert fallback.lib is None
        assert torch.equal(fallback(x, out=torch.empty(300, b.shape[1], dtype=x.dtype)), torch.mm(x, b))
    monkeypatch.setattr(native, "_native_gemm", False)
    assert not native.gemm_enabled() and native.Matmul(w.T).lib is None


def _phi_values_and_grads(with_rows: bool, chunk: int, norm: str = "rms"):
    """Φ of the float32 cases (with the per-row term or all terms gathered), its value and the input
    gradients; the second projection is frozen (no gradient asked for it)."""
    (rows, rw, terms, w), _, _ = _cases(torch.float32, e=301)
    x = [p.clone().requires_grad_(k != 1) for k, (p, _) in enumerate(terms)]
    r = rows.clone().requires_grad_(True) if with_rows else None
    kw = {} if norm == "rms" else dict(norm="layer", core_norm_bias=torch.linspace(-1, 1, w[-1].numel()),
                                       gate_norm_bias=torch.linspace(1, -0.5, w[-1].numel()))
    y = gated_phi(r, rw if with_rows else None, [(p, i) for p, (_, i) in zip(x, terms)], *w,
                  torch.finfo(torch.float32).eps, chunk=chunk, **kw)
    wanted = ([r] if with_rows else []) + [p for p in x if p.requires_grad]
    return [y, *torch.autograd.grad(y, wanted, torch.linspace(-1, 1, y.numel()).view_as(y))]


@pytest.mark.skipif(not native.gemm_enabled(), reason="the whole-call Φ needs the native float32 GEMM")
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("with_rows", [True, False])
def test_whole_call_phi_is_the_chunked_form_bit_for_bit(monkeypatch, with_rows, norm):
    """phi_fwd/phi_bwd (every step on blocks of rows in L2) against the chunk loop of the same fused
    loops and GEMMs: the same operations per row in the same order, so the same bits, for any
    thread count and chunk (301 rows: no whole number of row blocks)."""
    from matris.kernels import phi

    calls = []
    for name in ("_forward_whole", "_backward_whole"):
        real = getattr(phi, name)
        def counted(*a, _real=real, _name=name, **k):
            taken = _real(*a, **k)
            calls.append((_name, taken))
            return taken

        monkeypatch.setattr(phi, name, counted)
    threads = torch.get_num_threads()
    try:
        got = {}
        for nt, chunk in ((1, 64), (3, 64), (2, 1000)):
            torch.set_num_threads(nt)
            got[nt, chunk] = _phi_values_and_grads(with_rows, chunk, norm)
    finally:
        torch.set_num_threads(threads)
    assert sorted(calls) == [("_backward_whole", True)] * 3 + [("_forward_whole", True)] * 3
    monkeypatch.setattr(phi, "_forward_whole", lambda *a, **k: False)
    monkeypatch.setattr(phi, "_backward_whole", lambda *a, **k: False)
    want = _phi_values_and_grads(with_rows, 64, norm)
    for each in got.values():
        for a, b in zip(each, want, strict=True):
            assert torch.equal(a, b)


@pytest.mark.skipif(not native.gemm_enabled(), reason="the whole-pass calls need the native float32 GEMM")
def test_whole_pass_calls_are_the_chunk_loops_bit_for_bit(monkeypatch):
    """Φ, both attentions' line-graph form and Refine's edge side as one library call each (steps
    on blocks of rows in cache) against the chunk loops of the same fused loops and GEMMs
    (``native.set_whole_calls(False)``) with the same chunk size (it orders the two scatters of
    Refine's ∂L/∂q): the same bits, for any thread count."""
    lib = native.library()
    calls = []
    names = ("phi_fwd", "phi_bwd", "attn_fwd_gemm", "attn_bwd_gemm", "refine_fwd_whole", "refine_bwd_whole")
    for name in names:
        monkeypatch.setattr(lib, name, lambda *a, _fn=getattr(lib, name), _n=name: calls.append(_n) or _fn(*a))
    threads = torch.get_num_threads()
    try:
        got = []
        for nt, chunk in ((1, 64), (3, 64), (2, 1000)):
            torch.set_num_threads(nt)
            got.append((chunk, _run_all(torch.float32, chunk=chunk)))
    finally:
        torch.set_num_threads(threads)
    assert set(calls) == set(names)
    previous = native.set_whole_calls(False)
    try:
        calls.clear()
        want = {chunk: _run_all(torch.float32, chunk=chunk) for chunk in (64, 1000)}
    finally:
        native.set_whole_calls(previous)
    assert not calls
    for chunk, each in got:
        for a, b in zip(each, want[chunk], strict=True):
            assert torch.equal(a, b)
