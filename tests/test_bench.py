"""``matris bench`` and matris.bench on tiny inputs: consistent numbers and files, skipped
comparison models, user files, out-of-memory / time-limit handling and clear errors."""

import csv
import importlib.util
import json
import sys

import numpy as np
import pytest
from ase.build import bulk
from ase.io import write

from matris.bench import (
    BenchConfig,
    format_table,
    plot,
    read_bench_structures,
    run_bench,
    standard_structure,
    write_csv,
    write_json,
)
from matris.bench.measure import median_time, ns_per_day
from matris.bench.results import OK, OUT_OF_MEMORY, SKIPPED, TOO_SLOW
from matris.bench.structures import DEFAULT_SIZES, supercell_repeats
from matris.cli import main

HAVE_CHGNET = importlib.util.find_spec("chgnet") is not None


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One PyTorch thread: on a shared 2-core machine, two threads made these calls up to 100× slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def result():
    return run_bench(BenchConfig(sizes=[64, 8], compare=[], repeat=2, md_steps=2))


def test_rows_are_consistent(result):
    rows = result.rows
    assert [(r.structure, r.atoms) for r in rows] == [("Si 8", 8), ("Si 64", 64)]  # smallest first
    for r in rows:
        assert r.status == OK and r.model == "matris" and r.repeats == 2
        assert r.atoms_per_s == pytest.approx(r.atoms / r.efs_s)
        assert 0 < r.graph_s < r.efs_s and r.graph_share == pytest.approx(r.graph_s / r.efs_s)
        assert r.md_steps == 2 and r.md_steps_per_s == pytest.approx(2 / r.md_s)
        assert r.ns_per_day == pytest.approx(r.md_steps_per_s * 1.0 * 86400 * 1e-6)
        assert r.peak_memory_gb > 0 and r.time_ratio == r.md_ratio == 1.0
    assert result.models[0].status == OK and result.models[0].parameters > 0
    assert "GiB" in format_table(result) and "Si 64" in format_table(result)


def test_json_csv_plot_agree(result, tmp_path):
    write_json(result, tmp_path / "b.json")
    write_csv(result, tmp_path / "b.csv")
    plot(result, tmp_path / "b.png")
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["meta"]["memory"] and data["meta"]["repeat"] == 2 and len(data["rows"]) == 2
    # provenance: which model (by content) and which code made the numbers
    from matris.bundled import DEMO_CHECKPOINT
    from matris.pretrained.cache import sha256_file

    assert data["meta"]["model"] == "matris-demo" and data["meta"]["model_sha256"] == sha256_file(DEMO_CHECKPOINT)
    assert data["meta"]["command"] and "commit" in data["meta"]
    with open(tmp_path / "b.csv") as fh:
        lines = list(csv.DictReader(fh))
    for row, line, obj in zip(data["rows"], lines, result.rows):
        assert row["efs_s"] == obj.efs_s and float(line["efs_s"]) == pytest.approx(obj.efs_s, rel=1e-12)
        assert float(line["atoms_per_s"]) == pytest.approx(int(line["atoms"]) / float(line["efs_s"]))
        assert line["structure"] == row["structure"]
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_user_file_and_missing_comparison(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "chgnet" or m.startswith("chgnet.")] + ["chgnet"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing chgnet now fails as if not installed
    write(tmp_path / "si.cif", bulk("Si", "diamond", a=5.43, cubic=True))
    out = tmp_path / "out"
    assert main(["bench", "--structures", str(tmp_path / "si.cif"), "--compare", "chgnet", "--repeat", "1",
                 "--md-steps", "1", "--out", str(out), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "CHGNet (0.3.0): skipped, not installed" in table and "pip install chgnet" in table
    data = json.loads((out / "bench.json").read_text())
    assert [(m["key"], m["status"]) for m in data["models"]] == [("matris", "ok"), ("chgnet", "not installed")]
    assert [(r["model"], r["structure"], r["atoms"]) for r in data["rows"]] == [("matris", "si.cif", 8)]
    assert (out / "bench.csv").read_text().count("\n") == 2 and (out / "bench.png").stat().st_size > 0
    assert (out / "bench.log").read_text().strip() == table.strip()


def test_out_of_memory_and_time_limit_skip_larger_sizes(monkeypatch):
    from matris.calculator import MatRISCalculator

    calculate = MatRISCalculator.calculate

    def fails_large(self, atoms=None, *args, **kwargs):
        if len(atoms) >= 16:
            raise MemoryError("simulated: out of memory")
        return calculate(self, atoms, *args, **kwargs)

    cfg = dict(compare=[], repeat=1, md_steps=0)
    monkeypatch.setattr(MatRISCalculator, "calculate", fails_large)
    res = run_bench(BenchConfig(sizes=[8, 16, 24], **cfg))
    assert [r.status for r in res.rows] == [OK, OUT_OF_MEMORY, SKIPPED]
    assert "Si 16 (16 atoms) ran out of memory" in res.rows[2].note and res.rows[1].efs_s is None
    monkeypatch.setattr(MatRISCalculator, "calculate", calculate)
    res = run_bench(BenchConfig(sizes=[8, 16], max_seconds=1e-6, **cfg))
    assert [r.status for r in res.rows] == [TOO_SLOW, SKIPPED] and res.rows[0].efs_s > 1e-6
    assert "over --max-seconds" in format_table(res)


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "10"], "multiples of 8"),
    (["--sizes", "16", "--max-atoms", "8"], "nothing to benchmark"),
    (["--compare", "nonsense"], "unknown comparison model"),
    (["--compare", "matris"], "MatRIS is always measured"),
    (["--repeat", "0"], "repeat must be"),
    (["--md-steps", "-1"], "md_steps must be"),
    (["--structures", "missing.cif"], "no structure file"),
    (["--structures", "garbage.xyz"], "is not a valid"),
    (["--model", "nope.pth.tar"], "nope.pth.tar"),
])
def test_bad_inputs_exit_2_with_message(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "garbage.xyz").write_text("this is not\na structure file\n")
    assert main(["bench", "--sizes", "8", "--compare", "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("matris bench: error:")


def test_standard_structures_and_readers(tmp_path):
    from pymatgen.core import Lattice, Structure

    from matris.bench.structures import from_objects

    assert supercell_repeats(1024) == (8, 8, 16) and supercell_repeats(27) == (3, 3, 3)
    assert [len(standard_structure("si", n).atoms) for n in DEFAULT_SIZES] == list(DEFAULT_SIZES)
    a, b = standard_structure("mgo", 64).atoms, standard_structure("mgo", 64).atoms
    assert set(a.get_chemical_symbols()) == {"Mg", "O"} and np.array_equal(a.positions, b.positions)
    Structure.from_ase_atoms(bulk("Si", "diamond", a=5.43)).to(filename=str(tmp_path / "si.json"))
    (item,) = read_bench_structures([tmp_path / "si.json"])  # ASE cannot read it; pymatgen can
    assert item.num_atoms == 2 and item.name == "si.json"
    mgo = Structure(Lattice.cubic(4.21), ["Mg", "O"], [[0, 0, 0], [0.5, 0.5, 0.5]])
    (obj,) = from_objects([mgo])  # what run_bench(config, structures=[...]) takes
    assert obj.num_atoms == 2 and obj.has_volume and obj.name == "MgO"
    assert ns_per_day(1.0, 2.0) == pytest.approx(0.1728)
    calls = []
    timing = median_time(lambda: calls.append(1), repeat=3)
    assert len(calls) == 4 and len(timing.times) == 3 and timing.seconds == sorted(timing.times)[1]


@pytest.mark.skipif(not HAVE_CHGNET, reason="chgnet is not installed")
def test_compare_with_chgnet_side_by_side():
    res = run_bench(BenchConfig(sizes=[8], compare=["chgnet"], repeat=1, md_steps=1))
    ours, theirs = res.row("matris", "Si 8"), res.row("chgnet", "Si 8")
    assert ours.status == theirs.status == OK and res.models[1].parameters > 400_000
    assert theirs.time_ratio == pytest.approx(theirs.efs_s / ours.efs_s)
    assert theirs.md_ratio == pytest.approx(ours.md_steps_per_s / theirs.md_steps_per_s)
    assert theirs.graph_s is not None and "CHGNet (0.3.0)" in format_table(res)
