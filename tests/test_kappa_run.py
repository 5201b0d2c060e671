"""``matris discovery kappa`` and ``kappa-metrics``: sharded, resumable, a failure recorded per
structure, and a real SIGKILL mid-run followed by a rerun gives the same final results."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ase.build import bulk
from ase.io import write

from matris.cli import main as cli_main
from matris.discovery.kappa_run import read_results

pytest.importorskip("phono3py")
BIN = Path(sys.executable).parent


FAST = ["--fmax", "0.01"]  # a looser relaxation than the benchmark's 1e-5 eV/Å (MatRIS): the tests' time


def structures(path, bad=False, ids=("si", "mgo", "c")):
    cells = []
    table = {"si": ("Si", "diamond", 5.43), "mgo": ("MgO", "rocksalt", 4.21), "c": ("C", "diamond", 3.57)}
    for mid, (name, kind, a) in ((k, table[k]) for k in ids):
        atoms = bulk(name, kind, a=a)
        atoms.info.update(material_id=mid, fc2_supercell=[1, 1, 1], fc3_supercell=[1, 1, 1], q_mesh=[3, 3, 3])
        cells.append(atoms)
    if bad:  # a q-mesh phono3py refuses: that structure fails, the others go on
        cells[1].info["q_mesh"] = [0, 0, 0]
    write(path, cells)
    return path


@pytest.mark.slow
def test_a_run_records_failures_resumes_and_scores(tmp_path, capsys):
    src = structures(tmp_path / "s.extxyz", bad=True)
    out = tmp_path / "run"
    assert cli_main(["discovery", "kappa", "--model", "demo", "--structures", str(src), "--out", str(out)] + FAST) == 0
    assert "2 computed, 1 failed" in capsys.readouterr().err
    lines = read_results(out)
    assert lines["mgo"].error and not lines["si"].error and lines["si"].spg_initial == lines["si"].spg_final == 227
    assert cli_main(["discovery", "kappa", "--model", "demo", "--structures", str(src), "--out", str(out)] + FAST) == 0
    err = capsys.readouterr().err
    assert "0 computed, 0 failed, 3 done before" in err and "was already complete in" in err
    # other settings in the same folder are refused
    assert cli_main(["discovery", "kappa", "--model", "demo", "--structures", str(src), "--out", str(out),
                     "--dtype", "float32"] + FAST) == 2
    assert "other settings" in capsys.readouterr().err
    # scored against a complete reference: the failed material counts 2, the others 0 (the same run)
    ref = tmp_path / "ref"
    good = structures(tmp_path / "good.extxyz")
    assert cli_main(["discovery", "kappa", "--model", "demo", "--structures", str(good), "--out", str(ref)] + FAST) == 0
    capsys.readouterr()
    assert cli_main(["discovery", "kappa-metrics", "--pred", str(out), "--true", str(ref), "--json",
                     str(tmp_path / "m.json")]) == 0
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["per_material"]["mgo"]["SRME"] == 2.0 and m["per_material"]["si"]["SRME"] == 0.0
    assert m["kappa_SRME"] == pytest.approx(2 / 3)
    assert cli_main(["discovery", "report", "--kappa-pred", str(out), "--kappa-true", str(ref), "--name", "demo",
                     "--out", str(tmp_path / "report")]) == 0
    assert "| demo | – | – | 0.667 | – | – |" in capsys.readouterr().out
    assert (tmp_path / "report" / "kappa.png").stat().st_size > 10_000
    # the reference as a DFT κ table (the benchmark's layout) works the same way
    rows = [{"material_id": k, "kappa_tot_rta": line.kappa, "mode_kappa_tot_rta": line.mode_kappa,
             "mode_weights": line.weights} for k, line in read_results(ref).items()]
    (tmp_path / "dft.json").write_text(json.dumps(rows))
    assert cli_main(["discovery", "report", "--kappa-pred", str(out), "--kappa-true", str(tmp_path / "dft.json"),
                     "--name", "demo", "--out", str(tmp_path / "report-dft")]) == 0
    assert "| demo | – | – | 0.667 | – | – |" in capsys.readouterr().out
    # a failed reference cannot be scored against
    assert cli_main(["discovery", "kappa-metrics", "--pred", str(ref), "--true", str(out)]) == 2
    assert "reference" in capsys.readouterr().err


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_gives_the_same_results(tmp_path):
    src = structures(tmp_path / "s.extxyz", ids=("si", "c"))
    args = [str(BIN / "matris"), "discovery", "kappa", "--model", "demo", "--structures", str(src)] + FAST
    env = dict(os.environ, MATRIS_OFFLINE="1")
    subprocess.run(args + ["--out", str(tmp_path / "whole")], check=True, env=env, capture_output=True)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(args + ["--out", str(killed)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    shard = killed / "shard-0-of-1.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (shard.exists() and shard.read_text().count("\n") >= 1):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert shard.read_text().count("\n") == 1  # killed after the first structure, before the last
    subprocess.run(args + ["--out", str(killed)], check=True, env=env, capture_output=True)
    whole, resumed = read_results(tmp_path / "whole"), read_results(killed)
    assert set(whole) == set(resumed) == {"si", "c"}
    for key in whole:
        assert resumed[key].kappa == whole[key].kappa and resumed[key].mode_kappa == whole[key].mode_kappa, key


def test_the_published_structures_offline_are_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MATRIS_OFFLINE", "1")
    monkeypatch.setenv("MATRIS_CACHE", str(tmp_path / "cache"))
    assert cli_main(["discovery", "kappa", "--model", "demo", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "phonondb_pbe_103_structures" in err and "https://figshare.com/files/52179965" in err
    assert "2024-11-09-phononDB-PBE-103-structures.extxyz" in err
