"""Every execution path of the model gives the same numbers (float64)."""

import numpy as np
import pytest
import torch

from conftest import FOLDERS, evaluate, load_fixture_model, random_system
from matris import MemoryLimitError, memory, settings
from matris.errors import MatRISInputError
from matris.graph import GraphBatch
from matris.kernels import Kernels, native


@pytest.mark.parametrize("folder", FOLDERS[:3])
def test_projection_rewrite_equals_concatenation(folder):
    """Every Φ computes its first layer as per-node projections gathered per edge
    (``forward_terms``): the same numbers as Φ on the literal concatenation ``[y0 ‖ x[tgt] ‖ x[src]]``."""
    from matris.model.attention import GatedMLP, NormedMLP, project_terms

    model = load_fixture_model(folder)
    rng = torch.Generator().manual_seed(0)
    checked = 0
    for name, phi in model.named_modules():
        if not isinstance(phi, (GatedMLP, NormedMLP)):
            continue
        d_in = (phi.mlp_core.layers[0] if isinstance(phi, GatedMLP) else phi[0].layers[0]).in_features
        widths = [d_in - 2 * (d_in // 3), d_in // 3, d_in // 3]
        feats = [torch.randn(9, w, generator=rng, dtype=torch.float64) for w in widths]
        index = [None, torch.randint(0, 9, (9,), generator=rng), torch.randint(0, 9, (9,), generator=rng)]
        literal = phi(torch.cat([f if i is None else f[i] for f, i in zip(feats, index)], dim=-1))
        torch.testing.assert_close(phi.forward_terms(list(zip(feats, index))), literal, rtol=0, atol=1e-12,
                                   msg=name)
        # every term gathered and projected beforehand (the atom graph's Φ recomputed by row chunks)
        gathered = [(f, torch.randint(0, 9, (9,), generator=rng)) for f in feats]
        literal = phi(torch.cat([f[i] for f, i in gathered], dim=-1))
        torch.testing.assert_close(phi.forward_terms([], projected=project_terms(phi, gathered, 0)), literal,
                                   rtol=0, atol=1e-12, msg=name)
        checked += 1
    assert checked == 6 * model.config.num_layers  # two per attention, one per Refine


@pytest.mark.parametrize("level,chunk", [(1, None), (2, None), (2, 40), (3, None), (3, 40)],
                         ids=["1", "2", "2-chunks", "3", "3-chunks"])
@pytest.mark.parametrize("kernels", ["torch", "fused", "triton"])
def test_checkpointing_levels_give_the_same_numbers(model64, level, chunk, kernels):
    """Every memory level gives level 0's energy, forces and stress; the streamed levels also with
    their angles in several chunks (40 rows: the partial softmaxes merged over chunks). The
    Triton path runs in the interpreter (tests/test_triton_kernels.py runs this test so)."""
    if kernels == "fused" and not native.available():
        pytest.skip("the fused CPU operators need a C++ compiler")
    if kernels == "triton" and not settings.interpreting():
        pytest.skip("the Triton kernels run on CPU tensors only in the interpreter (TRITON_INTERPRET=1)")
    systems = [random_system(np.random.default_rng(5), n=6)]
    model64.options.memory_level, model64.options.kernels = 0, kernels
    ref, g = evaluate(model64, systems)
    model64.options.memory_level, model64.options.chunk_rows = level, chunk
    try:
        if chunk:
            assert g.num_angles > 2 * chunk
        out, _ = evaluate(model64, systems)
        assert memory.inference_level(model64, g) == level
    finally:
        model64.options.memory_level = model64.options.kernels = model64.options.chunk_rows = None
    torch.testing.assert_close(out.energy, ref.energy, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.forces, ref.forces, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.stress, ref.stress, rtol=0, atol=1e-11)


def test_streamed_levels_batches_features_and_weight_gradients(model64):
    """The streamed levels (2, 3) on a batch with a structure without angles (a dimer: the
    line-graph steps leave its bond alone), with the per-block features, and with the weights'
    gradients of an energy-only backward (weights not frozen): level 0's numbers in float64."""
    from matris.graph.system import AtomicSystem

    kernels = "fused" if native.available() else "torch"  # (the references: the levels' test above)
    dimer = AtomicSystem(np.array([[0.0, 0.0, 0.0], [2.1, 0.0, 0.0]]), np.eye(3) * 30.0, False,
                         np.array([14, 8]), "dimer")
    systems = [random_system(np.random.default_rng(2), n=6), dimer, random_system(np.random.default_rng(3), n=5)]
    g = GraphBatch.from_systems(systems, model64.cutoff, model64.three_body_cutoff, dtype=model64.dtype)
    assert g.num_angles > 120 and int(g.n_angles[1]) == 0
    params = [p for p in model64.parameters() if p.requires_grad]
    results = {}
    model64.options.chunk_rows, model64.options.kernels = 40, kernels
    try:
        for level in (0, 2, 3):
            model64.options.memory_level = level
            out = model64(g, return_node_features=True)
            e_model = model64._energy(g, g.positions, None, level, Kernels(kernels))[0]
            results[level] = out, torch.autograd.grad(e_model.sum(), params, allow_unused=True)
    finally:
        model64.options.memory_level = model64.options.kernels = model64.options.chunk_rows = None
    ref, ref_w = results[0]
    for level in (2, 3):
        out, w = results[level]
        torch.testing.assert_close(out.forces, ref.forces, rtol=0, atol=1e-12)
        torch.testing.assert_close(out.stress, ref.stress, rtol=0, atol=1e-11, equal_nan=True)  # the dimer: NaN
        assert out.node_features.keys() == ref.node_features.keys()
        for key, value in ref.node_features.items():
            torch.testing.assert_close(out.node_features[key], value, rtol=0, atol=1e-12, msg=key)
        for p, a, b in zip(params, w, ref_w):
            if b is None:
                assert a is None or not a.any()
                continue
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_automatic_level_follows_the_memory_budget(model64):
    _, g = evaluate(model64, [random_system(np.random.default_rng(1), n=6)])
    assert memory.inference_level(model64, g) == 0  # small systems keep everything
    # the chunked CPU kernels keep fewer activations than the composed ops
    assert memory.activation_bytes(model64, g, 0, kernels="fused") < memory.activation_bytes(model64, g, 0)
    model64.options.kernels = "torch"  # a shallow model on the chunked path skips level 1 (it keeps more)
    model64.options.memory_limit = memory.activation_bytes(model64, g, 1)
    try:
        assert memory.inference_level(model64, g) == 1
        model64.options.memory_limit = memory.activation_bytes(model64, g, memory.LOWEST_LEVEL)
        # the streamed levels: the fastest that fits (a model this shallow keeps one angle state at both)
        level = memory.inference_level(model64, g)
        assert level >= memory.STREAM_LEVEL
        assert memory.activation_bytes(model64, g, level) <= model64.options.memory_limit
        assert memory.inference_level(model64, g, create_graph=True) == 0  # training keeps its graph
        model64.options.memory_limit = "1 KB"  # stated and unreachable: refused
        with pytest.raises(MemoryLimitError, match="more than the memory limit of 1 KB"):
            memory.inference_level(model64, g)
    finally:
        model64.options.memory_limit = None
        model64.options.kernels = None


def test_run_options_per_call_and_the_switches_they_replaced(model64):
    """RunOptions set per call apply to that call only (same numbers, the model's own options
    untouched); setting a switch RunOptions replaced says where it went instead of being ignored."""
    from matris import RunOptions

    systems = [random_system(np.random.default_rng(5), n=6)]
    ref, g = evaluate(model64, systems)
    before = model64.options
    out = model64(g, options=RunOptions(kernels="torch", memory_level=2))
    assert model64.options is before and model64.options.memory_level is None
    torch.testing.assert_close(out.forces, ref.forces, rtol=0, atol=1e-12)
    for old, new in (("checkpointing", "memory_level"), ("kernel_backend", "kernels"), ("tf32", "tf32")):
        with pytest.raises(AttributeError, match=rf"model\.options\.{new}"):
            setattr(model64, old, 1)
    with pytest.raises(ValueError, match="memory_level"):
        RunOptions(memory_level=4)


def test_energies_alone_take_the_fastest_forward_that_fits(model64, monkeypatch):
    """Without a backward pass: level 0's forward for a small cell, the streamed forward for a large
    one (or where level 0 does not fit); both give the same energy."""
    systems = [random_system(np.random.default_rng(3), n=6)]
    _, g = evaluate(model64, systems)
    assert memory.inference_level(model64, g, backward=False) == 0
    model64.options.memory_limit = memory.activation_bytes(model64, g, memory.STREAM_LEVEL, backward=False)
    try:  # level 0's forward does not fit: streamed
        assert memory.inference_level(model64, g, backward=False) == memory.STREAM_LEVEL
    finally:
        model64.options.memory_limit = None
    monkeypatch.setattr(memory, "STREAMED_FORWARD_ANGLES", g.num_angles)  # as many angles as a large cell
    assert memory.inference_level(model64, g, backward=False) == memory.STREAM_LEVEL
    with torch.no_grad():
        streamed = model64(g, compute_forces=False, compute_stress=False).energy
    monkeypatch.undo()
    with torch.no_grad():
        whole = model64(g, compute_forces=False, compute_stress=False).energy
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-12)


def test_create_graph_is_asked_for_not_taken_from_train_mode(model64):
    """A model in train() mode (for its dropout) evaluates without the graph of its forces unless the
    call asks for it: the outputs are detached and no weight gradient is possible."""
    systems = [random_system(np.random.default_rng(5), n=6)]
    model64.train()
    try:
        out, g = evaluate(model64, systems)
        assert out.energy.grad_fn is None and out.forces.grad_fn is None
        kept = model64(g, create_graph=True)
        assert kept.forces.grad_fn is not None and kept.energy.grad_fn is not None
    finally:
        model64.eval()


def test_phi_of_one_input_is_bitwise_its_two_linears(model64):
    """Φ on a concatenated input (the node updates) computes, forward and backward, exactly what
    its two nn.Linear branches give: inference numbers stay bit for bit those of the published code
    (κ moves with 1e-16 force differences)."""
    from matris.kernels.gather import activate
    from matris.model.attention import GatedMLP

    phi = next(m for m in model64.modules() if isinstance(m, GatedMLP))
    z = torch.randn(50, phi.mlp_core.layers[0].in_features, dtype=torch.float64, requires_grad=True)
    branches = activate(phi.core_norm(phi.mlp_core(z)), phi.act_name) * torch.sigmoid(phi.gate_norm(phi.mlp_gate(z)))
    (g_ref,) = torch.autograd.grad(branches.sum(), z)
    out = phi(z)
    (g,) = torch.autograd.grad(out.sum(), z)
    assert torch.equal(out, branches) and torch.equal(g, g_ref)


def test_a_stated_memory_limit_holds_or_refuses_before_the_call(model64):
    """memory_limit from Python (calculator, predict) and the CLI: a limit the lowest level fits
    picks that level (same numbers); one it cannot fit is refused before the call, naming the atoms,
    angles, the memory needed and the limit; a batch that does not fit is split."""
    from ase.build import bulk

    from matris import MatRISCalculator, MemoryLimitError
    from matris.cli import main

    atoms = bulk("Si", "diamond", a=5.43, cubic=True)
    calc = MatRISCalculator(model64, memory_limit=None)
    ref = calc.get_forces(atoms.copy())
    g = evaluate(model64, [random_system(np.random.default_rng(5), n=6)])[1]
    lowest = memory.activation_bytes(model64, g, memory.LOWEST_LEVEL)
    assert memory.activation_bytes(model64, g, 1) > lowest  # the levels keep less and less
    small = MatRISCalculator(model64, memory_limit=lowest)
    np.testing.assert_allclose(small.get_forces(atoms.copy()), ref, rtol=0, atol=1e-12)
    assert model64.options.memory_limit is None  # the calculator's limit is its own
    with pytest.raises(MemoryLimitError, match=r"8 atoms with \d+ angles .* need about .* memory limit of 1 MB"):
        MatRISCalculator(model64, memory_limit="1 MB").get_forces(atoms.copy())
    primitive = bulk("Si", "diamond", a=5.43)
    from matris.graph import GraphBatch
    from matris.structures import to_system

    g2 = GraphBatch.from_systems([to_system(primitive)], model64.cutoff, model64.three_body_cutoff)
    fits_two = int(1.01 * memory.activation_bytes(model64, g2, memory.LOWEST_LEVEL))
    with pytest.raises(MemoryLimitError, match=r"structure 1 \(Si8\): 8 atoms"):  # the batch split; Si2 fit
        model64.predict([primitive, atoms], memory_limit=f"{fits_two / 2**20} MB")
    with pytest.raises(ValueError, match="memory_limit must be 'auto' or a positive size"):
        MatRISCalculator(model64, memory_limit="lots")
    assert main(["predict", "--memory-limit", "lots", "x.cif"]) != 0


def test_run_options_check_every_option_where_it_is_set():
    """A bad option fails where it is set (constructor or attribute), naming the valid forms, and
    leaves the options as they were; sizes are held in bytes."""
    opts = settings.RunOptions(memory_limit="2 GB", training_memory_limit="500 MB")
    assert opts.memory_limit == 2 * 2**30 and opts.training_memory_limit == 500 * 2**20
    for bad, match in ((dict(memory_limit="lots"), "RunOptions.memory_limit must be 'auto'"),
                       (dict(memory_limit="20"), "RunOptions.memory_limit = '20' has no unit"),
                       (dict(memory_limit=-5), "RunOptions.memory_limit must be 'auto'"),
                       (dict(kernels="cuda"), "RunOptions.kernels must be one of auto, triton, fused, torch"),
                       (dict(training_recompute="all"), "training_recompute must be one of none, blocks, rows")):
        with pytest.raises(MatRISInputError, match=match):
            settings.RunOptions(**bad)
        (name, value), = bad.items()
        with pytest.raises(MatRISInputError, match=match):
            setattr(opts, name, value)
    assert opts == settings.RunOptions(memory_limit=2 * 2**30, training_memory_limit=500 * 2**20)
    opts.memory_limit = "1 GB"
    assert opts.memory_limit == 2**30


def test_memory_sizes_parse_as_users_write_them():
    gb = 2**30
    assert settings.parse_size("8 GB") == settings.parse_size("8GiB") == settings.parse_size(8 * gb) == 8 * gb
    # a bare number is refused, not read as GB or bytes: the message says how to write it
    for bare in (1000, "1000", 8.5):
        with pytest.raises(MatRISInputError, match=r"memory_limit = .*has no unit.*'8 GB'"):
            settings.parse_size(bare)
    assert settings.parse_size("500 MB") == 500 * 2**20 and settings.parse_size(3 * gb) == 3 * gb
    assert settings.parse_size(None) is None and settings.parse_size("auto") is None
    assert settings.format_size(3 * gb) == "3 GB" and settings.format_size(int(1.234 * 2**20)) == "1.23 MB"
    assert settings.format_size(2**19) == "512 KB" and settings.format_size(1) == "1 bytes"
