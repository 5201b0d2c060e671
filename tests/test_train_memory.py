"""Batches sized by memory (matris.train.memory): parsing data.max_memory, the model's training memory
model, the memory budget of the batch sampler, the clear error for a structure that cannot fit,
and the dry run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from matris import MatRIS, MatRISConfig, memory
from matris.cli import main as cli_main
from matris.data import BudgetBatchSampler
from matris.data.synthetic import write_emt_dataset
from matris.errors import MatRISInputError
from matris.settings import parse_size
from matris.train import TrainConfig
from matris.train.memory import check_fits, plan_memory
from train_utils import micro_config, write_config

GB = 2**30


def test_max_memory_is_auto_or_a_size():
    assert parse_size("auto") is None and parse_size(" Auto ") is None
    assert parse_size("20 GB") == parse_size("20GiB") == parse_size(20 * GB) == 20 * GB
    assert parse_size("512 MB") == 512 * 2**20
    with pytest.raises(MatRISInputError, match=r"data.max_memory = 20 has no unit"):
        parse_size(20, "data.max_memory")  # YAML's max_memory: 20 is not guessed as GB
    for bad in ("lots", "-3 GB", "0", "inf"):
        with pytest.raises(ValueError, match="max_memory must be 'auto' or a positive size"):
            parse_size(bad, "data.max_memory")
    with pytest.raises(MatRISInputError, match="max_memory must be 'auto'"):
        TrainConfig.from_dict({"data": {"train": ["x.extxyz"], "max_memory": "lots", "max_structures": None}})
    alone = TrainConfig.from_dict({"data": {"train": ["x.extxyz"], "max_memory": "8 GB", "max_structures": None}})
    alone.validate("test")  # a memory budget alone is a budget


def test_a_removed_recompute_mode_names_its_replacement():
    with pytest.raises(MatRISInputError, match="recompute 'steps' was removed in matris-mlip 0.3.*recompute: rows"):
        TrainConfig.from_dict({"data": {"train": ["x.extxyz"]}, "trainer": {"recompute": "steps"}})
    with pytest.raises(MatRISInputError, match="must be 'none', 'blocks', 'rows' or null"):
        TrainConfig.from_dict({"data": {"train": ["x.extxyz"]}, "trainer": {"recompute": "layers"}})


def test_the_memory_model_adds_up_over_a_batch_and_knows_checkpointing():
    model = MatRIS(MatRISConfig.published_10m())
    atoms, bonds, angles = np.array([8, 16, 64]), np.array([368, 715, 2859]), np.array([7936, 15872, 63488])
    per = memory.training_bytes(model, atoms, bonds, angles)
    assert memory.training_bytes(model, atoms.sum(), bonds.sum(), angles.sum()) == per.sum()  # linear
    whole = memory.training_bytes(model, atoms, bonds, angles, recompute="none")
    fixed = memory.training_fixed_bytes(model, ema=False)  # planned: rows, with the one chunk alive at a time
    assert fixed - memory.training_fixed_bytes(model, ema=False, recompute="none") == 250 * 4096 * 128 * 4
    # ten blocks' graphs against one block's and one chunk of rows, plus what each block keeps
    assert (memory.training_fixed_bytes(model, ema=False, recompute="none") + whole > 4 * (fixed + per)).all()
    assert (memory.training_bytes(model, atoms, bonds, angles, torch.float64) == 2 * per).all()
    assert memory.training_fixed_bytes(model, torch.float64, recompute="none") == 2 * memory.training_fixed_bytes(model,
        recompute="none") - 512 * 2**20  # the framework's share does not double
    # the measured peaks the model bounds (benchmarks/results/train_memory.json), recompute rows:
    # MgO8 1.15 GB, MgO16 1.37 GB, MgO64 3.12 GB
    assert 1.15 * GB < fixed + per[0] < 1.6 * GB
    assert 1.37 * GB < fixed + per[1] < 2.0 * GB and 3.12 * GB < fixed + per[2] < 3.7 * GB


def test_the_sampler_fills_batches_up_to_the_memory_budget():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 9, 200)
    cost = n * 1000
    sampler = BudgetBatchSampler(n, n * 10, n * 50, memory=cost, max_memory=9000, seed=1)
    batches = list(sampler)
    assert sorted(np.concatenate(batches).tolist()) == list(range(200))
    assert all(cost[b].sum() <= 9000 for b in batches) and max(cost[b].sum() for b in batches) > 7000
    with pytest.raises(MatRISInputError, match="needs both"):
        BudgetBatchSampler(n, n, n, memory=cost)


def test_a_structure_that_cannot_fit_is_refused_before_training_with_what_it_needs():
    model = MatRIS(MatRISConfig.published_10m())
    config = TrainConfig.from_dict({"data": {"train": ["x.extxyz"], "max_memory": "3 GB"},
                                    "trainer": {"accelerator": "cpu"}})
    sizes = (np.array([8, 64]), np.array([368, 2859]), np.array([7936, 63488]))
    plan = plan_memory(model, config, sizes)
    assert plan.total == 3 * GB and plan.largest() == 1
    # automatic recompute, planned for the published model: the least memory ("rows")
    assert plan.recompute == "rows"
    with pytest.raises(MatRISInputError, match=r"largest training structure \(position 1: 64 atoms, 2859 bonds, "
                                               r"63488 angles\) needs about \d\.\d GB.*3\.0 GB allowed "
                                               r"\(data.max_memory = 3 GB; recompute rows\); "
                                               r"structures of up to about \d+ angles fit"):
        check_fits(plan, sizes)
    model.options.training_recompute = "none"  # set: the plan keeps it, and the error names the mode that needs less
    with pytest.raises(MatRISInputError, match=r"recompute none\).*set trainer.recompute: rows"):
        check_fits(plan_memory(model, config, sizes), sizes)
    model.options.training_recompute = None
    small = plan_memory(model, config, (sizes[0][:1], sizes[1][:1], sizes[2][:1]))
    check_fits(small, (sizes[0][:1], sizes[1][:1], sizes[2][:1]))
    tiny = plan_memory(model, config, sizes, max_memory="100 MB")
    with pytest.raises(MatRISInputError, match="parameters, optimizer state and framework need"):
        check_fits(tiny, sizes)


def test_dry_run_prints_the_memory_plan_and_training_refuses_what_cannot_fit(tmp_path, capsys):
    data = write_emt_dataset(tmp_path / "emt.extxyz", 6, seed=1, max_atoms=4)
    cfg = micro_config(tmp_path / "run", [data], tmp_path / "cache", trainer={"max_steps": 1})
    path = write_config(tmp_path / "c.yaml", cfg)
    assert cli_main(["train", "--config", str(path), "--dry-run", "--data.max_memory", "2 GB"]) == 0
    out = capsys.readouterr().out
    assert "memory plan on cpu (data.max_memory = 2 GB)" in out and "largest structure" in out
    assert "a  80 GB device" in out and "the largest structure fits" in out
    assert cli_main(["train", "--config", str(path), "--data.max_memory", "1 MB"]) == 2
    err = capsys.readouterr().err
    assert "need about" in err and "raise data.max_memory" in err
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before any step


def test_available_memory_honours_the_memory_cgroup(tmp_path):
    """A job's memory cgroup (SLURM ``--mem``, a container's limit) bounds what the memory model may
    plan with: MemAvailable is the whole node's there. v1 and v2 layouts, the page cache that the
    kernel reclaims not counted as used, an ancestor's tighter limit, and no limit at all."""
    from matris.memory import cgroup_headroom

    def write(folder, **files):
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name.replace("__", ".")).write_text(text)

    v1 = tmp_path / "v1"
    write(v1 / "memory", memory__limit_in_bytes=str(2**63 - 4096), memory__usage_in_bytes="1")
    write(v1 / "memory" / "job", memory__limit_in_bytes=str(8 << 30), memory__usage_in_bytes=str(3 << 30),
          memory__stat=f"cache 5\ntotal_inactive_file {1 << 30}\n")
    (tmp_path / "cg1").write_text("4:memory:/job\n1:cpu:/\n0::/\n")
    assert cgroup_headroom(str(tmp_path / "cg1"), str(v1)) == (8 << 30) - (2 << 30)

    v2 = tmp_path / "v2"
    write(v2, memory__current="0")
    write(v2 / "slurm", memory__max=str(6 << 30), memory__current=str(1 << 30))
    write(v2 / "slurm" / "step", memory__max="max", memory__current=str(1 << 30),
          memory__stat=f"anon 1\ninactive_file {1 << 29}\n")
    (tmp_path / "cg2").write_text("0::/slurm/step\n")
    assert cgroup_headroom(str(tmp_path / "cg2"), str(v2)) == 5 << 30  # the parent's limit binds

    write(v2 / "free", memory__max="max", memory__current="7")
    (tmp_path / "cg3").write_text("0::/free\n")
    assert cgroup_headroom(str(tmp_path / "cg3"), str(v2)) is None
    assert cgroup_headroom(str(tmp_path / "missing"), str(v2)) is None


def test_the_budget_of_data_max_memory_binds_validation_too(tmp_path):
    """data.max_memory caps the training step (training_memory_limit) and the validation and test
    passes (inference on the model and its EMA copy: memory_limit), which otherwise took their level
    from the device's free memory and kept everything: a finetune of the published architecture on
    64-atom MgO with 3.5 GB peaked at 6.5 GB."""
    from matris.train.datamodule import MatRISDataModule
    from matris.train.module import MatRISModule
    from matris.train.run import apply_memory_budget, build_model

    data = write_emt_dataset(tmp_path / "emt.extxyz", 6, seed=1, max_atoms=4)
    cfg = TrainConfig.from_dict(micro_config(tmp_path / "run", [data], tmp_path / "cache",
                                             data={"max_memory": "2 GB", "val_fraction": 0.34}))
    model = build_model(cfg)
    dm = MatRISDataModule(cfg.data, model.cutoff, model.three_body_cutoff, seed=0)
    dm.setup("fit")
    plan = apply_memory_budget(model, cfg, dm)
    module = MatRISModule(model, cfg, labels=dm.labels)
    for m in (model, module.eval_model):
        assert m.options.memory_limit == m.options.training_memory_limit == plan.budget
