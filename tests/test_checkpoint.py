"""Published checkpoint format: load with weights_only, save, exact round trip, clear errors."""

import numpy as np
import pytest
import torch

from conftest import FIXTURES, FOLDERS, evaluate, random_system
from matris import CheckpointError, MatRIS, MatRISConfig


@pytest.mark.parametrize("folder", FOLDERS[:3])
def test_round_trip_is_exact(tmp_path, folder):
    path = FIXTURES / folder / "checkpoint.pth.tar"
    model = MatRIS.from_checkpoint(path)
    out = model.save(tmp_path / "copy.pth.tar")
    original = torch.load(path, weights_only=True)
    saved = torch.load(out, weights_only=True)
    assert saved["config"] == {**MatRISConfig().to_dict(), **original["config"],
                               "mlp_hidden_dims": list(original["config"]["mlp_hidden_dims"]),
                               "pairwise_cutoff": original["config"]["pairwise_cutoff"]}
    assert saved["state_dict"].keys() == original["state_dict"].keys()
    for k, v in original["state_dict"].items():
        assert saved["state_dict"][k].dtype == v.dtype
        assert torch.equal(saved["state_dict"][k], v), k
    # a float64 model saves the same float32 numbers it was loaded from
    model.double().save(tmp_path / "from64.pth.tar")
    again = torch.load(tmp_path / "from64.pth.tar", weights_only=True)
    for k, v in original["state_dict"].items():
        assert torch.equal(again["state_dict"][k], v), k
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves no temp files


def test_new_model_round_trip(tmp_path):
    config = MatRISConfig(num_layers=1, node_feat_dim=8, edge_feat_dim=8, three_body_feat_dim=8,
                          mlp_hidden_dims=(8,), three_body_expansion="fourier", reference_energy="mptrj")
    model = MatRIS(config).double()
    model.save(tmp_path / "m.pth.tar", dtype=torch.float64)
    loaded = MatRIS.from_checkpoint(tmp_path / "m.pth.tar").double()
    s = random_system(np.random.default_rng(0))
    a, _ = evaluate(model.eval(), [s])
    b, _ = evaluate(loaded, [s])
    assert torch.equal(a.energy, b.energy) and torch.equal(a.forces, b.forces)


def test_extra_top_level_keys_are_ignored(tmp_path):
    ckpt = torch.load(FIXTURES / "small_sh_float64" / "checkpoint.pth.tar", weights_only=True)
    ckpt["optimizer"] = {"lr": 1e-3}
    ckpt["epoch"] = 12
    torch.save(ckpt, tmp_path / "x.pth.tar")
    assert MatRIS.from_checkpoint(tmp_path / "x.pth.tar").config.num_layers == 2


def test_bad_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError):
        MatRIS.from_checkpoint(tmp_path / "missing.pth.tar")
    (tmp_path / "junk.pth.tar").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint"):
        MatRIS.from_checkpoint(tmp_path / "junk.pth.tar")
    torch.save({"model": {}}, tmp_path / "wrong.pth.tar")
    with pytest.raises(CheckpointError, match="'config' and 'state_dict'"):
        MatRIS.from_checkpoint(tmp_path / "wrong.pth.tar")
    ckpt = torch.load(FIXTURES / "small_sh_float64" / "checkpoint.pth.tar", weights_only=True)
    ckpt["config"]["num_layers"] = 3
    torch.save(ckpt, tmp_path / "mismatch.pth.tar")
    with pytest.raises(CheckpointError, match="missing"):
        MatRIS.from_checkpoint(tmp_path / "mismatch.pth.tar")


class Evil:
    """Any class outside torch's weights_only allow-list."""


def test_arbitrary_objects_are_not_unpickled(tmp_path):
    torch.save({"config": {}, "state_dict": {}, "x": Evil()}, tmp_path / "evil.pth.tar")
    with pytest.raises(CheckpointError, match="weights_only"):
        MatRIS.from_checkpoint(tmp_path / "evil.pth.tar")


def test_invalid_configs():
    with pytest.raises(ValueError, match="odd num_angular"):
        MatRISConfig(three_body_expansion="Fourier", num_angular=6, num_radial=6)
    with pytest.raises(ValueError, match="norm_type"):
        MatRISConfig(norm_type="batch")
    with pytest.raises(ValueError, match="num_angular == num_radial"):
        MatRISConfig(num_angular=5, num_radial=7)



def test_lightning_training_checkpoint_names_the_model_file_to_load(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"pytorch-lightning_version": "2.4.0", "state_dict": {}, "epoch": 3, "optimizer_states": []}, path)
    with pytest.raises(CheckpointError, match=r"Lightning training checkpoint.*best_model\.pth\.tar"):
        MatRIS.load(path)
