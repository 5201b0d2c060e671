"""Training: config, loss masking, reference energies, overfitting, resume after kill, DDP, fine-tuning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from matris import MatRIS
from matris.data.synthetic import emt_structures, write_emt_dataset
from matris.errors import MatRISInputError
from matris.model import ModelOutput
from matris.train import TrainConfig, fit, fit_reference_energies
from matris.train.config import iter_keys
from matris.train.datamodule import split_indices
from matris.train.loss import compute_loss
from matris.train.module import lr_lambda
from train_utils import micro_config, write_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def emt(tmp_path_factory):
    d = tmp_path_factory.mktemp("emt")
    return {
        "small": write_emt_dataset(d / "small.extxyz", 8, seed=1, max_atoms=2),
        "train": write_emt_dataset(d / "train.extxyz", 24, seed=2, max_atoms=4),
        "cache": d / "cache",
        "dir": d,
    }


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


# ----------------------------------------------------------------------------- config and CLI
def test_config_yaml_overrides_and_errors(tmp_path):
    path = write_config(tmp_path / "c.yaml", {"model": {"num_layers": 2}, "data": {"train": ["x.extxyz"]},
                                              "optim": {"lr": "1e-3"}})
    c = TrainConfig.from_yaml(path)
    assert c.model.num_layers == 2 and c.optim.lr == 1e-3
    assert c.data.train == [str(tmp_path / "x.extxyz")]  # relative to the config file
    c.override("trainer.max_steps", "7")
    c.override("model.mlp_hidden_dims", "[8, 8]")
    c.override("optim.ema_decay", "null")
    c.override("trainer.devices", "0,1")
    got = (c.trainer.max_steps, c.model.mlp_hidden_dims, c.optim.ema_decay, c.trainer.devices)
    assert got == (7, (8, 8), None, "0,1")
    with pytest.raises(MatRISInputError, match="did you mean 'optim.lr'"):
        c.override("optim.lrr", "1")
    with pytest.raises(MatRISInputError, match="choose one of"):
        c.override("loss.energy_loss", "mse")
    with pytest.raises(MatRISInputError, match="expected int"):
        c.override("trainer.max_steps", "ten")
    with pytest.raises(MatRISInputError, match="unknown key 'optim.learning_rate'"):
        TrainConfig.from_dict({"optim": {"learning_rate": 1}})
    with pytest.raises(MatRISInputError, match="num_layers"):
        TrainConfig.from_dict({"model": {"num_layers": 0}})


def test_cli_help_documents_every_key_and_print_config(tmp_path):
    out = subprocess.run([sys.executable, "-m", "matris", "train", "--help"], capture_output=True, text=True,
                         env=_env(), check=True).stdout
    for key, *_ in iter_keys():
        assert f"--{key} " in out, key
    cfg = write_config(tmp_path / "c.yaml", {"data": {"train": ["a.extxyz"]}})
    res = subprocess.run([sys.executable, "-m", "matris", "train", "--config", str(cfg), "--optim.lr", "0.01",
                          "--trainer.max_steps=3", "--print-config"], capture_output=True, text=True, env=_env())
    assert res.returncode == 0, res.stderr
    import yaml

    printed = yaml.safe_load(res.stdout)
    assert printed["optim"]["lr"] == 0.01 and printed["trainer"]["max_steps"] == 3
    bad = subprocess.run([sys.executable, "-m", "matris", "train", "--config", str(cfg), "--optim.lrr", "1"],
                         capture_output=True, text=True, env=_env())
    assert bad.returncode == 2 and "did you mean 'optim.lr'" in bad.stderr


# ----------------------------------------------------------------------------- pieces
def test_loss_masks_missing_labels():
    torch.manual_seed(0)
    s, n = 3, 7
    n_atoms = torch.tensor([2, 2, 3])
    out = ModelOutput(energy=torch.randn(s, requires_grad=True), energy_per_atom=None, forces=torch.randn(n, 3),
                      stress=torch.randn(s, 3, 3), magmoms=torch.rand(n))
    out.energy_per_atom = out.energy / n_atoms
    from matris.data import Targets

    t = Targets(energy=torch.randn(s, dtype=torch.float64), forces=torch.randn(n, 3, dtype=torch.float64),
                stress=torch.randn(s, 3, 3, dtype=torch.float64),
                magmoms=torch.full((n,), float("nan"), dtype=torch.float64))
    t.forces[4:] = float("nan")  # structure 2 has no forces
    t.stress[0] = float("nan")
    t.energy[1] = float("nan")
    cfg = TrainConfig().loss
    cfg.energy_loss = "mae"
    loss, terms, sums = compute_loss(out, t, n_atoms, cfg)
    e_ref = (t.energy / n_atoms).float()
    keep = torch.tensor([True, False, True])
    assert torch.allclose(terms["energy"], (out.energy_per_atom - e_ref)[keep].abs().mean())
    assert torch.allclose(terms["force"], (out.forces[:4] - t.forces[:4].float()).norm(dim=1).mean())
    assert torch.allclose(terms["stress"], (out.stress[1:] - t.stress[1:].float()).abs().mean())
    assert terms["magmom"] == 0 and torch.isfinite(loss)
    assert sums.counts.tolist() == [2, 12, 18, 0]  # masked, not zero-filled
    loss.backward()
    assert torch.isfinite(out.energy.grad).all() and out.energy.grad[1] == 0


def test_reference_energy_fit_recovers_per_element_values():
    rng = np.random.default_rng(0)
    w_true = np.zeros(94)
    w_true[[12, 28, 78]] = [-3.7, -4.1, -6.0]  # Al, Cu, Pt
    comp = np.zeros((40, 94))
    comp[:, [12, 28, 78]] = rng.integers(0, 5, size=(40, 3))
    comp[comp.sum(1) == 0, 12] = 1
    energy = comp @ w_true
    energy[3] = np.nan  # unlabelled structures are skipped
    w = fit_reference_energies(comp, energy)
    assert np.allclose(w, w_true, atol=1e-10)


def test_lr_schedule_and_splits():
    f = lr_lambda(100, 10, "cosine", 0.01)
    assert f(0) < f(5) < f(9) <= 1.0
    assert f(10) == pytest.approx(1.0) and f(99) == pytest.approx(0.01, abs=2e-3)
    ids = [f"mp-{k // 3}" for k in range(30)]
    tr, va, te = split_indices(30, 0.2, 0.1, "material", 0, ids)
    assert len(set(tr) | set(va) | set(te)) == 30
    groups = [{ids[i] for i in part} for part in (tr, va, te)]
    assert not (groups[0] & groups[1]) and not (groups[0] & groups[2])  # no material in two splits
    assert np.array_equal(split_indices(30, 0.2, 0.1, "structure", 5)[1],
                          split_indices(30, 0.2, 0.1, "structure", 5)[1])


# ----------------------------------------------------------------------------- training runs
def _errors(model: MatRIS, atoms_list) -> tuple[float, float]:
    """Energy MAE (meV/atom) and force-component MAE (meV/Å) of ``model`` on labelled Atoms."""
    preds = model.predict(atoms_list, batch_size=len(atoms_list))
    de = [abs(p.energy_per_atom - a.get_potential_energy() / len(a)) for p, a in zip(preds, atoms_list)]
    df = np.concatenate([np.abs(p.forces - a.get_forces()).ravel() for p, a in zip(preds, atoms_list)])
    return 1000 * float(np.mean(de)), 1000 * float(np.mean(df))


@pytest.mark.slow
def test_tiny_model_overfits_small_set(emt, tmp_path):
    """8 EMT structures (1–2 atoms), 150 CPU steps: energy < 10 meV/atom and forces < 20 meV/Å on the set."""
    cfg = micro_config(tmp_path / "run", [emt["small"]], emt["cache"],
                       data={"val": [str(emt["small"])], "max_structures": 8},
                       optim={"lr": 5e-3, "warmup_steps": 5, "ema_decay": None, "min_lr_ratio": 0.1},
                       trainer={"max_steps": 150, "checkpoint_every_n_steps": 1000, "val_every_n_epochs": 50,
                                "parity_plot": True})
    result = fit(TrainConfig.from_dict(cfg))
    assert (tmp_path / "run" / "parity.png").stat().st_size > 10_000
    assert (tmp_path / "run" / "logs" / "csv" / "version_0" / "metrics.csv").is_file()
    model = MatRIS.load(result.last_model)
    assert model.config.reference_energy == "fitted" and model.reference_energy is not None
    from ase.io import read

    e_mae, f_mae = _errors(model, read(emt["small"], ":"))
    print(f"overfit after 150 steps: energy {e_mae:.2f} meV/atom, forces {f_mae:.1f} meV/Å")
    assert e_mae < 10 and f_mae < 20, (e_mae, f_mae)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["parity/energy_mae_meV_atom"] == pytest.approx(e_mae, rel=1e-3, abs=1e-3)


@pytest.mark.slow
def test_training_with_missing_labels(emt, tmp_path):
    """Structures without forces, stress or energy still train; nothing becomes NaN."""
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.io import read, write

    frames = read(emt["small"], ":")
    for k, a in enumerate(frames):
        r = a.calc.results
        kept = {"energy": r["energy"]} if k % 3 == 0 else ({"forces": r["forces"]} if k % 3 == 1 else dict(r))
        a.calc = SinglePointCalculator(a, **kept)
    path = tmp_path / "partial.extxyz"
    write(path, frames)
    cfg = micro_config(tmp_path / "run", [path], tmp_path / "cache", trainer={"max_steps": 4},
                       data={"num_workers": 1})  # batches collated in a worker process
    result = fit(TrainConfig.from_dict(cfg))
    for p in result.module.model.parameters():
        assert torch.isfinite(p).all()
    cfg["trainer"]["resume"] = "never"  # a finished run is never overwritten silently
    with pytest.raises(MatRISInputError, match="already holds a run.*overwrite=True"):
        fit(TrainConfig.from_dict(cfg))


@pytest.mark.slow
def test_rerun_of_a_finished_run_says_so_and_overwrite_starts_afresh(emt, tmp_path, capfd):
    """The rerun rule (matris.rerun) for training, and no Lightning tips or deprecations in its output:
    finished (step >= max_steps) → one line, nothing trained, the models as they are; unfinished →
    one line, resumed; overwrite=True → the run's own outputs removed (others kept), afresh."""
    cfg = micro_config(tmp_path / "run", [emt["train"]], emt["cache"], trainer={"max_steps": 3},
                       data={"val_fraction": 0.25})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    first = fit(TrainConfig.from_dict(cfg))
    err = capfd.readouterr().err
    for noise in ("Tip:", "litlogger", "GPU available", "TPU available", "LeafSpec", "could not find the monitored",
                  "`Trainer.fit` stopped"):
        assert noise not in err, (noise, err)
    model_bytes = first.last_model.read_bytes()

    cfg["trainer"]["max_steps"] = 2  # below the checkpoint's step: nothing to train
    again = fit(TrainConfig.from_dict(cfg))
    err = capfd.readouterr().err
    assert again.loaded and again.module is None and again.metrics == first.metrics
    assert "holds a finished run" in err and "at step 3, and trainer.max_steps is 2" in err
    assert "raise trainer.max_steps above 3" in err and "overwrite=True" in err and "--" not in err
    assert again.last_model.read_bytes() == model_bytes and _ckpt_step(ckpt) == 3

    cfg["trainer"]["max_steps"] = 4
    more = fit(TrainConfig.from_dict(cfg))
    err = capfd.readouterr().err
    assert "resuming from" in err and not more.loaded and _ckpt_step(ckpt) == 4
    assert "exists and is not empty" not in err

    cfg["trainer"]["max_steps"] = 2
    fresh = fit(TrainConfig.from_dict(cfg), overwrite=True)
    assert "removed the earlier run's" in capfd.readouterr().err and not fresh.loaded and _ckpt_step(ckpt) == 2
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "run" / "logs" / "csv").iterdir()) == ["version_0"]


def _ckpt_step(path: Path) -> int:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])
    except Exception:  # noqa: BLE001 - being written
        return -1


@pytest.mark.slow
def test_resume_after_kill_gives_the_same_model(emt, tmp_path):
    """A run killed (SIGKILL) mid-epoch and restarted ends with exactly the weights of an uninterrupted run
    (with block checkpointing and EMA). Steps enough that the kill lands mid-run on a fast CPU (with 14, an AMD
    EPYC Zen 5 finished the run between the checkpoint at step 6 being seen and the kill)."""
    STEPS = 40  # noqa: N806

    def config(name):
        c = micro_config(tmp_path / name, [emt["train"]], emt["cache"],
                         data={"val_fraction": 0.2, "max_structures": 4},
                         trainer={"max_steps": STEPS, "checkpoint_every_n_steps": 3, "recompute": "blocks"})
        return write_config(tmp_path / f"{name}.yaml", c)

    cmd = [sys.executable, "-m", "matris", "train", "--config"]
    ref = subprocess.run(cmd + [str(config("ref"))], capture_output=True, text=True, env=_env())
    assert ref.returncode == 0, ref.stderr[-3000:]

    cfg = config("killed")
    proc = subprocess.Popen(cmd + [str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if last.is_file() and _ckpt_step(last) >= 6:  # epoch 0 has 5 batches: step 6 is inside epoch 1
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = _ckpt_step(last)
    assert 6 <= killed_at < STEPS
    resumed = subprocess.run(cmd + [str(cfg)], capture_output=True, text=True, env=_env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr + resumed.stdout

    a = torch.load(tmp_path / "ref" / "last_model.pth.tar", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "killed" / "last_model.pth.tar", weights_only=True)["state_dict"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ra = torch.load(tmp_path / "ref" / "checkpoints" / "last.ckpt", weights_only=False)
    rb = torch.load(last, weights_only=False)
    assert ra["global_step"] == rb["global_step"] == STEPS
    for k in ra["state_dict"]:
        assert torch.equal(ra["state_dict"][k], rb["state_dict"][k]), k


@pytest.mark.slow
def test_ddp_two_processes_disjoint_data_identical_weights(emt, tmp_path):
    cfg = micro_config(tmp_path / "ddp", [emt["train"]], emt["cache"],
                       data={"max_structures": 3},
                       trainer={"max_steps": 4, "devices": "2", "strategy": "ddp", "recompute": "blocks"})
    path = write_config(tmp_path / "ddp.yaml", cfg)
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "ddp_train.py"), str(path)], capture_output=True,
                         text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / "ddp" / f"rank{k}.json").read_text()) for k in (0, 1))
    assert r0["world_size"] == r1["world_size"] == 2 and r0["steps"] == r1["steps"] == 4
    assert len(r0["seen"]) > 0 and len(r1["seen"]) > 0
    # data: disjoint within each epoch (24 structures, 4 steps of 3 per rank = one epoch)
    assert not set(r0["seen"]) & set(r1["seen"])
    assert r0["weights"] == r1["weights"]


@pytest.mark.slow
def test_finetuning_beats_scratch_and_the_starting_model(emt, tmp_path):
    """Pretrain on EMT; fine-tune on relabelled data ("another functional"): lower error than both baselines."""
    pre = micro_config(tmp_path / "pre", [emt["train"]], emt["cache"],
                       data={"max_structures": 6}, trainer={"max_steps": 80, "checkpoint_every_n_steps": 1000})
    start = fit(TrainConfig.from_dict(pre)).last_model

    shift = {"Al": -0.4, "Cu": 0.3, "Ag": 0.2, "Au": -0.2, "Ni": 0.5, "Pd": -0.1, "Pt": 0.1}
    new = dict(energy_scale=1.1, energy_shift=shift, max_atoms=4)
    ft_train = tmp_path / "ft_train.extxyz"
    write_emt_dataset(ft_train, 12, seed=7, **new)
    test_set = emt_structures(16, seed=8, **new)

    common = {"data": {"max_structures": 6}, "trainer": {"max_steps": 30, "checkpoint_every_n_steps": 1000}}
    ft = micro_config(tmp_path / "ft", [ft_train], emt["cache"], **common,
                      finetune={"from_checkpoint": str(start), "backbone_lr": 1e-3}, optim={"lr": 2e-3},
                      reference_energy={"mode": "fit"})
    scratch = micro_config(tmp_path / "scratch", [ft_train], emt["cache"], **common)
    e_start, f_start = _errors(MatRIS.load(start), test_set)
    e_ft, f_ft = _errors(MatRIS.load(fit(TrainConfig.from_dict(ft)).last_model), test_set)
    e_sc, f_sc = _errors(MatRIS.load(fit(TrainConfig.from_dict(scratch)).last_model), test_set)
    print(f"energy meV/atom: start {e_start:.1f} fine-tuned {e_ft:.1f} scratch {e_sc:.1f}; "
          f"forces meV/Å: start {f_start:.1f} fine-tuned {f_ft:.1f} scratch {f_sc:.1f}")
    assert e_ft < e_start and e_ft < e_sc
    assert f_ft < f_sc and f_ft < f_start  # forces too, not only the refitted energy offsets


def test_finetune_freezing(emt, tmp_path):
    from matris.train.run import build_model

    start = tmp_path / "start.pth.tar"
    MatRIS(TrainConfig.from_dict({"model": micro_config(tmp_path, [], tmp_path)["model"]}).model).save(start)
    c = TrainConfig.from_dict({"finetune": {"from_checkpoint": str(start), "freeze_embeddings": True,
                                            "freeze_blocks": 1}})
    model = build_model(c)
    assert not any(p.requires_grad for p in model.atom_embedding.parameters())
    assert not any(p.requires_grad for p in model.interaction_block[0].parameters())
    assert all(p.requires_grad for p in model.interaction_block[1].parameters())
    c.finetune.freeze_blocks = 5
    with pytest.raises(MatRISInputError, match="has 2 blocks"):
        build_model(c)


@pytest.mark.slow
def test_cli_finetune_from_bundled_model(emt, tmp_path):
    """`matris finetune --from demo`: the architecture is the checkpoint's, references kept, models exported."""
    cfg = micro_config(tmp_path / "ft", [emt["small"]], emt["cache"], trainer={"max_steps": 2})
    del cfg["model"]
    path = write_config(tmp_path / "ft.yaml", cfg)
    res = subprocess.run([sys.executable, "-m", "matris", "finetune", "--from", "demo", "--config", str(path),
                          "--finetune.freeze_embeddings", "true"], capture_output=True, text=True, env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    tuned = MatRIS.load(tmp_path / "ft" / "last_model.pth.tar")
    demo = MatRIS.load("demo")
    assert tuned.config.to_dict() == demo.config.to_dict()
    sd_t, sd_d = tuned.state_dict(), demo.state_dict()
    assert torch.equal(sd_t["atom_embedding.embedding.weight"], sd_d["atom_embedding.embedding.weight"])  # frozen
    head = "energy_head.energy_head.layers.0.weight"
    assert not torch.equal(sd_t[head], sd_d[head])
    missing = subprocess.run([sys.executable, "-m", "matris", "finetune", "--from", str(tmp_path / "nope.pth.tar"),
                              "--config", str(path)], capture_output=True, text=True, env=_env())
    assert missing.returncode == 2 and "no checkpoint" in missing.stderr


def test_train_throughput_benchmark_runs():
    from benchmarks.train_throughput import run

    r = run(ROOT / "examples" / "configs" / "tiny.yaml", "cpu", steps=2, warmup=1, n_structures=8, atoms=(4, 8),
            batch=4, precision="32")
    assert r["steps"] == 2 and r["structures_per_s"] > 0 and 0 < r["model_share"] <= 1


def test_training_on_mptrj_json_split_by_material(emt, tmp_path):
    """MPtrj layout: corrected energies, kBar stress (VASP sign) and magmoms train; materials stay in one split."""
    from ase.io import read
    from pymatgen.io.ase import AseAtomsAdaptor

    frames = read(emt["train"], ":")
    data = {}
    for k, a in enumerate(frames):
        data.setdefault(f"mp-{k // 3}", {})[f"mp-{k // 3}-{k % 3}"] = {
            "structure": AseAtomsAdaptor.get_structure(a).as_dict(),
            "uncorrected_total_energy": a.get_potential_energy(),
            "corrected_total_energy": a.get_potential_energy() - 0.1 * len(a),
            "force": a.get_forces().tolist(),
            "stress": (-10 * 160.21766208 * a.get_stress(voigt=False)).tolist(),  # kBar, VASP sign
            "magmom": [0.1] * len(a) if k % 2 else None,
        }
    path = tmp_path / "mptrj.json"
    path.write_text(json.dumps(data))
    cfg = micro_config(tmp_path / "run", [path], tmp_path / "cache", trainer={"max_steps": 2},
                       data={"val_fraction": 0.25, "split_by": "material"})
    result = fit(TrainConfig.from_dict(cfg))
    dm_train = result.module.trainer.datamodule.train_set
    dm_val = result.module.trainer.datamodule.val_set
    ids = dm_train.packed.material_ids
    assert not {ids[i] for i in dm_train.indices} & {ids[i] for i in dm_val.indices}
    assert result.module.train_magmoms and result.module.train_stress
    packed = dm_train.packed
    k = int(dm_train.indices[0])
    _, targets = packed.collate([k], dtype=torch.float64)
    assert torch.allclose(targets.stress[0], torch.as_tensor(frames[k].get_stress(voigt=False) * 160.21766208))
    assert targets.energy[0].item() == pytest.approx(frames[k].get_potential_energy() - 0.1 * len(frames[k]))
