"""benchmarks/peers.py end to end on the smallest case: our model in a worker process of its own,
the fresh-process memory row, the interleaved timing, the table, and a missing peer environment
reported as a row with its reason."""

import json
import sys
from pathlib import Path

import pytest

from benchmarks import peers

ROOT = Path(__file__).resolve().parents[1]


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
    st = peers.structure("srtio3_135")
    assert st["n_atoms"] == 135 and st["formula"] == "O81Sr27Ti27"
    assert peers.structure("si64")["n_atoms"] == 64


def test_without_environments_the_error_names_the_option(monkeypatch):
    monkeypatch.delenv("MATRIS_PEERS_ENVS", raising=False)
    with pytest.raises(SystemExit, match=r"--envs DIR or set \$MATRIS_PEERS_ENVS"):
        peers.main(["--smoke"])


WORKER = '''
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("benchmarks_common", sys.argv[1])
common = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = common
spec.loader.exec_module(common)
ready = lambda: print("a package's print: stderr, not the protocol's channel") or {"ready": True}
sys.exit(common.serve(ready, {"add": lambda a, b: {"sum": a + b},
                                                "fail": lambda: 1 / 0, "sleep": lambda s: time.sleep(s) or {}}))
'''


def test_the_worker_protocol_answers_errors_and_stops_a_worker(tmp_path):
    """benchmarks/common.py's two sides, in an isolated interpreter (as the peers' workers run):
    the hello, an answer with the worker's memory, an error with its traceback, and the guard
    that stops a worker past its time."""
    from benchmarks.common import HERE, Worker, WorkerError

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with Worker([sys.executable, "-I", script, HERE / "common.py"], name="toy") as worker:
        assert worker.hello["ready"] and worker.hello["rss_gb"] > 0
        answer = worker.request("add", a=2, b=3)
        assert answer["sum"] == 5 and answer["peak_rss_gb"] >= answer["rss_gb"] > 0
        with pytest.raises(WorkerError, match="toy: ZeroDivisionError") as failed:
            worker.request("fail")
        assert "1 / 0" in failed.value.traceback
        with pytest.raises(WorkerError, match="unknown request 'nope'"):
            worker.request("nope")
    slow = Worker([sys.executable, "-I", script, HERE / "common.py"], name="slow", timeout_s=1)
    with pytest.raises(WorkerError, match="no answer within 1 s"):
        slow.request("sleep", s=30)
    slow.close()


def test_recorded_commands_read_as_they_run_now():
    from benchmarks.common import command_now

    assert command_now("python benchmarks/cpu_speed.py --official /opt/x/site --json benchmarks/results/a.json") \
        == "python -m benchmarks.cpu_speed --official site --json benchmarks/results/a.json"
    assert command_now("matris bench --sizes 8") == "matris bench --sizes 8"
