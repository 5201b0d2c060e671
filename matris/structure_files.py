"""Reading structure files, with an error a user can act on for every bad file.

The one reader behind ``matris predict``, ``relax``, ``md``, ``eos``, ``phonons``, ``bench
--structures`` and ``discovery --structures``: ASE first (any format it knows), pymatgen
for what ASE cannot read. Unreadable, empty, binary, truncated or wrong-format files raise
:class:`MatRISInputError` naming the file, the format tried and what to do, never a
traceback from deep inside a parser.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import MatRISInputError

# Formats that are binary by design: sniffing for text makes no sense for them.
BINARY_SUFFIXES = (".traj", ".db", ".nc", ".bin", ".npz", ".npy", ".gz", ".bz2", ".xz", ".zip", ".lmdb", ".aselmdb",
                   ".h5", ".hdf5", ".pckl", ".pkl")
FIX = ("give a structure file that ASE or pymatgen reads (CIF, POSCAR/CONTCAR, extxyz, ...), with an extension "
       "that names its format")


def format_name(path: Path) -> str:
    """The format ASE would read ``path`` as (from its name or its first bytes), or ``"unknown"``."""
    try:
        from ase.io.formats import filetype

        return str(filetype(str(path), guess=True))
    except Exception:  # noqa: BLE001 - only a label for the message
        return path.suffix.lstrip(".").lower() or "unknown"


def _looks_binary(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(8192)
    if b"\0" in head:
        return True
    text = head.decode("utf-8", errors="replace")
    return text.count("\ufffd") > max(3, len(text) // 100)  # more than a stray byte: not text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def read_frames(path: str | os.PathLike, index: str = ":") -> list:
    """The frames ``index`` (an ASE index string: ``":"`` all, ``"-1"`` the last) of ``path``
    as ASE Atoms, each with at least one atom. Raises ``FileNotFoundError`` for a missing
    file and :class:`MatRISInputError` for any file that is not a readable structure."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no structure file {path}; check the path ({FIX})")
    if path.is_dir():
        raise MatRISInputError(f"{path} is a folder, not a structure file; give the structure files in it")
    try:
        size = path.stat().st_size
        if size == 0:
            raise MatRISInputError(f"{path} is empty (0 bytes); {FIX}")
        binary = not path.name.lower().endswith(BINARY_SUFFIXES) and _looks_binary(path)
    except OSError as exc:
        raise MatRISInputError(f"cannot read {path} ({exc.strerror}); check its permissions") from None
    fmt = format_name(path)
    if binary:
        raise MatRISInputError(f"{path} holds binary data, not a {fmt} text file (format tried: {fmt}); {FIX}")
    from ase.io import read

    try:
        frames = read(path, index=index)
    except Exception as ase_exc:  # noqa: BLE001 - ASE raises many kinds for bad files: try pymatgen, then report
        frames = _read_with_pymatgen(path)
        if frames is None:
            raise MatRISInputError(
                f"{path} is not a valid {fmt} file (format tried: {fmt}; {_first_line(ase_exc)}); it may be "
                f"truncated or in another format: {FIX}") from None
    frames = frames if isinstance(frames, list) else [frames]
    if not frames:
        raise MatRISInputError(f"{path}: index {index!r} selects no frame (format {fmt}); check the file and the index")
    for k, atoms in enumerate(frames):
        if len(atoms) == 0:
            raise MatRISInputError(f"{path}: frame {k} has no atoms (format {fmt}); the file may be truncated: {FIX}")
    return frames


def _read_with_pymatgen(path: Path):
    try:
        from pymatgen.core import Structure
        from pymatgen.io.ase import AseAtomsAdaptor

        return [AseAtomsAdaptor.get_atoms(Structure.from_file(path))]
    except Exception:  # noqa: BLE001 - the ASE error is the one reported
        return None


__all__ = ["read_frames", "format_name"]
