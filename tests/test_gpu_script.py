"""python -m benchmarks.gpu always reports: the JSON after every check, errors per check with the
last traceback frame, time budgets per section; and its CPU dry run (--smoke --quick)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    import benchmarks.gpu as module

    monkeypatch.setattr(module, "REPORT", module.Report(tmp_path / "gpu.json"))
    monkeypatch.setattr(module, "RESULTS", {})
    return module


def test_every_check_is_written_at_once_and_errors_are_recorded(gpu, tmp_path):
    sec = gpu.Section("9. test", budget_s=60)
    sec.check("fine", lambda: {"ok": True})
    assert json.loads((tmp_path / "gpu.json").read_text())["9. test"]["fine"] == {"ok": True}

    def broken():
        return {"x": 1} / 2

    sec.check("broken", broken)
    sec.check("after", lambda: {"ok": True})  # the next check still runs
    saved = json.loads((tmp_path / "gpu.json").read_text())["9. test"]
    assert saved["broken"]["error"].startswith("TypeError") and "in broken" in saved["broken"]["where"]
    assert "{'x': 1} / 2" in saved["broken"]["where"] or '{"x": 1} / 2' in saved["broken"]["where"]
    assert saved["after"] == {"ok": True}
    assert gpu.failures({"9. test": saved}) == ["/9. test/broken"]


def test_a_spent_budget_skips_the_remaining_checks(gpu, tmp_path):
    sec = gpu.Section("9. test", budget_s=0.05)
    sec.check("first", lambda: time.sleep(0.1) or {"ok": True})
    sec.check("second", lambda: {"ok": True})
    saved = json.loads((tmp_path / "gpu.json").read_text())["9. test"]
    assert saved["first"] == {"ok": True} and "budget" in saved["second"]["skipped"]


def test_an_error_outside_the_checks_keeps_the_section(gpu, tmp_path):
    @gpu.section("9. sectioned")
    def sectioned(sec):
        sec.check("one", lambda: {"ok": True})
        raise RuntimeError("between checks")

    sectioned()
    saved = json.loads((tmp_path / "gpu.json").read_text())["9. sectioned"]
    assert saved["one"] == {"ok": True} and saved["error"].startswith("RuntimeError") and "seconds" in saved


NO_ASE = """
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ase", "pymatgen"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Absent())
"""


def test_runs_as_a_module_without_ase_or_pymatgen(tmp_path):
    """python -m benchmarks.gpu from the repository's root, where ase and pymatgen are not
    installed (a bare GPU machine): the script and what it imports at start need neither."""
    (tmp_path / "sitecustomize.py").write_text(NO_ASE)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    code = "import benchmarks.gpu\ntry:\n    import ase\nexcept ImportError:\n    print('no ase')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0 and "no ase" in res.stdout, res.stderr[-3000:]
    res = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--help"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0 and "--quick" in res.stdout, res.stderr[-3000:]


@pytest.mark.slow
def test_cpu_dry_run_of_the_quick_run(tmp_path):
    """TRITON_INTERPRET=1 python -m benchmarks.gpu --smoke --quick: correctness and E+F+S in the
    interpreter; every check passes and the JSON records the commit and the command."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "MATRIS_KERNELS"}
    env["TRITON_INTERPRET"] = "1"
    out = tmp_path / "smoke.json"
    res = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--smoke", "--quick", "--json", str(out)],
                         capture_output=True, text=True, env=env, timeout=1500, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    data = json.loads(out.read_text())
    assert data["meta"]["finished"] and data["meta"]["failed"] == [] and data["meta"]["quick"]
    assert "--smoke --quick" in data["meta"]["command"]
    assert data["1. correctness on the device"]["parity_float64_triton/small_sh_float64"]["ok"]
    assert data["3. energy+forces+stress, Triton vs reference"]["Si8"]["triton"]["s"] > 0
