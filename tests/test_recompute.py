"""Per-block activation checkpointing in training (matris.model.recompute): the gradients of a
training loss on energies, forces and stress equal those of the un-checkpointed step (float64,
1e-12 relative), with the second-order terms the force and stress losses need; the fused CPU
operators run where no weight gradient is wanted; the default follows the number of blocks."""

import numpy as np
import pytest
import torch

from conftest import OperatorLog, random_system
from matris import AtomicSystem, GraphBatch, MatRIS, MatRISConfig, memory
from matris.errors import MatRISInputError
from matris.kernels import native
from matris.model import recompute


def _model(norm="layer", basis="Fourier", layers=3, seed=0):
    torch.manual_seed(seed)
    config = MatRISConfig.published_10m(num_layers=layers, node_feat_dim=16, edge_feat_dim=16,
                                        three_body_feat_dim=16, mlp_hidden_dims=(16, 8), norm_type=norm,
                                        three_body_expansion=basis)
    model = MatRIS(config).double().train()
    with torch.no_grad():  # away from the initial values (norm weights of one, zero biases)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _graph(model, seed=0, dimer=False):
    """Two random cells (bonds with many angles, and bonds longer than the three-body cutoff that
    have none); ``dimer``: and a structure without angles (two atoms in a large cell)."""
    rng = np.random.default_rng(seed)
    systems = [random_system(rng, n=6), random_system(rng, n=5, z=(3, 8))]
    if dimer:
        systems.append(AtomicSystem(np.array([[0.0, 0.0, 0.0], [1.3, 0.2, 0.1]]), np.eye(3) * 20.0, True,
                                    np.array([8, 14]), "dimer"))
    return GraphBatch.from_systems(systems, model.cutoff, model.three_body_cutoff, dtype=torch.float64)


def _loss_grads(model, g, terms=("energy", "forces", "stress")):
    model.zero_grad(set_to_none=True)
    out = model(g, compute_forces=True, compute_stress=True, create_graph=True)
    loss = 0.0
    if "energy" in terms:
        loss = loss + (out.energy_per_atom ** 2).sum()
    if "forces" in terms:
        loss = loss + (out.forces ** 2).sum() + (out.forces[:, 0] * torch.arange(len(out.forces))).sum()
    if "stress" in terms:
        loss = loss + (out.stress ** 2).sum() * 1e-4
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, out


@pytest.fixture
def small_chunks():
    """Rows recomputed 3,000 at a time (``RunOptions.chunk_rows``): the test graph's 9,236 angles
    make four chunks, the last a partial one (its 786 directed bonds, one)."""
    return 3000


@pytest.mark.parametrize("terms", [("energy", "forces", "stress"), ("forces",), ("energy",)],
                         ids=["efs", "forces", "energy"])
@pytest.mark.parametrize("norm,basis,dimer", [("layer", "Fourier", False), ("rms", "SH", True)])
@pytest.mark.parametrize("mode", ["blocks", "rows"])
def test_recomputed_blocks_give_the_gradients_of_the_whole_graph(norm, basis, dimer, terms, mode, small_chunks):
    model = _model(norm, basis)
    model.options.chunk_rows = small_chunks
    g = _graph(model, dimer=dimer)
    # the split softmax meets bonds without angles (N = D = 0) in every graph
    assert g.angle_target_edge.remainder(g.num_bonds).unique().numel() < g.num_bonds
    model.options.training_recompute = "none"
    want, out_want = _loss_grads(model, g, terms)
    model.options.training_recompute = mode
    got, out_got = _loss_grads(model, g, terms)
    assert set(got) == set(want)
    for name in want:
        scale = want[name].abs().max().item() or 1.0
        assert (got[name] - want[name]).abs().max().item() <= 1e-12 * scale, name
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(getattr(out_got, key), getattr(out_want, key), rtol=1e-13, atol=1e-13)


@pytest.mark.skipif(native.library() is None, reason="no C++ compiler: the fused CPU operators are off")
@pytest.mark.parametrize("mode", ["blocks", "rows"])
def test_checkpointed_training_step_runs_the_fused_operators_in_its_first_order_passes(mode):
    """The block forward, the input gradients of the force computation and the loss's first-order
    pass (with the weights' gradients) run the fused CPU operators; the second-order recomputation
    runs the composed ops."""
    model = _model()
    g = _graph(model)
    model.options.training_recompute = mode
    with OperatorLog() as log:
        _loss_grads(model, g)
    counts = log.counts()
    blocks = model.config.num_layers
    # each block: its forward, its recomputation for the forces' input gradients, and its
    # first-order recomputation with weight gradients (the forward keeping hid for them)
    assert counts["gated_phi"] >= 3 * 2 * blocks and counts["gated_phi_backward"] >= 2 * 2 * blocks
    with_weights = {name: sum(bool(args[-1]) for args in calls) for name, calls in log.calls.items()}
    assert with_weights["gated_phi"] >= 2 * blocks and with_weights["gated_phi_backward"] >= 2 * blocks
    assert with_weights["refine_edges_backward"] >= 1
    if mode == "blocks":  # rows: this graph's angles make two chunks, whose attention sums are not the operator
        assert with_weights["attention_pair_backward"] >= 1
    model.options.training_recompute = "none"
    with OperatorLog() as log:
        _loss_grads(model, g)
    assert log.calls == {}  # without checkpointing, training keeps the composed ops


def test_recompute_by_default_the_least_that_fits_for_a_deep_model():
    shallow, deep = _model(layers=2), _model(layers=4)
    g = _graph(deep)
    assert memory.training_mode(shallow, graph=g) == "none"
    assert memory.training_mode(deep) == "rows"  # planning, without a graph: the least memory
    assert memory.training_mode(deep, create_graph=False) == "none"  # inference keeps its own levels
    sizes = (int(g.n_atoms.sum()), g.num_bonds, g.num_angles)
    need = {mode: memory.training_bytes(deep, *sizes, recompute=mode) for mode in ("none", "blocks", "rows")}
    assert need["none"] > need["blocks"] > need["rows"]
    deep.options.training_memory_limit = need["none"]  # fits: the whole graph (fastest)
    assert memory.training_mode(deep, graph=g) == "none"
    deep.options.training_memory_limit = need["none"] - 1  # does not: recomputed blocks
    assert memory.training_mode(deep, graph=g) == "blocks"
    deep.options.training_memory_limit = need["blocks"] - 1  # does not: blocks and rows recomputed
    assert memory.training_mode(deep, graph=g) == "rows"
    deep.options.training_memory_limit = need["rows"] // 2  # nothing fits: the least memory
    assert memory.training_mode(deep, graph=g) == "rows"
    deep.options.training_recompute = "none"
    assert memory.training_mode(deep, graph=g) == "none"
    with pytest.raises(MatRISInputError, match="training_recompute must be one of none, blocks, rows"):
        deep.options.training_recompute = "layers"  # refused where it is set, not at the first step
    assert deep.options.training_recompute == "none"


def test_checkpointed_gradients_accumulate_over_batches_like_the_whole_graph(small_chunks):
    """Gradient accumulation: two batches' backward passes add up as without checkpointing."""
    model = _model()
    model.options.chunk_rows = small_chunks
    graphs = [_graph(model, seed=1), _graph(model, seed=2)]
    result = {}
    for ckpt in (False, True):
        model.options.training_recompute = "rows" if ckpt else "none"
        model.zero_grad(set_to_none=True)
        for g in graphs:
            out = model(g, compute_forces=True, compute_stress=False, create_graph=True)
            ((out.forces ** 2).sum() + out.energy.sum()).backward()
        result[ckpt] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for name, want in result[False].items():
        assert (result[True][name] - want).abs().max() <= 1e-12 * (want.abs().max() or 1.0), name


@pytest.mark.parametrize("chunk,nested", [(10**6, False), (3000, True)])
def test_rows_are_recomputed_on_their_own_only_where_they_make_several_chunks(monkeypatch, chunk, nested):
    """Mode "rows" recomputes a block's per-angle work (and the atom graph's Φ) as nodes of their
    own only where the rows make more than one chunk; "blocks" never does."""
    model = _model()
    g = _graph(model)
    calls = []
    original = recompute.recomputed

    def counted(module, *args, **kwargs):
        calls.append(type(module).__name__)
        return original(module, *args, **kwargs)

    monkeypatch.setattr(recompute, "recomputed", counted)
    model.options.chunk_rows = chunk
    for mode in ("blocks", "rows"):
        calls.clear()
        model.options.training_recompute = mode
        _loss_grads(model, g)
        inner = [name for name in calls if name != "InteractionBlock"]
        assert calls.count("InteractionBlock") == model.config.num_layers
        assert bool(inner) == (nested and mode == "rows"), (mode, sorted(set(inner)))
