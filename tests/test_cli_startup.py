"""Fast start, fast failure: ``matris --help``, every ``matris CMD --help``, ``--version``,
argument errors and missing or wrong input files answer without importing torch (or ase,
pymatgen, numpy), in a fresh interpreter as a user runs them. Checked by the imports, not by a
stopwatch: ``python -X importtime`` lists every module a run imported."""

import subprocess
import sys
from pathlib import Path

import pytest

from matris.cli import SUBCOMMANDS

HEAVY = ("torch", "ase", "pymatgen", "numpy", "scipy", "lightning", "phonopy")
ROOT = Path(__file__).resolve().parents[1]


def run_matris(*args: str, cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -X importtime -m matris ARGS``: the result and the top-level packages it imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "matris", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)
    imported = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            imported.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    proc.stderr = "\n".join(ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:"))
    return proc, imported


def assert_light(imported: set[str]) -> None:
    heavy = sorted(imported & set(HEAVY))
    assert not heavy, f"imported {heavy}"


def test_help_and_version_import_nothing_heavy():
    proc, imported = run_matris("--help")
    assert proc.returncode == 0 and "predict" in proc.stdout and "recipes" in proc.stdout
    assert "--device auto" in proc.stdout and "float32" in proc.stdout  # the defaults, stated once
    assert_light(imported)
    proc, imported = run_matris("--version")
    from matris import __version__

    assert proc.returncode == 0 and __version__ in proc.stdout and "matris-mlip" in proc.stdout
    assert_light(imported)


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_command_help_imports_nothing_heavy(command):
    proc, imported = run_matris(command, "--help")
    assert proc.returncode == 0 and f"matris {command}" in proc.stdout, proc.stderr
    assert_light(imported)


def test_train_help_lists_the_config_keys_without_torch():
    proc, imported = run_matris("train", "--help")
    assert "--optim.lr" in proc.stdout and "[trainer]" in proc.stdout and "matris recipes" in proc.stdout
    assert_light(imported)


@pytest.mark.parametrize("args, words", [
    (["predict", "--dtype", "float16"], "invalid choice"),
    (["predict", "--bogus"], "unrecognized arguments"),
    # a misspelt option: the subcommand's usage and its closest option, not the top-level usage
    (["predict", "--modle", "x"], "usage: matris predict"),
    (["predict", "--modle", "x"], "matris predict: error: unrecognized arguments: --modle; did you mean --model?"),
    (["relax", "x.cif", "--fmx", "0.1"], "did you mean --fmax?"),
    (["relax"], "the following arguments are required"),
    (["predict", "missing.cif"], "no structure file missing.cif"),
    (["relax", "missing.cif"], "no structure file"),
    (["md", "missing.cif"], "no structure file"),
    (["eos", "tests"], "is a folder, not a structure file"),
    (["phonons", "missing.cif"], "no structure file"),
    (["bench", "--structures", "missing.cif"], "no structure file"),
    (["predict", "--model", "missing.pth.tar"], "no checkpoint at missing.pth.tar"),
    (["predict", "--model", "tests"], "is a folder, not a checkpoint file"),
    (["predict", "--model", "matris-10m-oan"], "Did you mean 'matris-10m-oam'"),
    (["train", "--config", "missing.yaml"], "no recipe of that name"),
    (["finetune", "--from", "missing.pth.tar", "--config", "tiny"], "no checkpoint at"),
    (["data", "build", "missing.yaml"], "no recipe of that name"),
    (["export", "lammps", "missing.pth.tar", "-o", "x.pth"], "no checkpoint at"),
])
def test_argument_and_file_errors_import_nothing_heavy(args, words, tmp_path):
    proc, imported = run_matris(*args)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert_light(imported)


def test_bench_help_names_match_the_bench_package():
    """cli/bench.py keeps copies of the benchmark's names so that its --help needs no torch."""
    from matris.bench.runners import COMPARISONS
    from matris.bench.structures import DEFAULT_SIZES, FAMILIES
    from matris.cli import bench

    assert bench.COMPARISONS == tuple(COMPARISONS)
    assert sorted(bench.FAMILIES) == sorted(FAMILIES)
    assert bench.DEFAULT_SIZES == tuple(DEFAULT_SIZES)
