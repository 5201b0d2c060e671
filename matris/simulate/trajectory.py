"""Trajectory files: frames with their energies and forces, in extxyz or ASE .traj format.

Whole files are written to a temporary path in the same folder and renamed into place, so a
reader never sees half a file. MD appends one frame at a time and, when resuming, cuts the
file back to the frames its restart point covers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import numpy as np

from ..atomic import atomic_path
from ..errors import MatRISInputError

FORMATS = {".traj": "traj", ".extxyz": "extxyz", ".xyz": "extxyz"}


def trajectory_format(path: str | os.PathLike) -> str:
    """``"traj"`` or ``"extxyz"`` from the file name; anything else is an error naming both."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise MatRISInputError(
            f"cannot write a trajectory to {path}: use a file name ending in .extxyz (or .xyz) or .traj (ASE)"
        )
    return FORMATS[suffix]


def snapshot(atoms, **info):
    """A copy of ``atoms`` that keeps its calculator's results (energy, forces, stress) and ``info``."""
    from ase.calculators.singlepoint import SinglePointCalculator

    frame = atoms.copy()
    results = getattr(atoms.calc, "results", None) or {}
    keep = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in results.items()
            if k in ("energy", "free_energy", "forces", "stress", "magmoms")}
    frame.calc = SinglePointCalculator(frame, **keep) if keep else None
    frame.info.update(info)
    return frame


def write_frames(path: str | os.PathLike, frames: Iterable) -> Path:
    """Write ``frames`` to ``path`` atomically (temporary file + rename)."""
    fmt = trajectory_format(path)
    with atomic_path(path) as tmp:
        _write(tmp, list(frames), fmt, append=False)
    return Path(path)


def append_frame(path: str | os.PathLike, frame) -> None:
    """Append one frame to ``path`` (created when missing)."""
    _write(path, [frame], trajectory_format(path), append=Path(path).exists())


def read_frames(path: str | os.PathLike) -> list:
    """All frames of ``path`` ([] for a missing or empty file)."""
    from ase.io import read

    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return []
    return list(read(path, index=":", format=trajectory_format(path)))


def truncate(path: str | os.PathLike, keep) -> list:
    """Keep only the frames for which ``keep(frame)`` is true; rewrite atomically if any go."""
    frames = read_frames(path)
    kept = [f for f in frames if keep(f)]
    if len(kept) != len(frames):
        write_frames(path, kept)
    return kept


def _write(path, frames, fmt, append):
    if fmt == "traj":
        from ase.io.trajectory import Trajectory

        with Trajectory(str(path), mode="a" if append else "w") as traj:
            for frame in frames:
                traj.write(frame)
    else:
        from ase.io import write

        write(str(path), frames, format="extxyz", append=append)
