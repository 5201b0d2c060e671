"""The sharded, parallel, resumable graph-cache build (matris.data.build, ``matris data build``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from matris.data import CachedDataset, build_or_load, read_samples
from matris.errors import MatRISInputError
from matris.graph import GraphBatch

CUTOFF, R3 = 4.5, 3.0
ROOT = Path(__file__).resolve().parents[1]


def _frames(n: int, seed: int = 0, size=(1, 1, 1)):
    from ase.build import bulk
    from ase.calculators.singlepoint import SinglePointCalculator

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        a = (bulk("Si", "diamond", a=5.43) if k % 3 == 0 else bulk("Cu", "fcc", a=3.6) if k % 3 == 1
             else bulk("MgO", "rocksalt", a=4.21)).repeat(size)
        a.rattle(0.05, seed=int(rng.integers(1 << 30)))
        a.calc = SinglePointCalculator(a, energy=float(rng.normal()) - 3.0 * len(a),
                                       forces=rng.normal(size=(len(a), 3)), stress=rng.normal(size=6) * 0.01)
        out.append(a)
    return out


def _write(path: Path, frames) -> Path:
    import ase.io

    ase.io.write(path, frames, format="extxyz")
    return path


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _assert_same_batches(a, b, n):
    idx = list(range(n))
    ga, ta = a.collate(idx, dtype=torch.float64)
    gb, tb = b.collate(idx, dtype=torch.float64)
    for f in fields(GraphBatch):
        assert torch.equal(getattr(ga, f.name), getattr(gb, f.name)), f.name
    for name in ("energy", "forces", "stress", "magmoms"):
        torch.testing.assert_close(getattr(ta, name), getattr(tb, name), rtol=0, atol=0, equal_nan=True)


@pytest.fixture(scope="module")
def data23(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("d") / "train.extxyz", _frames(23))


def test_shards_equal_one_piece_and_from_systems(tmp_path, data23):
    one = build_or_load(data23, CUTOFF, R3, cache_dir=tmp_path / "a", shard_size=1000, progress=False)
    report: list = []
    sharded = build_or_load(data23, CUTOFF, R3, cache_dir=tmp_path / "b", shard_size=5, progress=False,
                            report=report)
    assert isinstance(sharded, CachedDataset) and len(sharded.datasets) == 5 and len(one.datasets) == 1
    assert report[0].built == 5 and report[0].reused == 0 and report[0].records == 23
    assert sorted(p.name for p in sharded.directory.iterdir()) == [
        "manifest.json", "meta.json", *[f"shard-{k:05d}" for k in range(5)]]
    assert len(sharded) == 23 and sharded.meta["n_records"] == 23
    _assert_same_batches(one, sharded, 23)
    systems = [s.system for s in read_samples(data23)]
    idx = [22, 0, 7, 13, 5]
    graph, _ = sharded.collate(idx, dtype=torch.float64)
    ref = GraphBatch.from_systems([systems[i] for i in idx], CUTOFF, R3, dtype=torch.float64)
    for f in fields(GraphBatch):
        assert torch.equal(getattr(graph, f.name), getattr(ref, f.name)), f.name
    # reused: nothing built on the second call
    again: list = []
    build_or_load(data23, CUTOFF, R3, cache_dir=tmp_path / "b", shard_size=5, progress=False, report=again)
    assert again[0].built == 0


def test_parallel_build_is_byte_identical(tmp_path, data23):
    serial = build_or_load(data23, CUTOFF, R3, cache_dir=tmp_path / "serial", shard_size=4, progress=False)
    parallel = build_or_load(data23, CUTOFF, R3, cache_dir=tmp_path / "parallel", shard_size=4, workers=2,
                             progress=False)
    assert serial.directory.name == parallel.directory.name
    assert _tree(serial.directory) == _tree(parallel.directory)


def test_stream_source_in_parallel(tmp_path):
    """MPtrj JSON is a stream: the main process reads, workers build; same bytes as one process."""
    from pymatgen.io.ase import AseAtomsAdaptor

    data = {}
    for k, a in enumerate(_frames(11, seed=3)):
        s = AseAtomsAdaptor.get_structure(a)
        data.setdefault(f"mp-{k // 3}", {})[f"mp-{k // 3}-{k}"] = {
            "structure": s.as_dict(), "corrected_total_energy": a.get_potential_energy(),
            "force": a.get_forces().tolist(), "stress": (np.eye(3) * k).tolist(), "magmom": None}
    path = tmp_path / "mptrj.json"
    path.write_text(json.dumps(data))
    serial = build_or_load(path, CUTOFF, R3, cache_dir=tmp_path / "s", shard_size=3, progress=False)
    parallel = build_or_load(path, CUTOFF, R3, cache_dir=tmp_path / "p", shard_size=3, workers=2, progress=False)
    assert len(serial) == 11 and len(serial.datasets) == 4
    assert _tree(serial.directory) == _tree(parallel.directory)
    assert serial.material_ids[:4] == ["mp-0", "mp-0", "mp-0", "mp-1"]


def test_bad_record_in_a_shard(tmp_path):
    frames = _frames(9)
    frames[6].positions[1] = frames[6].positions[0] + 0.01  # overlapping atoms
    path = _write(tmp_path / "broken.extxyz", frames)
    with pytest.raises(MatRISInputError, match=r"broken\.extxyz: structure 6 .*closer than"):
        build_or_load(path, CUTOFF, R3, cache_dir=tmp_path / "c", shard_size=4, workers=2, progress=False)
    assert not [p for p in (tmp_path / "c").iterdir() if p.is_dir()]  # nothing half-built is kept
    with pytest.warns(UserWarning, match=r"skipped 1 invalid record of 9 .*record 6"):
        ds = build_or_load(path, CUTOFF, R3, cache_dir=tmp_path / "c", shard_size=4, skip_invalid=True,
                           progress=False)
    assert len(ds) == 8 and ds.n_skipped == 1 and ds.meta["skipped"]["first"][0]["index"] == 6


def _config(tmp_path: Path, data: Path, cache: Path) -> Path:
    from train_utils import MICRO_MODEL

    cfg = {"model": dict(MICRO_MODEL), "data": {"train": [str(data)], "cache_dir": str(cache), "shard_size": 40}}
    path = tmp_path / f"cfg-{cache.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_sigkill_and_resume_redoes_only_unfinished_shards(tmp_path):
    """A real SIGKILL of ``matris data build`` with 2 workers, then a rerun: finished shards are
    kept (same inodes), the rest is built, and the entry equals an uninterrupted build byte for byte."""
    data = _write(tmp_path / "big.extxyz", _frames(1200, seed=1))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "matris", "data", "build", str(_config(tmp_path, data, tmp_path / "killed")),
           "--workers", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    cache = tmp_path / "killed"
    deadline = time.time() + 240
    done: dict = {}
    while time.time() < deadline and proc.poll() is None:
        manifests = list(cache.glob(".*.partial/manifest.json"))
        if manifests:
            try:
                done = json.loads(manifests[0].read_text())["shards"]
            except (OSError, ValueError):
                done = {}
            if len(done) >= 2:
                break
        time.sleep(0.02)
    assert proc.poll() is None, f"the build ended before it could be killed: {proc.communicate()}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = next(cache.glob(".*.partial"))
    assert not (partial / "meta.json").exists()
    manifest = json.loads((partial / "manifest.json").read_text())
    kept = {k: os.stat(partial / f"shard-{int(k):05d}" / "positions.npy").st_ino for k in manifest["shards"]}
    assert 2 <= len(kept) < 30

    out = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    built = 30 - len(kept)
    assert f"reused {len(kept)}" in out.stdout and f"built {built} shard{'s' if built != 1 else ''}" in out.stdout
    entry = next(p for p in cache.iterdir() if p.is_dir() and not p.name.startswith("."))
    for k, inode in kept.items():  # finished shards were not rebuilt
        assert os.stat(entry / f"shard-{int(k):05d}" / "positions.npy").st_ino == inode
    fresh = build_or_load(data, MICRO_CUT[0], MICRO_CUT[1], cache_dir=tmp_path / "fresh", shard_size=40,
                          progress=False, reader_options={"mptrj_energy_key": "corrected_total_energy"})
    assert fresh.directory.name == entry.name
    assert _tree(fresh.directory) == _tree(entry)
    assert not list(cache.glob(".*"))  # no partial build or temporary is left beside the entry


MICRO_CUT = (4.5, 3.0)  # train_utils.MICRO_MODEL's cutoffs


def test_data_build_cli_errors(tmp_path, capsys):
    from matris.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"train": [str(tmp_path / "none-*.extxyz")]}}))
    assert main(["data", "build", str(cfg), "--no-progress"]) == 2
    assert "none-*.extxyz" in capsys.readouterr().err
    assert main(["data", "build", str(cfg), "--workers", "0"]) == 2
