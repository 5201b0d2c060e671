"""Atomic writes: the destination is either the old file or the complete new one, never a partial file."""

import pytest

from matris.atomic import atomic_path, write_json, write_text


def test_success_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "out.json"
    write_json(path, {"a": 1})
    write_text(path, '{"a": 2}')
    assert path.read_text() == '{"a": 2}'
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]


def test_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "model.pth.tar"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(path, fsync=True) as tmp:
            tmp.write_text("half a file")
            raise RuntimeError("killed while writing")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pth.tar"]


def test_temp_file_keeps_the_suffix_for_format_detection(tmp_path):
    with atomic_path(tmp_path / "traj.extxyz") as tmp:
        assert tmp.suffix == ".extxyz" and tmp.parent == tmp_path
        tmp.write_text("x")
    assert (tmp_path / "traj.extxyz").read_text() == "x"


def test_written_files_follow_the_umask(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        path = write_text(tmp_path / "results.json", "{}")
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o644  # not mkstemp's 0600
