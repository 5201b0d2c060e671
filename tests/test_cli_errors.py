"""The bad inputs of issue 33, each from the command line (one line on stderr naming the problem
and the fix, exit status 2, no traceback, no parser warning) and from Python (the same
MatRISInputError or CheckpointError): a binary file as a structure, a truncated POSCAR, an
unknown element in a CIF, a random-bytes / empty / truncated / pickled-object model file, a
state_dict of the wrong shapes, a model path that is a folder, overlapping atoms in
``matris phonons``, and a pressure that would be ignored."""

import random

import pytest
import torch
from ase.build import bulk

from matris import MatRIS
from matris.bundled import DEMO_CHECKPOINT
from matris.cli import main
from matris.errors import CheckpointError, MatRISInputError
from matris.structure_files import read_frames

CIF_XX = """data_test
_cell_length_a 4.0
_cell_length_b 4.0
_cell_length_c 4.0
_cell_angle_alpha 90
_cell_angle_beta 90
_cell_angle_gamma 90
_symmetry_space_group_name_H-M 'P 1'
loop_
_atom_site_label
_atom_site_type_symbol
_atom_site_fract_x
_atom_site_fract_y
_atom_site_fract_z
Xx1 Xx 0 0 0
Si1 Si 0.5 0.5 0.5
"""
POSCAR_HEAD = "Si\n1.0\n5.43 0 0\n0 5.43 0\n0 0 5.43\nSi\n8\nDirect\n"


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """A folder of bad inputs, by name."""
    d = tmp_path_factory.mktemp("bad")
    (d / "bad.bin").write_bytes(random.Random(1).randbytes(2000))
    (d / "POSCAR").write_text(POSCAR_HEAD + "0 0 0\n0.25 0.25 0.25\n0.5 0.5\n")
    (d / "CONTCAR").write_text(POSCAR_HEAD + "0 0 0\n0.25 0.25 0.25\n")
    (d / "xx.cif").write_text(CIF_XX)
    (d / "random.pth").write_bytes(random.Random(0).randbytes(5000))  # seeded: its first bytes are in the message
    (d / "empty.pth").write_bytes(b"")
    (d / "adir").mkdir()
    (d / "run").mkdir()
    (d / "run" / "best_model.pth.tar").write_bytes(DEMO_CHECKPOINT.read_bytes())
    data = DEMO_CHECKPOINT.read_bytes()
    (d / "truncated.pth").write_bytes(data[: len(data) // 2])
    state = torch.load(DEMO_CHECKPOINT, weights_only=True)
    state["state_dict"]["atom_embedding.embedding.weight"] = torch.zeros(3, 3)
    torch.save(state, d / "wrongshape.pth")
    torch.save(MatRIS.load("demo"), d / "pickled.pth")
    atoms = bulk("Si", "diamond", a=5.43)
    atoms.positions[1] = atoms.positions[0]
    atoms.write(d / "overlap.extxyz")
    return d


def one_line(capsys, command: str) -> str:
    """The one stderr line of a failed command (after the demo notice, if any)."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("matris: note:")]
    assert len(lines) == 1 and "Traceback" not in err and "Warning" not in err, err
    assert lines[0].startswith(f"matris {command}: error: "), lines[0]
    return lines[0]


# ------------------------------------------------------------------------------ structure files
@pytest.mark.parametrize("name, words", [
    ("bad.bin", ["bad.bin holds binary data", "('.bin') names no structure format", "give a structure file"]),
    ("POSCAR", ["not a valid VASP POSCAR file", "truncated: line 11, the position of atom 3 of 8, has 2 numbers",
                "complete or correct the file"]),
    ("CONTCAR", ["declares 8 atoms but the positions end after 2"]),
    ("xx.cif", ["'Xx' is not a chemical element symbol (line 15: 'Xx1 Xx 0 0 0')",
                "give every site an element symbol from H to Pu"]),
])
def test_bad_structure_files(name, words, bad, capsys):
    assert main(["predict", str(bad / name)]) == 2
    line = one_line(capsys, "predict")
    assert all(w in line for w in words), line
    with pytest.raises(MatRISInputError) as info:
        read_frames(bad / name)
    assert all(w in str(info.value) for w in words)


def test_binary_file_with_a_text_format_name(bad, tmp_path, capsys):
    (tmp_path / "x.cif").write_bytes(random.Random(2).randbytes(3000))
    assert main(["predict", str(tmp_path / "x.cif")]) == 2
    assert "holds binary data, not a cif text file" in one_line(capsys, "predict")


# ---------------------------------------------------------------------------------- model files
@pytest.mark.parametrize("name, error, words", [
    ("random.pth", CheckpointError, ["random.pth is not a PyTorch checkpoint", "a torch.save file starts with PK",
                                     "give the path of a MatRIS checkpoint"]),
    ("empty.pth", CheckpointError, ["empty.pth is empty (0 bytes), not a checkpoint", "download it again"]),
    ("truncated.pth", CheckpointError, ["truncated.pth is a truncated or damaged checkpoint", "copy or download"]),
    ("pickled.pth", CheckpointError, ["holds a pickled Python object (matris.model.model.MatRIS)", "model.save"]),
    ("wrongshape.pth", CheckpointError, [
        "wrongshape.pth: state_dict does not match its config (the weights do not fit the architecture it "
        "describes): atom_embedding.embedding.weight is [3, 3], the config makes it [94, 48]", "same model"]),
    ("adir", MatRISInputError, ["adir is a folder, not a checkpoint file (it holds no *.pth.tar",
                                "give the path of the model file itself"]),
    ("run", MatRISInputError, ["run is a folder, not a checkpoint file (it holds best_model.pth.tar)",
                               "best_model.pth.tar"]),
])
def test_bad_model_files(name, error, words, bad, capsys):
    assert main(["predict", "--model", str(bad / name)]) == 2
    line = one_line(capsys, "predict")
    assert all(w in line for w in words), line
    for load in (MatRIS.load, MatRIS.from_checkpoint):
        with pytest.raises(error) as info:
            load(bad / name)
        assert all(w in str(info.value) for w in words)
        assert "\n" not in str(info.value)


def test_an_html_page_saved_as_the_model(tmp_path):
    (tmp_path / "m.pth.tar").write_text("<!DOCTYPE html><html><body>Just a moment...</body></html>")
    with pytest.raises(CheckpointError, match="an HTML or XML page: a web page saved in place of the file"):
        MatRIS.load(tmp_path / "m.pth.tar")


# ------------------------------------------------------------------------------------ simulations
def test_phonons_on_overlapping_atoms(bad, tmp_path, capsys):
    pytest.importorskip("phonopy")
    from matris.simulate import phonons

    assert main(["phonons", str(bad / "overlap.extxyz"), "--out-dir", str(tmp_path)]) == 2
    line = one_line(capsys, "phonons")
    assert "atoms 0 and 1 are 0.0000 Å apart, closer than 0.1 Å" in line and "remove one of them" in line
    with pytest.raises(MatRISInputError, match="closer than 0.1 Å"):
        phonons(bulk("Si", "diamond", a=5.43) * (1, 1, 1) + bulk("Si", "diamond", a=5.43)[:1], model="demo")


def test_a_pressure_that_would_be_ignored_is_an_error(bad, tmp_path, capsys):
    from matris.simulate import md, relax

    si = bulk("Si", "diamond", a=5.43)
    with pytest.raises(MatRISInputError, match="relax_cell=False .* the pressure would have no effect"):
        relax(si, relax_cell=False, pressure=1.0, model="demo")
    with pytest.raises(MatRISInputError, match="StrainFilter takes no pressure"):
        relax(si, cell_filter="StrainFilter", pressure=1.0, model="demo")
    with pytest.raises(MatRISInputError, match="no effect in the NVT ensemble"):
        md(si, ensemble="nvt", pressure=1.0, steps=1, model="demo")
    assert relax(si, relax_cell=False, pressure=0.0, steps=1, model="demo").atoms is not None
    si.write(tmp_path / "si.extxyz")
    assert main(["relax", str(tmp_path / "si.extxyz"), "--fixed-cell", "--pressure", "1",
                 "--out-dir", str(tmp_path / "r")]) == 2
    assert "would have no effect" in one_line(capsys, "relax")
    assert main(["md", str(tmp_path / "si.extxyz"), "--pressure", "1", "--steps", "1"]) == 2
    assert "--ensemble npt" in one_line(capsys, "md")


def test_bad_structures_fail_before_the_model_is_announced(bad, capsys, monkeypatch):
    """A structure error comes before the demo model's notice: the user sees one line."""
    from matris import bundled

    monkeypatch.setattr(bundled, "_notice", {"shown": False, "stderr": False})
    assert main(["phonons", str(bad / "overlap.extxyz")]) == 2
    assert "note" not in capsys.readouterr().err
