"""Dataset mixtures: the weighted budget sampler, per-dataset labels and energy conventions, recipes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from matris.data import BudgetBatchSampler
from matris.data.synthetic import write_emt_dataset
from matris.errors import MatRISInputError
from matris.train import TrainConfig, fit
from matris.train.datamodule import MatRISDataModule
from matris.train.reference import fit_reference_energies, fit_reference_energies_chunked
from train_utils import micro_config

ROOT = Path(__file__).resolve().parents[1]


def _sizes(n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 9, n)
    return a, a * 4, a * 10


def test_mixture_sampler_draws_by_weight_deterministically_and_resumes():
    groups = np.repeat([0, 1, 2], [600, 60, 40])
    a, b, t = _sizes(len(groups))

    def make(**kw):
        return BudgetBatchSampler(a, b, t, max_atoms=40, seed=7, groups=groups, weights=[1, 2, 1], **kw)

    s = make(epoch_size=4000)
    order = s.epoch_order(0)
    share = np.bincount(groups[order], minlength=3) / order.size
    np.testing.assert_allclose(share, [0.25, 0.5, 0.25], atol=0.03)  # weights, not dataset sizes
    # a dataset drawn more often than it has structures repeats all of them before any twice
    first = order[groups[order] == 2][:40]
    assert sorted(first.tolist()) == list(range(660, 700))
    np.testing.assert_array_equal(order, make(epoch_size=4000).epoch_order(0))  # deterministic
    assert not np.array_equal(order, s.epoch_order(1))
    assert make().epoch_order(0).size == len(groups)  # default epoch size: all structures

    # exact resume: the rest of the epoch equals what an uninterrupted sampler yields
    full = [list(x) for x in make(epoch_size=4000)]
    s = make(epoch_size=4000)
    it = iter(s)
    seen = [next(it) for _ in range(17)]
    resumed = make(epoch_size=4000)
    resumed.load_state_dict(s.state_dict())
    assert seen + [list(x) for x in resumed] == full
    other = BudgetBatchSampler(a, b, t, max_atoms=40, seed=7, groups=groups, weights=[1, 1, 1], epoch_size=4000)
    with pytest.raises(MatRISInputError, match="weights"):
        other.load_state_dict(s.state_dict())
    # ranks: same plan, dealt round-robin, each batch within budget
    r0, r1 = (BudgetBatchSampler(a, b, t, max_atoms=40, seed=7, groups=groups, weights=[1, 2, 1],
                                 epoch_size=4000, rank=r, world_size=2) for r in (0, 1))
    b0, b1 = list(r0), list(r1)
    assert len(b0) == len(b1) and b0 == full[0::2][:len(b0)] and b1 == full[1::2][:len(b1)]
    assert max(a[x].sum() for x in full) <= 40


def test_mixture_sampler_errors():
    a, b, t = _sizes(10)
    g = np.array([0] * 5 + [1] * 5)
    with pytest.raises(MatRISInputError, match="both groups"):
        BudgetBatchSampler(a, b, t, max_atoms=40, groups=g)
    with pytest.raises(MatRISInputError, match="weights must be finite"):
        BudgetBatchSampler(a, b, t, max_atoms=40, groups=g, weights=[1, -1])
    with pytest.raises(MatRISInputError, match="no structures"):
        BudgetBatchSampler(a, b, t, max_atoms=40, groups=np.zeros(10, int), weights=[1, 1])
    with pytest.raises(MatRISInputError, match="shuffle"):
        BudgetBatchSampler(a, b, t, max_atoms=40, groups=g, weights=[1, 1], shuffle=False)
    with pytest.raises(MatRISInputError, match="epoch_size"):
        BudgetBatchSampler(a, b, t, max_atoms=40, epoch_size=5)


def test_dataset_config_parsing_and_errors(tmp_path):
    cfg = {"data": {"datasets": [{"name": "a", "train": ["a/*.extxyz"], "weight": 2},
                                 {"name": "b", "train": ["b.json"], "labels": ["energy", "forces"]}]}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    c = TrainConfig.from_yaml(path)
    assert [d.name for d in c.data.datasets] == ["a", "b"]
    assert c.data.datasets[0].train == [str(tmp_path / "a/*.extxyz")] and c.data.datasets[0].weight == 2.0
    assert c.data.datasets[1].labels == ["energy", "forces"]
    assert TrainConfig.from_dict(yaml.safe_load(c.to_yaml())).data.datasets == c.data.datasets  # round trip
    bad = [
        ({"datasets": [{"name": "a", "train": ["x"], "wieght": 1}]}, "did you mean 'weight'"),
        ({"datasets": [{"name": "a", "train": ["x"], "labels": ["energy", "charge"]}]}, "labels must be"),
        ({"datasets": [{"name": "a"}]}, "training files"),
        ({"datasets": [{"name": "a", "train": ["x"]}, {"name": "a", "train": ["y"]}]}, "unique"),
        ({"datasets": [{"name": "a", "train": ["x"]}], "train": ["y"]}, "not both"),
        ({"datasets": [{"name": "a", "train": ["x"]}, {"name": "b", "train": ["y"], "reference_energy": "fit"}]},
         "first dataset"),
        ({"train": ["x"], "epoch_size": 10}, "applies to a mixture"),
    ]
    for data, message in bad:
        with pytest.raises(MatRISInputError, match=message):
            TrainConfig.from_dict({"data": data})


def test_chunked_reference_fit_equals_direct():
    rng = np.random.default_rng(0)
    comp = np.zeros((50, 94))
    comp[:, [0, 7, 13]] = rng.integers(0, 5, (50, 3))
    comp[comp.sum(1) == 0, 0] = 1
    energy = comp @ np.r_[-1.0, np.zeros(6), -3.0, np.zeros(5), -5.5, np.zeros(80)] + rng.normal(0, 0.01, 50)
    energy[3] = np.nan
    direct = fit_reference_energies(comp, energy)
    chunked, present = fit_reference_energies_chunked([(comp[:20], energy[:20]), (comp[20:], energy[20:])])
    np.testing.assert_allclose(chunked, direct, atol=1e-10)
    assert present[[0, 7, 13]].all() and present.sum() == 3


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    return (write_emt_dataset(d / "a.extxyz", 16, seed=1, max_atoms=4),
            write_emt_dataset(d / "b.extxyz", 8, seed=2, max_atoms=4), d)


def test_datamodule_masks_labels_and_moves_energies_to_the_first_convention(two_sets, tmp_path):
    import ase.io

    a, _, _ = two_sets
    # dataset b: a's structures in another "functional", energies lower by 2 eV per Cu atom
    frames = ase.io.read(a, ":")
    shifted = tmp_path / "a_shifted.extxyz"
    for f in frames:
        f.calc.results["energy"] = f.get_potential_energy() - 2.0 * (f.numbers == 29).sum()
    ase.io.write(shifted, frames)
    cfg = TrainConfig.from_dict({"data": {
        "datasets": [{"name": "a", "train": [str(a)], "val_fraction": 0.0, "reference_energy": "fit"},
                     {"name": "b", "train": [str(shifted)], "weight": 3, "labels": ["energy", "forces"],
                      "reference_energy": "fit", "val": [str(shifted)]}],
        "cache_dir": str(tmp_path / "cache"), "max_structures": 4, "build_workers": 1}})
    dm = MatRISDataModule(cfg.data, 4.5, 3.0, seed=0)
    dm.setup("fit")
    assert len(dm.train_set) == 16 + 16 and len(dm.val_set) == 16
    groups = dm.train_set.groups()
    assert (groups == 1).sum() == 16
    # the fits differ by exactly the -2 eV of Cu (least squares is linear in the energies)
    shift = dm.reference_energies["b"] - dm.reference_energies["a"]
    expected_shift = np.zeros(94)
    expected_shift[28] = -2.0
    np.testing.assert_allclose(shift, expected_shift, atol=1e-9)

    from matris.train.datamodule import Collate

    pos = np.flatnonzero(groups == 1)
    batch = Collate(dm.train_set)(pos[:4].tolist())
    raw = ase.io.read(a, ":")
    # b's structures come back in a's convention; b has no stress label (masked), forces kept
    e_a = torch.tensor([raw[int(i) - 16].get_potential_energy() for i in batch.indices], dtype=torch.float64)
    torch.testing.assert_close(batch.targets.energy, e_a, rtol=0, atol=1e-8)
    assert torch.isnan(batch.targets.stress).all() and torch.isfinite(batch.targets.forces).all()
    batch_a = Collate(dm.train_set)(np.flatnonzero(groups == 0)[:4].tolist())
    assert torch.isfinite(batch_a.targets.stress).all()  # a keeps its labels
    assert dm.labels == {"energy": True, "forces": True, "stress": True, "magmoms": False}
    # validation batches of b use the same conventions
    val = Collate(dm.val_set)(list(range(4)))
    assert torch.isnan(val.targets.stress).all()
    # the whole mixture's reference fit (the model's) sees one convention: a single -2 eV/Cu free fit
    w, n = dm.fit_reference_energies()
    assert n == 32 and abs(w[28] - dm.reference_energies["a"][28]) < 1e-8
    # the training sampler draws b three times as often as a
    order = dm._sampler(dm.train_set, True, 0, 1).epoch_order(0)
    assert (groups[order] == 1).mean() > 0.6


def test_training_on_a_mixture_runs_and_resumes(two_sets, tmp_path):
    a, b, _ = two_sets
    config = micro_config(tmp_path / "run", [], tmp_path / "cache")
    config["data"].pop("train")
    config["data"].update(datasets=[{"name": "a", "train": [str(a)], "weight": 1},
                                    {"name": "b", "train": [str(b)], "weight": 1, "labels": ["energy", "forces"]}],
                          epoch_size=12, build_workers=1)
    config["trainer"].update(max_steps=4)
    result = fit(TrainConfig.from_dict(config))
    assert result.last_model is not None and result.last_model.is_file()
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == 4
    config["trainer"].update(max_steps=7)  # trainer.resume: auto continues the same run
    fit(TrainConfig.from_dict(config))
    state = torch.load(ckpt, weights_only=False)
    assert state["global_step"] == 7


@pytest.mark.parametrize("name", ["matris-10m-omat", "matris-10m-oam", "matris-4m-matpes"])
def test_published_recipes_print_offline(name):
    out = subprocess.run([sys.executable, "-m", "matris", "train", "--config", f"examples/configs/{name}.yaml",
                          "--print-config"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    printed = yaml.safe_load(out.stdout)
    assert printed["data"]["datasets"] and printed["trainer"]["accelerator"] == "gpu"
    if name != "matris-10m-oam":
        from matris import MatRIS
        from matris.model.config import MatRISConfig

        model = MatRIS(MatRISConfig(**printed["model"]))  # the published architecture (named config)
        want = MatRISConfig.published_10m(**({} if "10m" in name else {"num_layers": 4}))
        assert model.num_parameters() == MatRIS(want).num_parameters()
        assert model.num_parameters() == (10_443_411 if "10m" in name else 4_294_803)
