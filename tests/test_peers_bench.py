"""benchmarks/peers.py end to end on the smallest case: our model in a worker process of its own,
the fresh-process memory row, the interleaved timing, the table, and a missing peer environment
reported as a row with its reason."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture()
def envs(tmp_path):
    # an "environment" for ours that is this interpreter (the test's checkout); no other peer is set up
    bin_dir = tmp_path / "envs" / "ours" / "bin"
    bin_dir.mkdir(parents=True)
    # a wrapper, not a symlink: a venv's interpreter finds its site-packages from its own path
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return tmp_path / "envs"


def test_smoke_run_writes_rows_and_reasons(envs, tmp_path, monkeypatch):
    from benchmarks import peers

    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # stripped for the workers: ours comes from the install
    out = tmp_path / "peers.json"
    assert peers.main(["--smoke", "--models", "ours", "chgnet", "--envs", str(envs), "--json", str(out),
                       "--threads", "1"]) == 0
    result = json.loads(out.read_text())
    ours = result["models"]["ours"]
    assert ours["params"] == ours["published_params"] == 10_443_505
    entry = ours["structures"]["si8"]
    assert entry["peak_rss_gb"] > entry["base_rss_gb"] > 0
    assert entry["efs_seconds"]["n"] == 1 and entry["md_seconds"]["median"] > 0
    chgnet = result["models"]["chgnet"]
    assert "not set up" in chgnet["error"] and "--setup chgnet" in chgnet["error"]
    assert result["meta"]["gemm"]["gflops_1024cubed"] > 0
    table = peers.markdown(str(out))
    assert "MatRIS-10M (ours)" in table and "not run: " in table


def test_structures_are_the_documented_cells():
    from benchmarks import peers

    st = peers.structure("srtio3_135")
    assert st["n_atoms"] == 135 and st["formula"] == "O81Sr27Ti27"
    assert peers.structure("si64")["n_atoms"] == 64
