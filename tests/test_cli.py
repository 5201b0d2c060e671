"""The ``matris`` command."""

import json
import subprocess
import sys

from ase.build import bulk
from ase.io import write

from matris.cli import main


def test_predict_default_runs_offline(capsys):
    assert main(["predict"]) == 0
    out = capsys.readouterr().out
    assert "Si_diamond_example" in out and "E/atom" in out


def test_predict_files_and_json(tmp_path, capsys):
    cu = bulk("Cu", "fcc", a=3.6)
    write(tmp_path / "cu.cif", cu)
    frames = [bulk("Si", "diamond", a=5.43 + 0.01 * k) for k in range(3)]
    write(tmp_path / "si.extxyz", frames)
    out_json = tmp_path / "out" / "results.json"
    assert main(["predict", str(tmp_path / "cu.cif"), str(tmp_path / "si.extxyz"), "--json", str(out_json),
                 "--dtype", "float64"]) == 0
    results = json.loads(out_json.read_text())
    assert len(results) == 4
    assert results[1]["name"] == "si[0]"
    assert len(results[0]["stress_GPa"]) == 3


def test_memory_limit_option(tmp_path, capsys):
    """--memory-limit: a cap the structure fits runs (same numbers), one it cannot fit even at the
    lowest level exits 2 naming the atoms, angles, need and limit, a bad size exits 2 before loading."""
    write(tmp_path / "si.cif", bulk("Si", "diamond", a=5.43, cubic=True))
    runs = {}
    for limit in ("auto", "2GB"):
        out = tmp_path / f"{limit}.json"
        assert main(["predict", str(tmp_path / "si.cif"), "--json", str(out), "--memory-limit", limit,
                     "--dtype", "float64"]) == 0
        runs[limit] = json.loads(out.read_text())[0]
    assert runs["auto"] == runs["2GB"]
    assert main(["predict", str(tmp_path / "si.cif"), "--memory-limit", "0.1MB"]) == 2
    err = capsys.readouterr().err
    assert "8 atoms with" in err and "more than the memory limit of 102 KB" in err and "Traceback" not in err
    assert main(["relax", str(tmp_path / "si.cif"), "--memory-limit", "lots"]) == 2
    assert "--memory-limit must be 'auto' or a positive size" in capsys.readouterr().err


def test_errors_exit_2_with_message(tmp_path, capsys):
    assert main(["predict", str(tmp_path / "missing.cif")]) == 2
    assert "no structure file" in capsys.readouterr().err
    assert main(["predict", "--model", str(tmp_path / "nope.pth.tar")]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_console_script_help():
    res = subprocess.run([sys.executable, "-m", "matris.cli", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "predict" in res.stdout
    res = subprocess.run([sys.executable, "-m", "matris.cli", "predict", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "--model" in res.stdout and "bundled" in res.stdout


def test_recipes_are_listed_and_taken_by_name(capsys, tmp_path, monkeypatch):
    from pathlib import Path

    assert main(["recipes"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert {"tiny", "matris-10m-oam", "finetune"} <= set(names)
    assert main(["recipes", "--path", "tiny"]) == 0
    assert Path(capsys.readouterr().out.strip()).is_file()
    monkeypatch.chdir(tmp_path)  # a recipe name works from any folder
    assert main(["train", "--config", "tiny", "--print-config", "--trainer.max_steps", "7"]) == 0
    out = capsys.readouterr().out
    assert "max_steps: 7" in out and "model:" in out
    assert main(["finetune", "--from", "demo", "--config", "finetune", "--print-config"]) == 0
    assert "from_checkpoint: demo" in capsys.readouterr().out
    assert main(["train", "--config", "tiyn"]) == 2
    assert "tiny" in capsys.readouterr().err  # the error lists the recipes


def test_a_copied_recipe_trains_as_it_is_and_a_lone_copy_says_what_paths_resolve_against(capsys, tmp_path,
                                                                                          monkeypatch):
    """Relative data paths in a config resolve against the config file's folder: --copy brings
    the data along; a lone copy of the YAML names that rule and the absolute path it tried."""
    import shutil
    from pathlib import Path

    from matris import recipes
    from matris.train import TrainConfig

    monkeypatch.chdir(tmp_path)
    assert main(["recipes", "--copy", "tiny", "mine"]) == 0
    assert "train with: matris train --config mine/tiny.yaml" in capsys.readouterr().out
    assert (tmp_path / "mine" / "data" / "emt_train.extxyz").read_bytes() == \
        (recipes.folder() / "data" / "emt_train.extxyz").read_bytes()
    config = TrainConfig.from_yaml("mine/tiny.yaml")
    config.check_data_paths()  # the copy is valid as it is
    assert Path(config.data.train[0]).resolve() == (tmp_path / "mine" / "data" / "emt_train.extxyz").resolve()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    assert main(["recipes", "--copy", "tiny", "mine"]) == 2  # an earlier copy is kept ...
    assert "--overwrite" in capsys.readouterr().err
    assert main(["recipes", "--copy", "tiny", "mine", "--overwrite"]) == 0  # ... unless asked
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "mine").rglob("*")) == ["data", "emt_train.extxyz", "notes.txt",
                                                                       "tiny.yaml"]  # no temp files left

    shutil.copy(recipes.find("tiny"), tmp_path / "lone.yaml")  # what `cp $(matris recipes --path tiny) .` makes
    assert main(["train", "--config", "lone.yaml", "--trainer.out_dir", "run"]) == 2
    err = capsys.readouterr().err
    assert "data file 'data/emt_train.extxyz' does not exist" in err
    assert f"resolved against the config file's folder ({tmp_path.resolve()})" in err
    assert str((tmp_path / "data" / "emt_train.extxyz").resolve()) in err and "matris recipes --copy" in err
    assert not (tmp_path / "run").exists()  # refused before anything was written
    assert main(["train", "--config", "lone.yaml", "--data.train", "[nope.extxyz]"]) == 2
    assert "resolved against the current folder" in capsys.readouterr().err
