"""The GPU path's hygiene, checked on a CPU: no tensor created on the wrong device, int64
offsets in every kernel, no host synchronisation on the model's forward/backward path, the CSR
layouts built once per graph, inference without weight gradients, and no half precision."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ase.build import bulk

from conftest import load_fixture_model
from matris import GraphBatch, MatRIS, MatRISConfig
from matris.errors import MatRISInputError
from matris.kernels import Segments
from matris.structures import to_system

ROOT = Path(__file__).resolve().parents[1]


def graph_of(model, atoms):
    return GraphBatch.from_systems([to_system(atoms)], model.cutoff, model.three_body_cutoff, dtype=model.dtype)


def rattled_si(n=1, seed=0):
    atoms = bulk("Si", "diamond", a=5.43).repeat((n, 1, 1))
    atoms.rattle(0.05, seed=seed)
    return atoms


def _interpreted(script: str):
    env = {k: v for k, v in os.environ.items() if k != "MATRIS_KERNELS"}
    env.update(TRITON_INTERPRET="1", MATRIS_KERNELS="triton")
    return subprocess.run([sys.executable, str(ROOT / "tests" / "device_checks" / script)],
                          capture_output=True, text=True, env=env, timeout=900)


# ---------------------------------------------------------------------------- device hygiene
@pytest.mark.slow
def test_triton_path_creates_no_tensor_on_the_default_device():
    """The model's Triton path (interpreted) with torch.set_default_device("meta"): SH and
    Fourier, float32 and float64, forces, stress and a training double backward."""
    res = _interpreted("meta_default_device.py")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert res.stdout.count("ok ") == 7 and "all device checks passed" in res.stdout


# ---------------------------------------------------------------------------- int64 offsets
def _jit_functions():
    for path in sorted((ROOT / "kernels").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
                yield path.name, node


def test_every_program_id_is_widened_to_int64():
    """Offsets are products of a program id and a width: in int32 they wrap (e.g. 16.7 M line-
    graph segments × 128 channels). Every program id of every Triton kernel is cast to int64
    where it is read, so every product that follows is int64."""
    kernels, reads = set(), 0
    for name, fn in _jit_functions():
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "tl.program_id":
                kernels.add(f"{name}:{fn.name}")
                reads += 1
        text = ast.unparse(fn)
        for k in (0, 1):
            assert text.count(f"tl.program_id({k})") == text.count(f"tl.program_id({k}).to(tl.int64)"), \
                f"{name}:{fn.name} reads tl.program_id({k}) without widening it to int64"
    # the softmax aggregation, attention_pair's backward, bessel, fourier, sh, the gathers, Φ's epilogue, refine_edges
    assert len(kernels) >= 8 and reads >= 12


def test_segment_layouts_are_int64():
    index = torch.tensor([2, 0, 2, 1, 2], dtype=torch.int64)
    seg = Segments.from_index(index, 4)
    assert seg.order.dtype == seg.offsets.dtype == torch.int64
    assert seg.offsets.tolist() == [0, 1, 2, 5, 5]
    assert index[seg.order].tolist() == [0, 1, 2, 2, 2]


# ---------------------------------------------------------------------------- host reads
class HostReads:
    """Counts Python-level reads of tensor values to the host (item, bool, int, float, tolist,
    cpu, numpy, nonzero) while active: each is a device synchronisation on CUDA."""

    NAMES = ("item", "__bool__", "__int__", "__float__", "__index__", "tolist", "cpu", "numpy", "nonzero")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        self.active = False
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def wrapper(t, *args, _name=name, _original=original, **kwargs):
                if self.active:
                    self.calls.append(_name)
                return _original(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, wrapper)
        original_nonzero = torch.nonzero

        def nonzero(*args, **kwargs):
            if self.active:
                self.calls.append("torch.nonzero")
            return original_nonzero(*args, **kwargs)

        monkeypatch.setattr(torch, "nonzero", nonzero)


@pytest.mark.parametrize("folder", ["small_sh_float64", "small_fourier_float64", "mixed_widths_float64"])
def test_forward_and_backward_read_nothing_back_to_the_host(monkeypatch, folder):
    """Inference (energy, forces, stress, magmoms) and a training step with a force loss: no host
    read on the model's path once the graph is built (the check runs the PyTorch path; the
    fused path shares the model code, and on a GPU torch.cuda.set_sync_debug_mode proves it)."""
    model = load_fixture_model(folder)
    batch = GraphBatch.from_systems([to_system(rattled_si(seed=1)), to_system(bulk("NaCl", "rocksalt", a=5.6))],
                                    model.cutoff, model.three_body_cutoff, dtype=model.dtype)
    batch.segments()  # part of building the graph
    reads = HostReads(monkeypatch)
    reads.active = True
    out = model(batch)
    model.train()
    loss_out = model(batch, create_graph=True)
    (loss_out.energy.sum() + (loss_out.forces ** 2).sum() + loss_out.stress.abs().sum()).backward()
    reads.active = False
    model.eval()
    assert reads.calls == []
    assert out.forces.shape == (batch.num_atoms, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU test above stands in)")
def test_no_synchronisation_on_cuda():
    model = load_fixture_model("small_sh_float64").to("cuda")
    batch = graph_of(model, rattled_si()).to("cuda")
    batch.segments()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = model(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out.forces).all()


# ---------------------------------------------------------------------------- CSR layouts
def test_segments_are_built_once_per_graph_and_source_order_needs_no_sort(monkeypatch):
    model = load_fixture_model("small_sh_float64")
    batch = graph_of(model, rattled_si())
    (atom_t, atom_s), (line_t, line_s) = batch.segments()
    assert batch.segments()[0][0] is atom_t  # cached
    # by source: every edge of each atom's segment has that atom as its source
    src = batch.edge_source[atom_s.order]
    counts = atom_s.offsets[1:] - atom_s.offsets[:-1]
    assert torch.equal(src, torch.repeat_interleave(torch.arange(batch.num_atoms), counts))
    assert torch.equal(torch.sort(atom_s.order).values, torch.arange(2 * batch.num_bonds))
    assert torch.equal(atom_s.offsets, Segments.from_index(batch.edge_source, batch.num_atoms).offsets)
    assert batch.to(dtype=torch.float32).segments()[0][0] is atom_t  # a dtype move keeps them


# ---------------------------------------------------------------------------- inference
@pytest.mark.slow
def test_triton_path_reuses_layouts_and_skips_weight_gradients_in_inference():
    """tests/device_checks/triton_path_reuse.py: two calls on one graph sort nothing; inference
    launches the fused backwards without weight or frequency sums and restores requires_grad;
    training still gets weight gradients."""
    pytest.importorskip("triton")
    res = _interpreted("triton_path_reuse.py")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert res.stdout.count("ok ") == 7 and "all Triton-path checks passed" in res.stdout


def test_inference_restores_requires_grad_on_the_pytorch_path():
    model = load_fixture_model("small_sh_float64")
    next(model.parameters()).requires_grad_(False)  # a user's own freezing is kept as it was
    before = [p.requires_grad for p in model.parameters()]
    assert before[0] is False and sum(before) > len(before) // 2
    model(graph_of(model, bulk("Si", "diamond", a=5.43)))
    assert [p.requires_grad for p in model.parameters()] == before
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------------------- half precision
def test_half_precision_is_refused_before_any_kernel():
    model = MatRIS(MatRISConfig(num_layers=1, node_feat_dim=8, edge_feat_dim=8, three_body_feat_dim=8,
                                mlp_hidden_dims=(8,)))
    batch = graph_of(model, bulk("Si", "diamond", a=5.43))
    with pytest.raises(MatRISInputError, match="float32 or float64"):
        model.to(torch.bfloat16)(batch.to(dtype=torch.bfloat16))
    model.to(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(MatRISInputError, match="autocast"):
            model(batch)
    # an operator called on half-precision tensors directly runs its reference (no kernel takes them)
    from matris.kernels import basis

    r = torch.linspace(1.0, 5.0, 7, dtype=torch.bfloat16)
    freq = torch.arange(1, 4, dtype=torch.float32) * torch.pi
    torch.testing.assert_close(basis.bessel(r, freq, 6.0, 8), basis.bessel_basis(r, freq, 6.0, 8), rtol=0, atol=0)


def test_trainer_offers_no_half_precision():
    from matris.train.config import TrainConfig

    config = TrainConfig()
    with pytest.raises(MatRISInputError, match="choose one of"):
        config.override("trainer.precision", "bf16-mixed")
