"""model.compile(): one graph for MD-like steps of changing sizes, no graph breaks (fullgraph),
the same numbers as eager, and the Triton kernels as custom ops (torch.library).

Compilation is slow on this CPU, so these tests use the ``aot_eager`` backend (Dynamo capture and
AOTAutograd's joint forward/backward graph, without code generation): recompilations and graph
breaks are decided there, not by the code generator. ``python -m benchmarks.cpu_speed --variants
compiled`` and ``python -m benchmarks.gpu`` measure the Inductor backend.
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from ase.build import bulk

from conftest import evaluate, load_fixture_model, profiled_operator_counts
from matris.kernels import native
from matris.structures import to_system

ROOT = Path(__file__).resolve().parents[1]


def rattled_si(k: int, rng):
    """Cells of 8 to 48 atoms: every step changes the numbers of atoms, bonds and angles."""
    a = bulk("Si", "diamond", a=5.43, cubic=True).repeat((1 + k % 3, 1 + (k // 3) % 2, 1))
    a.positions += rng.normal(scale=0.1, size=a.positions.shape)
    return to_system(a)


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.slow
def test_compiled_model_recompiles_at_most_twice_and_matches_eager(dtype, rtol):
    import torch._dynamo

    torch._dynamo.reset()
    model = load_fixture_model("small_sh_float64", dtype).compile(fullgraph=True, backend="aot_eager")
    eager = load_fixture_model("small_sh_float64", dtype)
    assert model.compiled and not eager.compiled
    torch._dynamo.utils.counters.clear()
    rng = np.random.default_rng(0)
    steps = 20 if dtype == torch.float64 else 2  # float32: the numbers; float64: also the recompilations
    for k in range(steps):
        s = [rattled_si(k, rng)]
        got, _ = evaluate(model, s)
        want, _ = evaluate(eager, s)
        for key in ("energy", "forces", "stress"):
            a, b = getattr(got, key), getattr(want, key)
            assert (a - b).abs().max() <= rtol * b.abs().max(), key
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= 2, f"{graphs} graphs compiled over {steps} steps of changing sizes"
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])


@pytest.mark.skipif(native.library() is None, reason="no C++ compiler: the fused CPU kernels are off")
@pytest.mark.slow
def test_compiled_cpu_model_runs_the_fused_operators_without_graph_breaks():
    """On a CPU the compiled graph calls the registered fused operators (matris::gated_phi,
    attention_pair, refine_edges, the bases bessel and fourier, and their backwards), as many times as
    eager, with the same numbers, in one graph (fullgraph=True) over three cell sizes."""
    import torch._dynamo

    from matris import MatRIS, MatRISConfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    config = MatRISConfig.published_10m(num_layers=2, node_feat_dim=32, edge_feat_dim=32, three_body_feat_dim=32,
                                        mlp_hidden_dims=(32,))
    eager = MatRIS(config).double().eval()
    model = MatRIS(config).double().eval()
    model.load_state_dict(eager.state_dict())
    model.compile(fullgraph=True, backend="aot_eager")
    torch._dynamo.utils.counters.clear()
    rng = np.random.default_rng(0)
    for k in range(3):
        s = [rattled_si(k, rng)]
        out = {}
        evaluate(model, s)  # compiles (tracing runs the fake kernels, which the profiler would count)
        compiled_calls = profiled_operator_counts(lambda: out.update(got=evaluate(model, s)[0]))
        calls = profiled_operator_counts(lambda: out.update(want=evaluate(eager, s)[0]))
        got, want = out["got"], out["want"]
        fused = {"gated_phi", "gated_phi_backward", "attention_pair", "attention_pair_backward", "refine_edges",
                 "refine_edges_backward", "bessel", "bessel_backward", "fourier", "fourier_backward"}
        assert compiled_calls == calls and set(calls) == fused, (compiled_calls, calls)
        for key in ("energy", "forces", "stress"):
            a, b = getattr(got, key), getattr(want, key)
            assert (a - b).abs().max() <= 1e-12 * b.abs().max(), key
    assert 1 <= torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])


@pytest.mark.slow
def test_compiling_says_so_once_and_our_code_gives_dynamo_nothing_to_warn_about(capfd):
    """The first compiled call says on stderr that it compiles (it takes a while), later ones say
    nothing; tracing our code raises no Dynamo warning (one about an lru_cache-wrapped helper
    in kernels/backend.py reached users before)."""
    import torch._dynamo
    import torch._dynamo.utils

    torch._dynamo.reset()
    torch._dynamo.utils.warn_once_cache.clear()  # Dynamo warns once per process: see them all here
    model = load_fixture_model("small_sh_float64").compile(backend="eager")
    rng = np.random.default_rng(0)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate(model, [rattled_si(0, rng)])
        first = capfd.readouterr().err
        evaluate(model, [rattled_si(1, rng)])
    assert first.count("matris: compiling the model with torch.compile") == 1, first
    assert "compiling" not in capfd.readouterr().err
    dynamo = [str(w.message) for w in caught if "_dynamo" in w.filename or "Dynamo" in str(w.message)]
    assert not dynamo, dynamo


def test_compiled_model_trains_eagerly_and_copies():
    """Training calls (create_graph) run eagerly; copies keep the setting, not the compiled function."""
    import copy

    model = load_fixture_model("small_sh_float64", torch.float64).compile(backend="aot_eager")
    clone = copy.deepcopy(model)
    assert clone.compiled and clone._compiled is None
    model.train()
    out, _ = evaluate(model, [rattled_si(0, np.random.default_rng(1))], create_graph=True)
    (out.forces ** 2).sum().backward()  # double backward: would fail in a compiled graph


@pytest.mark.slow
def test_triton_kernels_are_custom_ops_without_graph_breaks():
    """Under TRITON_INTERPRET=1 the model on the Triton path compiles with fullgraph=True: the
    kernels are torch.library custom ops (opcheck'd in test_operators.py) with registered autograd formulas."""
    code = r"""
import sys, numpy as np, torch
sys.path.insert(0, "tests")
from conftest import evaluate, load_fixture_model
from matris.kernels import native
from test_compile import rattled_si
import matris.kernels.attention, matris.kernels.basis
for name in ("gated_phi", "attention_pair", "refine_edges", "bessel", "fourier", "spherical"):
    assert hasattr(torch.ops.matris, name), name
assert native.library() is None  # interpreted: the operators' CPU kernels are their Triton kernels
model = load_fixture_model("small_sh_float64", torch.float64)
eager = load_fixture_model("small_sh_float64", torch.float64)
eager.options.kernels = "torch"  # the composed ops: only the compiled model runs in the (slow) interpreter
model.compile(fullgraph=True, backend="aot_eager")
s = [rattled_si(0, np.random.default_rng(0))]  # 8 atoms: the interpreter is slow
got, _ = evaluate(model, s)
want, _ = evaluate(eager, s)
assert torch.allclose(got.forces, want.forces, rtol=0, atol=1e-12 * want.forces.abs().max())
print("compiled through custom ops: ok")
"""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MATRIS_KERNELS")}
    env.update(TRITON_INTERPRET="1", MATRIS_KERNELS="triton")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1200,
                         cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "compiled through custom ops: ok" in res.stdout


def test_tf32_switch_is_scoped_to_the_call():
    """model.options.tf32 turns TF32 matmuls on for CUDA calls only and restores the global setting."""
    model = load_fixture_model("small_sh_float64", torch.float32)
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = getattr(matmul, name)
    with model._tf32_context(torch.device("cuda")):  # off by default: nothing changes
        assert getattr(matmul, name) == before
    model.options.tf32 = True
    with model._tf32_context(torch.device("cpu")):
        assert getattr(matmul, name) == before
    with model._tf32_context(torch.device("cuda")):
        assert getattr(matmul, name) in ("tf32", True)
    assert getattr(matmul, name) == before
    out, _ = evaluate(model, [rattled_si(0, np.random.default_rng(0))])  # a CPU call is unaffected
    assert torch.isfinite(out.forces).all() and getattr(matmul, name) == before


def test_compiled_model_runs_memory_saving_levels_eagerly(capfd):
    """A structure that needs a memory level below 0 runs eagerly (the compiled backward would keep
    every activation: 17 GB against 4.8 GB for Si512 in benchmarks/peers.py), says so once, and gives
    the eager numbers; level 0 still uses the compiled code."""
    import dataclasses

    model = load_fixture_model("small_sh_float64", torch.float64).compile(backend="aot_eager")
    eager = load_fixture_model("small_sh_float64", torch.float64)
    s = [rattled_si(0, np.random.default_rng(2))]
    model.options = dataclasses.replace(model.options, memory_level=1)
    capfd.readouterr()
    got, _ = evaluate(model, s)
    evaluate(model, s)
    err = capfd.readouterr().err
    assert err.count("need memory level 1, which runs eagerly") == 1, err
    assert model._compiled is None  # nothing compiled
    want, _ = evaluate(eager, s)
    assert torch.equal(got.forces, want.forces) and torch.equal(got.energy, want.energy)
    model.options = dataclasses.replace(model.options, memory_level=0)
    evaluate(model, s)
    assert model._compiled is not None
