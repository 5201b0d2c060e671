"""Helpers shared by the subcommands: model options, the checks run before heavy imports,
input files, atomic writes.

Every ``run`` starts with :func:`check_inputs`: it checks the files and the model argument
without importing torch or ASE, so a typo in a path fails at once, not after seconds of
imports.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any, Iterable

from ..atomic import write_json as atomic_write_json

DEVICE_HELP = "auto (default: a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N"
DTYPE_HELP = "precision: float32 (default) or float64"
MODEL_HELP = ("model name (see 'matris models', e.g. matris-10m-oam), checkpoint path or https URL; default: the "
              "bundled demo model (matris-demo)")


def add_model_arguments(p: argparse.ArgumentParser, dtype_note: str = "") -> None:
    """--model, --device and --dtype, with matris's defaults (:mod:`matris.devices`): device
    auto, float32. ``dtype_note``: appended to the --dtype help."""
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"], help=DTYPE_HELP + dtype_note)
    p.add_argument("--memory-limit", default="auto", metavar="SIZE", help=MEMORY_LIMIT_HELP)


MEMORY_LIMIT_HELP = ("the memory one model call may use beyond the loaded model, e.g. '8 GB' (default auto: a share "
                     "of what the device has free); the model then keeps less and recomputes more, and a structure "
                     "that needs more even so is refused before the call starts")

MAJORITY_HELP = ("accept partially occupied sites (e.g. a CIF site of Fe 0.5 + Ni 0.5) as ASE reads them: each "
                 "holds its majority species (default: such a file is an error, since the model needs one element "
                 "per site)")


def add_majority_argument(p: argparse.ArgumentParser) -> None:
    """--majority-species: the explicit opt-in to ASE's reading of partial occupancies."""
    p.add_argument("--majority-species", action="store_true", help=MAJORITY_HELP)


def check_inputs(files: Iterable[str] = (), model: Any = None) -> None:
    """Fail at once, before torch or ASE is imported, on a missing, empty or folder input file
    or a ``--model`` that is neither a known name, an https URL nor a checkpoint file; fetch a
    model that must be downloaded (so that no network fails in a moment, not after the imports)."""
    from ..structure_files import check_file

    for f in files:
        check_file(f)
    from ..pretrained import locate, resolve

    if locate(model)[0] != "path":
        resolve(model, check=check_checkpoint)  # download it now: no network fails here, in a moment


def check_checkpoint(contents, source: str) -> None:
    """The model's check of a downloaded checkpoint without a published hash (torch on use only)."""
    from ..model import MatRIS

    MatRIS.check_checkpoint(contents, source)


def load_model(args: argparse.Namespace):
    """The :class:`MatRIS` the options name, loaded once for every structure."""
    from ..calculator import resolve_device, resolve_dtype
    from ..model import MatRIS
    from ..settings import parse_size

    limit = parse_size(getattr(args, "memory_limit", None), "--memory-limit")  # a bad size fails before the load
    model = MatRIS.load(args.model, device=resolve_device(args.device), dtype=resolve_dtype(args.dtype))
    model.options.memory_limit = limit
    return model


def check_structures(frames: list) -> None:
    """The checks the model makes (elements, cell, overlapping atoms), before it is loaded."""
    from ..simulate.inputs import check_structure

    for k, atoms in enumerate(frames):
        check_structure(atoms, k)


def read_input_structures(files: list[str], index: str = ":", majority_species: bool = False):
    """All frames of ``files`` as ASE Atoms (the bundled example when ``files`` is empty);
    ``majority_species``: accept partial occupancies (see :func:`~matris.structure_files.read_frames`)."""
    from ..bundled import EXAMPLE_STRUCTURE
    from ..structure_files import read_frames

    paths = [Path(f) for f in files] or [EXAMPLE_STRUCTURE]
    stems = [structure_stem(p) for p in paths]
    atoms = []
    for path, stem in zip(paths, stems):
        frames = read_frames(path, index, majority_species)  # a bad file: one clear error, exit status 2
        base = stem if stems.count(stem) == 1 else path.name  # cu.cif and cu.extxyz: their full names
        for k, frame in enumerate(frames):
            frame.info.setdefault("name", base + (f"[{k}]" if len(frames) > 1 else ""))
        atoms.extend(frames)
    return atoms


def structure_stem(path: str | os.PathLike) -> str:
    """A structure file's name without its format and compression suffixes: ``cu.extxyz`` → ``cu``,
    ``mp-149.cif.gz`` → ``mp-149``, ``POSCAR`` → ``POSCAR``. Every command labels a structure
    from a file by it (``cu[0]`` for frame 0 of several) and ``relax`` names its files by it."""
    from ..structure_files import uncompressed_name

    name = uncompressed_name(path)
    stem = Path(name).stem
    return stem if stem and not stem.startswith(".") else name


def read_one(path: str, index: str = "-1", majority_species: bool = False):
    """One structure (frame ``index``, default the last) of any ASE-readable file;
    ``majority_species``: accept partial occupancies (see :func:`~matris.structure_files.read_frames`)."""
    from ..errors import MatRISInputError

    frames = read_input_structures([path], index, majority_species)
    if len(frames) != 1:
        raise MatRISInputError(f"{path}: --index {index!r} selects {len(frames)} frames; select one, e.g. --index -1")
    frames[0].info["name"] = structure_stem(path)
    check_structures(frames)
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
