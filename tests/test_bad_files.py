"""Every command that reads structures, on every kind of bad file: one line on stderr naming
the file (and the format tried), exit status 2, no traceback; MatRISInputError in Python."""

import pytest

from matris.cli import main
from matris.errors import MatRISInputError
from matris.structure_files import read_frames

BAD_FILES = {
    "not-a-cif.cif": b"hello, this is not a CIF\nfoo bar\n",
    "empty.xyz": b"",
    "random-bytes.vasp": bytes(range(256)) * 8,
    "truncated.xyz": b'5\nLattice="5 0 0 0 5 0 0 0 5" Properties=species:S:1:pos:R:3\nSi 0 0 0\nSi 1 1 1\n',
    "POSCAR-truncated.vasp": b"Si\n1.0\n5 0 0\n0 5 0\n0 0 5\nSi\n2\nDirect\n0 0 0\n",
    "text.extxyz": b"just some words\nin a text file\n",
}

COMMANDS = {
    "predict": lambda f, out: ["predict", f],
    "relax": lambda f, out: ["relax", f],
    "md": lambda f, out: ["md", f, "--steps", "2"],
    "eos": lambda f, out: ["eos", f],
    "phonons": lambda f, out: ["phonons", f],
    "bench": lambda f, out: ["bench", "--structures", f, "--sizes", "8", "--quiet"],
    "discovery": lambda f, out: ["discovery", "relax", "--model", "demo", "--structures", f, "--out", out],
}


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad")
    for name, data in BAD_FILES.items():
        (folder / name).write_bytes(data)
    (folder / "a-folder.cif").mkdir()
    return folder


@pytest.mark.parametrize("name", [*BAD_FILES, "a-folder.cif", "missing.cif"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_gives_one_clear_line(command, name, bad_dir, tmp_path, capsys):
    path = str(bad_dir / name)
    assert main(COMMANDS[command](path, str(tmp_path / "out"))) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"matris {command}: error:") and name in lines[0]
    if name in BAD_FILES:
        assert any(word in lines[0] for word in ("empty", "binary", "not a valid")), lines[0]
    if name.endswith((".vasp", ".xyz", ".cif")) and name in BAD_FILES and BAD_FILES[name]:
        assert "format tried" in lines[0]


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_python_reader_raises_matris_input_error(name, bad_dir):
    with pytest.raises(MatRISInputError, match=name.replace(".", r"\.")):
        read_frames(bad_dir / name)


def test_good_files_still_read(tmp_path):
    from ase.build import bulk
    from ase.io import write

    write(tmp_path / "si.cif", bulk("Si", "diamond", a=5.43))
    write(tmp_path / "two.extxyz", [bulk("Si", "diamond", a=5.43), bulk("Cu", "fcc", a=3.6)])
    (tmp_path / "POSCAR").write_text("Si\n1.0\n5.43 0 0\n0 5.43 0\n0 0 5.43\nSi\n2\nDirect\n0 0 0\n0.25 0.25 0.25\n")
    assert len(read_frames(tmp_path / "si.cif")) == 1
    assert [len(a) for a in read_frames(tmp_path / "two.extxyz")] == [2, 1]
    assert len(read_frames(tmp_path / "two.extxyz", "-1")[0]) == 1
    assert len(read_frames(tmp_path / "POSCAR")[0]) == 2


def test_training_data_errors_name_the_file_and_frame(tmp_path):
    from matris.data.readers import read_samples

    frame = 'Lattice="5 0 0 0 5 0 0 0 5" Properties=species:S:1:pos:R:3 energy=-1.0 pbc="T T T"'
    (tmp_path / "data.extxyz").write_text(f"2\n{frame}\nSi 0 0 0\nSi 1 1 1\n5\n{frame}\nSi 0 0 0\n")
    with pytest.raises(MatRISInputError, match=r"frame 1 \(counting from 0\) of .*data.extxyz.*truncated"):
        read_samples(tmp_path / "data.extxyz")
