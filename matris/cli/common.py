"""Helpers shared by the simulation subcommands: model options, input files, atomic writes."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from ..atomic import write_json as atomic_write_json


def add_model_arguments(p: argparse.ArgumentParser, dtype: str = "float32") -> None:
    p.add_argument("--model", default=None, help="model name (see 'matris models', e.g. matris-10m-oam), checkpoint path or https URL; default: the bundled model (matris-demo)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--dtype", default=dtype, choices=["float32", "float64"], help=f"precision (default: {dtype})")


def load_model(args: argparse.Namespace):
    """The :class:`MatRIS` the options name, loaded once for every structure."""
    from ..calculator import resolve_device, resolve_dtype
    from ..model import MatRIS

    return MatRIS.load(args.model, device=resolve_device(args.device), dtype=resolve_dtype(args.dtype))


def read_one(path: str, index: str = "-1"):
    """One structure (frame ``index``, default the last) of any ASE-readable file."""
    from ..errors import MatRISInputError
    from .predict import read_structures

    frames = read_structures([path], index)
    if len(frames) != 1:
        raise MatRISInputError(f"{path}: --index {index!r} selects {len(frames)} frames; select one, e.g. --index -1")
    frames[0].info["name"] = Path(path).name.split(".")[0] or Path(path).name
    return frames[0]


def safe_name(name: str) -> str:
    """A file-name-safe version of a structure name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "structure"


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (temporary file + rename)."""
    return atomic_write_json(path, data)


def write_structure(path: str | os.PathLike, atoms) -> Path:
    """Write one structure (extxyz, with its energy/forces/stress) atomically."""
    from ..simulate.trajectory import write_frames

    return write_frames(path, [atoms])
