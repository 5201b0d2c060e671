"""What the commands write and say, as a user compares them: the same labels in ``predict`` and
``relax``, output names as documented, messages with counts in the right number and no value said
twice, and rerun messages that name the option the way the reader gives it (issue 65, item 4)."""

import json

import pytest
from ase import Atoms
from ase.build import bulk
from ase.io import read, write

from matris.cli import main
from matris.cli.common import structure_stem
from matris.errors import MatRISInputError, counted
from matris.rerun import command_line, overwrite, spell


def _table_labels(out: str) -> list[str]:
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[0].startswith("structure")
    return [line.split()[0] for line in lines[1:]]


@pytest.fixture
def inputs(tmp_path):
    cu = bulk("Cu", "fcc", a=3.6, cubic=True)
    rattled = cu.copy()
    rattled.rattle(0.05, seed=1)
    write(tmp_path / "cu.extxyz", [cu, rattled])
    write(tmp_path / "POSCAR", cu, format="vasp")
    return [str(tmp_path / "cu.extxyz"), str(tmp_path / "POSCAR")]


def test_predict_and_relax_label_frames_alike_and_relax_names_files_as_documented(inputs, tmp_path, capsys):
    assert main(["predict", *inputs, "--json", str(tmp_path / "p.json")]) == 0
    captured = capsys.readouterr()
    predicted = _table_labels(captured.out)
    assert predicted == ["cu[0]", "cu[1]", "POSCAR"]
    assert [r["name"] for r in json.loads((tmp_path / "p.json").read_text())] == predicted
    assert "wrote 3 results to" in captured.err

    out = tmp_path / "relaxed"
    assert main(["relax", *inputs, "--steps", "2", "--out-dir", str(out)]) == 0
    assert _table_labels(capsys.readouterr().out) == predicted
    # NAME.relaxed.extxyz with NAME the label made file-safe, never NAME.extxyz.relaxed.extxyz
    assert sorted(p.name for p in out.glob("*.relaxed.extxyz")) == [
        "POSCAR.relaxed.extxyz", "cu_0.relaxed.extxyz", "cu_1.relaxed.extxyz"]
    rows = json.loads((out / "results.json").read_text())
    assert [(r["key"], r["name"]) for r in rows] == [("cu_0", "cu[0]"), ("cu_1", "cu[1]"), ("POSCAR", "POSCAR")]
    assert all(r["structure_file"].endswith(f"{r['key']}.relaxed.extxyz") for r in rows)


def test_one_result_is_singular(inputs, tmp_path, capsys):
    assert main(["predict", inputs[1], "--json", str(tmp_path / "q.json"), "--quiet"]) == 0
    assert "wrote 1 result to" in capsys.readouterr().err


def test_structure_stems():
    assert structure_stem("a/cu.extxyz") == "cu"
    assert structure_stem("mp-149.cif.gz") == "mp-149"
    assert structure_stem("POSCAR") == "POSCAR"
    assert structure_stem(".hidden") == ".hidden"


def test_two_files_of_one_stem_keep_their_full_names(tmp_path, capsys):
    si = bulk("Si", "diamond", a=5.43)
    write(tmp_path / "si.cif", si)
    write(tmp_path / "si.extxyz", si)
    assert main(["predict", str(tmp_path / "si.cif"), str(tmp_path / "si.extxyz")]) == 0
    assert _table_labels(capsys.readouterr().out) == ["si.cif", "si.extxyz"]


def test_a_dummy_atom_is_named_once(tmp_path, capsys):
    write(tmp_path / "x.extxyz", Atoms("X2", positions=[[0, 0, 0], [1.5, 0, 0]], cell=[5, 5, 5], pbc=True))
    assert main(["predict", str(tmp_path / "x.extxyz")]) == 2
    err = capsys.readouterr().err
    assert "structure 0 (x): atom 0 has Z=0 (ASE's dummy atom X, not an element)" in err
    assert err.count("Z=0") == 1
    write(tmp_path / "am.extxyz", Atoms("Am2", positions=[[0, 0, 0], [2.5, 0, 0]], cell=[5, 5, 5], pbc=True))
    assert main(["predict", str(tmp_path / "am.extxyz")]) == 2
    assert "atom 0 is Am (Z=95)" in capsys.readouterr().err


def test_counted():
    assert counted(1, "structure") == "1 structure"
    assert counted(0, "structure") == "0 structures"
    assert counted(2, "batch", "batches") == "2 batches"


def test_options_are_named_as_the_reader_gives_them():
    assert (overwrite(), spell("--steps 6", "steps=6")) == ("overwrite=True", "steps=6")
    with command_line():
        assert (overwrite(), spell("--steps 6", "steps=6")) == ("--overwrite", "--steps 6")
    assert overwrite() == "overwrite=True"


def test_md_rerun_names_the_flag_and_the_outputs_are_as_documented(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write("POSCAR", bulk("Cu", "fcc", a=3.6, cubic=True), format="vasp")
    args = ["md", "POSCAR", "--steps", "4", "--loginterval", "2", "--quiet"]
    assert main(args) == 0
    fresh = read("POSCAR.final.extxyz", format="extxyz")
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "holds a finished run (step 4, --steps 4)" in err and "pass --overwrite or another --trajectory" in err
    assert "overwrite=True" not in err and "steps=" not in err
    summary = json.loads((tmp_path / "POSCAR.json").read_text())
    assert set(summary) == {"file", "ensemble", "steps", "time_ps", "timestep_fs", "resumed_from", "loaded",
                            "steps_per_s", "ns_per_day", "trajectory", "restart", "final", "mean_temperature_K",
                            "final_structure"}
    assert summary["loaded"] and summary["final_structure"] == "POSCAR.final.extxyz"
    assert set(summary["final"]) == {"step", "time_ps", "potential_energy", "kinetic_energy", "total_energy",
                                     "temperature"}
    # a finished run read back keeps the last step's energy and forces in its final structure
    again = read("POSCAR.final.extxyz", format="extxyz")
    assert again.get_potential_energy() == pytest.approx(fresh.get_potential_energy())
    assert again.get_forces() == pytest.approx(fresh.get_forces())
    assert again.get_potential_energy() == pytest.approx(summary["final"]["potential_energy"])

    # our outputs read back as what their suffix says, though ASE takes any POSCAR* name for VASP
    assert main(["predict", "POSCAR.final.extxyz", "--quiet"]) == 0

    # --trajectory md.extxyz: STEM md
    assert main(["md", "POSCAR", "--steps", "2", "--loginterval", "2", "--quiet", "--trajectory", "md.extxyz"]) == 0
    assert (tmp_path / "md.json").is_file() and (tmp_path / "md.final.extxyz").is_file()


def test_a_python_caller_is_told_the_keyword(tmp_path):
    from matris.recipes import copy

    copy("finetune", tmp_path)
    with pytest.raises(MatRISInputError, match=r"pass overwrite=True to replace") as err:
        copy("finetune", tmp_path)
    assert "--overwrite" not in str(err.value)
