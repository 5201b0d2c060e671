"""Defaults a user can see: the bundled model announces itself when no model is named, and one
device/dtype rule for every entry point (a MatRIS keeps its own; "auto" picks CUDA when present)."""

import warnings
from pathlib import Path

import pytest
import torch
from ase.build import bulk

from matris import MatRIS, MatRISCalculator, bundled
from matris.cli import main
from matris.devices import device_and_dtype, resolve_device


@pytest.fixture
def fresh_notice(monkeypatch):
    monkeypatch.setattr(bundled, "_notice", {"shown": False, "stderr": False})


def test_unnamed_model_warns_once_per_process(fresh_notice):
    with pytest.warns(UserWarning, match="bundled demo model matris-demo.*matris-10m-oam"):
        MatRIS.load()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MatRIS.load()  # once per process
        MatRISCalculator()


def test_a_named_model_says_nothing(fresh_notice):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MatRIS.load("demo")
        MatRIS.load("matris-demo", device="auto", dtype="float64")
    assert not bundled._notice["shown"]


def test_cli_prints_one_plain_note(fresh_notice, capsys, tmp_path):
    assert main(["predict", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("matris: note: no model named") == 1 and "UserWarning" not in err
    assert main(["predict", "--quiet", "--model", "demo"]) == 0
    assert "note" not in capsys.readouterr().err


def test_calculator_keeps_a_models_device_and_dtype():
    model = MatRIS.load("demo", dtype=torch.float64)
    calc = MatRISCalculator(model)
    assert calc.model is model and calc.dtype == torch.float64  # used as is, not a float32 copy
    atoms = bulk("Si", "diamond", a=5.43)
    atoms.calc = calc
    e64 = atoms.get_potential_energy()
    calc32 = MatRISCalculator(model, dtype="float32")
    assert calc32.model is not model and calc32.dtype == torch.float32 and model.dtype == torch.float64
    atoms.calc = calc32
    assert atoms.get_potential_energy() == pytest.approx(e64, abs=1e-3)
    named = MatRISCalculator("demo")
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    assert named.dtype == torch.float32 and named.device.type == auto


def test_one_rule_everywhere():
    """A model named by name, path or URL runs on device "auto" in float32, in Python, in the
    CLI and in LAMMPS; a MatRIS object keeps its own."""
    import inspect

    from matris.cli import build_parser
    from matris.lammps.runtime import LammpsEvaluator

    model = MatRIS.load("demo", dtype=torch.float64)
    assert device_and_dtype(model, None, None) == (model.device, torch.float64)
    assert device_and_dtype("demo", None, None) == ("auto", "float32")
    assert device_and_dtype(model, "cpu", "float32") == ("cpu", "float32")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert MatRIS.load("demo").device.type == expected and MatRIS.load("demo").dtype == torch.float32
    assert MatRIS.load("demo", device="auto").device.type == expected
    assert MatRISCalculator("demo", device="auto").device.type == expected
    params = inspect.signature(LammpsEvaluator).parameters
    assert params["device"].default == "auto" and params["dtype"].default == "float32"
    header = (Path(bundled.__file__).parent / "lammps" / "src" / "pair_matris.h").read_text()
    assert 'device_ = "auto", dtype_ = "float32"' in header
    # every command with --device/--dtype: auto and float32, and the help says so; the one exception
    # (the κ task: force constants are differences of forces) is float64, and the defaults section says so
    exceptions = {"matris discovery kappa": "float64"}
    text = (Path(bundled.__file__).parent.parent / "docs" / "calculator.md").read_text()
    assert all(f"`{name}`" in text for name in exceptions)
    checked = 0
    for name, sub in _subparsers(build_parser()):
        options = {a.dest: a for a in sub._actions}
        if "device" in options:
            assert options["device"].default == "auto" and "auto (default" in options["device"].help, name
            checked += 1
        if "dtype" in options and name in exceptions:
            want = exceptions[name]
            assert options["dtype"].default == want and f"(default: {want}" in options["dtype"].help, name
        elif "dtype" in options:
            assert options["dtype"].default == "float32" and "float32 (default" in options["dtype"].help, name
    assert checked >= 7  # predict relax md eos phonons bench discovery relax


def _subparsers(parser, prefix="matris"):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from _subparsers(sub, f"{prefix} {name}")


def test_notice_points_at_a_model_card_that_exists(fresh_notice):
    """The notice names the installed model card (package data), not a path of the source tree."""
    assert bundled.MODEL_CARD.is_file() and str(bundled.MODEL_CARD) in bundled.DEFAULT_MODEL_NOTICE
    assert "once per process" in bundled.announce_default_model.__doc__
    assert "one-time" not in bundled.MODEL_CARD.read_text()
