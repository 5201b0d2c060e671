"""The published 10M architecture by name, and the fused CPU path serving it: a model of that
architecture saved in the official layout loads, runs every line-graph formula through the fused
kernels (asserted by counting them), and equals the composed PyTorch ops in float64."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from ase.build import bulk

from conftest import OperatorLog
from matris import MatRIS, MatRISCalculator, MatRISConfig
from matris.kernels import native


def test_published_configs_have_the_published_parameter_counts():
    ten = MatRIS(MatRISConfig.published_10m())
    # 10,443,411 is what the official 1.0 loader prints; with the 94 reference energies, 10,443,505
    # (the v0.9 loader and Matbench Discovery)
    assert ten.num_parameters() == 10_443_411
    assert sum(p.numel() for p in ten.parameters()) == 10_443_505
    c = ten.config
    assert (c.num_layers, c.three_body_expansion, c.norm_type, c.use_bias, c.mlp_hidden_dims) == (
        10, "Fourier", "layer", False, (256, 128, 128))
    assert (c.pairwise_cutoff, c.three_body_cutoff) == (6.0, 4.5)
    # the equal-count alternatives of the energy head that the docstring names
    for head in ((256, 192), (128, 256, 128)):
        assert MatRIS(MatRISConfig.published_10m(mlp_hidden_dims=head)).num_parameters() == 10_443_411
    assert MatRIS(MatRISConfig.published_10m(num_layers=4)).num_parameters() == 4_294_803  # the 4M recipe
    assert MatRISConfig.published_10m(num_layers=3).num_layers == 3  # overrides


@pytest.fixture(scope="module")
def published_file(tmp_path_factory):
    torch.manual_seed(0)
    model = MatRIS(MatRISConfig.published_10m())
    with torch.no_grad():  # LayerNorm starts at w = 1, b = 0: give the norms' affine parts values
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("published") / "matris-10m-like.pth.tar"
    torch.save(model.checkpoint_state(torch.float64), path)  # the official layout: config + state_dict
    return path


@pytest.mark.skipif(native.library() is None, reason="no C++ compiler: the fused CPU loops are off")
def test_published_architecture_runs_the_fused_cpu_path_and_equals_the_composed_ops(published_file):
    saved = torch.load(published_file, weights_only=True)
    assert set(saved) == {"config", "state_dict", "targets"}
    atoms = bulk("Si", "diamond", a=5.43) * (2, 1, 1)
    atoms.rattle(0.05, seed=3)
    results = {}
    for backend in ("torch", None):  # composed ops, then the default (fused) CPU path
        model = MatRIS.load(published_file, dtype=torch.float64)
        model.options.kernels = backend
        calc = MatRISCalculator(model)
        with OperatorLog() as log:
            calc.calculate(atoms, ["energy", "forces", "stress"])
        results[backend] = dict(calc.results)
        if backend == "torch":
            assert log.calls == {}
    blocks = 10
    # every block's two Φ of the line graph and the atom graph's, all LayerNorm (argument `layer`)
    assert len(log.calls["gated_phi"]) >= 2 * blocks and all(args[14] for args in log.calls["gated_phi"])
    assert len(log.calls["attention_pair"]) >= blocks and len(log.calls["refine_edges"]) >= blocks - 1
    assert len(log.calls["gated_phi_backward"]) == len(log.calls["gated_phi"])
    want, got = results["torch"], results[None]
    assert abs(got["energy"] - want["energy"]) <= 1e-12 * max(1.0, abs(want["energy"]))
    for key in ("forces", "stress"):
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-12 * max(1.0, np.abs(want[key]).max()))


OFFICIAL_V1 = Path(__file__).parent / "fixtures" / "official-v1.0" / "small_published_float64"


@pytest.mark.parametrize("backend", [None, "torch"])
def test_published_family_equals_the_official_1_0_code_in_float64(backend):
    """A small model of the published family (Fourier, LayerNorm, no biases, three-layer head),
    evaluated by the official MatRIS 1.0.0 in float64 (benchmarks/official_fixture.py): our
    default path and the composed ops give its energies, forces and stress to float64 rounding
    (the exact Fourier constant, as 1.0 computes it)."""
    from ase.io import read

    ref = json.loads((OFFICIAL_V1 / "reference.json").read_text())
    model = MatRIS.load(OFFICIAL_V1 / "checkpoint.pth.tar", dtype=torch.float64)
    assert model.config.to_dict() == ref["config"]
    model.options.kernels = backend
    calc = MatRISCalculator(model)
    for atoms, want in zip(read(OFFICIAL_V1 / "structures.extxyz", ":"), ref["structures"], strict=True):
        calc.calculate(atoms, ["energy", "forces", "stress"])
        assert abs(calc.results["energy"] - want["energy_eV"]) <= 1e-12 * abs(want["energy_eV"])
        for key, name in (("forces", "forces_eV_per_A"), ("stress", "stress_eV_per_A3")):
            w = np.asarray(want[name])
            np.testing.assert_allclose(calc.results[key], w, rtol=0, atol=1e-10 * np.abs(w).max(), err_msg=key)
