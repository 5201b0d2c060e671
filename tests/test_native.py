"""The fused CPU operators (kernels/csrc): agreement with the PyTorch references in float32 and
float64 (widths that are whole vectors, less than one, and a vector and a part), determinism across
thread counts, and how the library is built, cached and turned off. (gradcheck, gradgradcheck and
more shapes: tests/test_chunked.py; opcheck: tests/test_operators.py.)"""

import re
import threading
import time
import warnings

import pytest
import torch

from matris.kernels import attention_pair, gated_phi, native, refine_edges
from matris.kernels.backend import operators_run

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C++ compiler: the fused loops are off")


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


def _run_all(dtype, chunk=64, c=32, e=300):
    """Values and input gradients of the three chunked kernels (frozen weights: fused backwards)."""
    (rows, rw, terms, w), (a_rows, wst, m, tgt, src, b), rf = _cases(dtype, c=c, e=e)
    eps = torch.finfo(dtype).eps
    outs = []
    x = [rows.clone().requires_grad_(True)] + [p.clone().requires_grad_(True) for p, _ in terms]
    y = gated_phi(x[0], rw, [(p, i) for p, (_, i) in zip(x[1:], terms)], *w, eps, chunk=chunk)
    outs += [y, *torch.autograd.grad(y, x, torch.ones_like(y))]
    x = [a_rows.clone().requires_grad_(True), m.clone().requires_grad_(True)]
    t, s = attention_pair(x[0], wst, None, x[1], tgt, src, b)
    outs += [t, s, *torch.autograd.grad([t, s], x, [torch.ones_like(t), torch.full_like(s, 0.5)])]
    res = torch.linspace(0.5, 1.5, c, dtype=dtype).view(1, c)  # with the edges' residual y' = m + w ⊙ rows
    t, s, yn = attention_pair(x[0], wst, None, x[1], tgt, src, b, res_weight=res)
    seeds = [torch.ones_like(t), torch.full_like(s, 0.5), torch.linspace(-1, 1, yn.numel(), dtype=dtype).view_as(yn)]
    outs += [t, s, yn, *torch.autograd.grad([t, s, yn], x, seeds)]
    x2 = [x[0].detach()[:b].clone().requires_grad_(True), x[1]]  # atom-graph form: per-node logits, gathered
    proj = x2[0] @ wst.T
    t, s = attention_pair(proj, None, src, x2[1], tgt, src, b)
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
# 6 and 20: rows that are no whole number of vectors, and GEMM widths with a partial 16-column panel
@pytest.mark.parametrize("c", [32, 6, 20])
def test_agrees_with_the_references(dtype, c, monkeypatch):
    """The fused loops (on) against the PyTorch references (what the operators run without them)."""
    got = _run_all(dtype, c=c)
    monkeypatch.setattr(native, "available", lambda: False)
    want = _run_all(dtype, c=c)
    tol = 2e-5 if dtype == torch.float32 else 1e-12
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_results_do_not_depend_on_the_thread_count(dtype):
    """Rows split over threads, scatters split over channels, each GEMM output one FMA chain: the
    same sums in the same order, bit for bit. 20,000 rows: enough work that every kernel splits it
    over the 3 threads (a kernel wakes one thread per 4 MFLOP: threads_for in csrc/cpu/common.h)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run_all(dtype, chunk=50, e=20_000)
        torch.set_num_threads(3)
        three = _run_all(dtype, chunk=50, e=20_000)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, three, strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_build_is_cached_atomic_and_keyed_by_its_sources(tmp_path, monkeypatch, capfd):
    """The library is built once per sources (and compiler, flags, torch, CPU): the same sources
    give the cached file, any edit a new build in a folder of its own, never a stale library. A
    build says so on stderr (a first call must not look hung); a cached load says nothing."""
    monkeypatch.setenv("MATRIS_NATIVE_CACHE", str(tmp_path / "elsewhere"))
    assert native.cache_root() == tmp_path / "elsewhere"
    monkeypatch.delenv("MATRIS_NATIVE_CACHE")
    monkeypatch.setenv("MATRIS_CACHE", str(tmp_path))
    # a small extension of the same form (torch's headers, an operator schema): quick to compile
    source = tmp_path / "tiny.cpp"
    source.write_text('#include <torch/library.h>\nTORCH_LIBRARY_FRAGMENT(matris_build_test, m) {\n'
                      '    m.def("twice(Tensor x) -> Tensor");\n}\n')
    monkeypatch.setattr(native, "SOURCES", (source,))
    monkeypatch.setattr(native, "HEADERS", ())
    capfd.readouterr()
    lib = native.build()
    assert lib.is_file() and lib.parent.parent == tmp_path / "native"
    said = capfd.readouterr().err.splitlines()
    assert len(said) == 2 and said[0].startswith("matris: compiling the fused CPU kernels"), said
    assert str(lib.parent) in said[0]
    assert re.fullmatch(r"matris: compiled the fused CPU kernels in \d+ s", said[1]), said
    stamp = lib.stat().st_mtime_ns
    assert native.build() == lib and lib.stat().st_mtime_ns == stamp  # cached: not rebuilt
    assert capfd.readouterr().err == ""
    assert not [p for p in lib.parent.iterdir() if p.name.startswith(".build")]  # no temporary left behind
    source.write_text(source.read_text() + "// edited\n")
    edited = native.build()
    assert edited.parent != lib.parent and edited.is_file()


def test_a_build_in_progress_is_waited_for_not_repeated(tmp_path, monkeypatch, capfd):
    """Processes that start together compile once: one that finds the build lock taken waits,
    says so, and loads the library the first one made (here made by the test)."""
    fcntl = pytest.importorskip("fcntl")
    monkeypatch.delenv("MATRIS_NATIVE_CACHE", raising=False)
    monkeypatch.setenv("MATRIS_CACHE", str(tmp_path))
    source = tmp_path / "never_compiled.cpp"
    source.write_text("#error this build must not run\n")
    monkeypatch.setattr(native, "SOURCES", (source,))
    monkeypatch.setattr(native, "HEADERS", ())
    folder = native._target()[3].parent
    folder.mkdir(parents=True)
    capfd.readouterr()
    result = {}
    with open(folder / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: result.setdefault("lib", native.build()))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive()  # blocked on the lock, not compiling
        (folder / "libmatris_ops.so").write_bytes(b"made by the first process")
        fcntl.flock(held, fcntl.LOCK_UN)
        waiter.join(timeout=30)
    assert result["lib"] == folder / "libmatris_ops.so"
    err = capfd.readouterr().err
    assert "waiting for another process" in err and "matris: compiling" not in err


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
    assert not operators_run(rows)
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
