"""Every execution path of the model gives the same numbers (float64)."""

import numpy as np
import pytest
import torch

from conftest import FOLDERS, evaluate, load_fixture_model, random_system


@pytest.mark.parametrize("folder", FOLDERS[:3])
def test_projection_rewrite_equals_concatenation(folder):
    model = load_fixture_model(folder)
    systems = [random_system(np.random.default_rng(k), n=5) for k in range(2)]
    model.projection_rewrite = True
    a, _ = evaluate(model, systems)
    model.projection_rewrite = False
    b, _ = evaluate(model, systems)
    torch.testing.assert_close(a.energy, b.energy, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.forces, b.forces, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.stress, b.stress, rtol=0, atol=1e-11)


@pytest.mark.parametrize("level", [1, 2])
def test_checkpointing_levels_give_the_same_numbers(model64, level):
    systems = [random_system(np.random.default_rng(5), n=6)]
    model64.checkpointing = 0
    ref, g = evaluate(model64, systems)
    model64.checkpointing = level
    try:
        out, _ = evaluate(model64, systems)
        assert model64.checkpoint_level(g) == level
    finally:
        model64.checkpointing = None
    torch.testing.assert_close(out.energy, ref.energy, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.forces, ref.forces, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.stress, ref.stress, rtol=0, atol=1e-11)


def test_automatic_level_follows_the_memory_budget(model64):
    _, g = evaluate(model64, [random_system(np.random.default_rng(1), n=6)])
    assert model64.checkpoint_level(g) == 0  # small systems keep everything
    # the chunked CPU kernels keep fewer activations than the composed ops
    assert model64.estimated_activation_bytes(g, 0, kernels="fused") < model64.estimated_activation_bytes(g, 0)
    model64.kernel_backend = "torch"  # a shallow model on the chunked path skips level 1 (it keeps more)
    model64.activation_memory_limit = model64.estimated_activation_bytes(g, 1)
    try:
        assert model64.checkpoint_level(g) == 1
        model64.activation_memory_limit = 1
        assert model64.checkpoint_level(g) == 2
        assert model64.checkpoint_level(g, create_graph=True) == 0  # training keeps its graph
    finally:
        model64.activation_memory_limit = None
        model64.kernel_backend = None
