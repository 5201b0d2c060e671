"""What a checkpoint file must be, checked before torch reads it, with an error a user can act on.

A missing path, a folder, an empty file, random bytes, an HTML page saved in place of a
download, a truncated archive or a pickled Python object each get one line that names the
problem and the fix, instead of a torch or pickle message. :func:`check_path` imports
nothing heavy, so the command line checks ``--model PATH`` before it imports torch;
:func:`explain_load_error` turns what ``torch.load`` raised into such a line. :func:`read` then
reads the checkpoint in any layout the official loader reads (torch imported on the call).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError, MatRISInputError
from .targets import normalize_targets

if TYPE_CHECKING:
    import torch

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since PyTorch 1.6
# the legacy torch.save format: pickle protocol 2, then torch's magic number 0x1950a86a20f9469cfc6c
LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8"
SUFFIXES = (".pth.tar", ".pth", ".pt", ".tar", ".ckpt")
WHAT = "a MatRIS checkpoint (*.pth.tar: a published model, or one written by MatRIS.save or 'matris train')"


def check_path(path: str | os.PathLike, names_hint: str = "") -> Path:
    """``path`` if it is a file that starts like a ``torch.save`` file, else the error:
    ``FileNotFoundError`` (missing), :class:`MatRISInputError` (a folder), or
    :class:`CheckpointError` (empty, not a torch file). ``names_hint``: appended to the
    message for a missing path (e.g. the valid model names)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; give the path of {WHAT}, an https:// URL{names_hint}")
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.is_file() and p.name.lower().endswith(SUFFIXES))
        found = (f"it holds {', '.join(inside[:4])}{' ...' if len(inside) > 4 else ''}" if inside
                 else "it holds no *.pth.tar/*.pth/*.pt file")
        raise MatRISInputError(f"{path} is a folder, not a checkpoint file ({found}); give the path of the model "
                               f"file itself, e.g. {path / (inside[0] if inside else 'best_model.pth.tar')}")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise MatRISInputError(f"cannot read {path} ({exc.strerror}); check its permissions") from None
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes), not a checkpoint: an interrupted download or copy? Copy "
                              "or download it again ('matris download NAME' fetches a published model)")
    if not head.startswith((ZIP_MAGIC, LEGACY_MAGIC)):
        raise CheckpointError(f"{path} is not a PyTorch checkpoint ({_describe(head)}); give the path of {WHAT}")
    return path


def _describe(head: bytes) -> str:
    """What the first bytes of a non-torch file look like, for the message."""
    text = head.lstrip()
    if text[:1] == b"<":
        return "it is an HTML or XML page: a web page saved in place of the file? Download the file itself"
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        return f"it starts with the bytes {head[:8].hex(' ')}, while a torch.save file starts with PK (a zip archive)"
    first = decoded.splitlines()[0] if decoded.strip() else ""
    return f"it is a text file starting {first[:40]!r}, while a torch.save file is a zip archive"


def explain_load_error(path: str | os.PathLike, exc: BaseException) -> CheckpointError:
    """One-line :class:`CheckpointError` for what ``torch.load(path, weights_only=True)`` raised."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # torch colours part of its message
    if isinstance(exc, EOFError) or "central directory" in text or "PytorchStreamReader" in text:
        return CheckpointError(f"{path} is a truncated or damaged checkpoint (its archive is incomplete: an "
                               "interrupted download or copy?); copy or download it again")
    unsafe = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if unsafe:
        return CheckpointError(
            f"{path} holds a pickled Python object ({unsafe.group(1)}), not only weights, so it does not load with "
            "weights_only=True; save the model as a checkpoint instead: model.save(PATH), i.e. "
            "torch.save({'config': ..., 'state_dict': ...})")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    first = re.split(r"(?<=[.;])\s", first)[0][:200]
    return CheckpointError(f"cannot read {path} as a PyTorch checkpoint ({type(exc).__name__}: {first}); give the "
                           f"path of {WHAT}")


__all__ = ["check_path", "explain_load_error", "SUFFIXES"]


# ------------------------------------------------------------------------------ layouts
REFERENCE_KEY = "reference_energy.fc.weight"
LEGACY_REFERENCE_KEY = "composition_model.fc.weight"


@dataclass
class CheckpointContents:
    """What a checkpoint holds: ``config`` (dict), ``state_dict`` (reference energies under
    ``reference_energy.fc.weight``) and ``targets`` (``None`` when the file does not say)."""

    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    targets: str | None = None


def load_file(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``, with one-line errors (:func:`check_path`,
    :func:`explain_load_error`): ``FileNotFoundError`` for a missing file,
    :class:`MatRISInputError` for a folder, :class:`CheckpointError` for a file that is empty,
    not a torch file, truncated, or a pickled object rather than weights."""
    import torch

    path = check_path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - re-raised as one clear line
        raise explain_load_error(path, exc) from exc


def shape_mismatches(expected: dict[str, torch.Tensor], state: dict[str, Any]) -> list[str]:
    """``"KEY is [a, b], the config makes it [c, d]"`` for every tensor of ``state`` whose shape
    differs from the same key of ``expected`` (a freshly built model's ``state_dict()``)."""
    import torch

    out = []
    for key, want in expected.items():
        got = state.get(key)
        if isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(want.shape):
            out.append(f"{key} is {list(got.shape)}, the config makes it {list(want.shape)}")
    return out


def unpack(obj: Any, source: str) -> CheckpointContents:
    """The config, state_dict and targets of a loaded checkpoint object, in any layout of
    :func:`read`."""
    import torch

    outer = obj
    if isinstance(obj, dict) and "state_dict" not in obj and isinstance(obj.get("model"), dict):
        obj = obj["model"]  # nested layout
    if isinstance(outer, dict) and "pytorch-lightning_version" in outer:
        raise CheckpointError(
            f"{source} is a Lightning training checkpoint (optimizer state and all), not a model file: "
            "load the run's exported model instead, best_model.pth.tar or last_model.pth.tar in its "
            "trainer.out_dir; to continue training, rerun the same `matris train` command (it resumes)")
    if not isinstance(obj, dict) or "config" not in obj or "state_dict" not in obj:
        keys = sorted(map(str, outer))[:10] if isinstance(outer, dict) else type(outer).__name__
        raise CheckpointError(f"{source} is not a MatRIS checkpoint: expected keys 'config' and 'state_dict' (or "
                              f"'model' holding them), got {keys}")
    config, state = obj["config"], obj["state_dict"]
    if isinstance(config, Mapping) and not isinstance(config, dict):
        config = dict(config)  # a MatRISConfig, saved in memory rather than through a file
    if not isinstance(config, dict) or not isinstance(state, dict):
        raise CheckpointError(f"{source}: 'config' and 'state_dict' must be dicts, got {type(config).__name__} and "
                              f"{type(state).__name__}")
    state = dict(state)
    if LEGACY_REFERENCE_KEY in state:
        legacy = state.pop(LEGACY_REFERENCE_KEY)
        current = state.setdefault(REFERENCE_KEY, legacy)
        if current.shape != legacy.shape or not torch.equal(current, legacy):
            raise CheckpointError(
                f"{source} holds two different reference energies: {REFERENCE_KEY} {tuple(current.shape)} and the "
                f"legacy {LEGACY_REFERENCE_KEY} {tuple(legacy.shape)}. Keep one of them (delete the other key from "
                "the state_dict) and save the file again.")
    weight = state.get(REFERENCE_KEY)
    if weight is not None and (weight.dim() != 2 or weight.shape[0] != 1 or weight.shape[1] < 1):
        raise CheckpointError(f"{source}: {REFERENCE_KEY} must have shape [1, K], got {tuple(weight.shape)}")
    targets = obj.get("targets", outer.get("targets") if isinstance(outer, dict) else None)
    if targets is not None:
        try:
            targets = normalize_targets(targets, source)
        except MatRISInputError as exc:
            raise CheckpointError(str(exc)) from None
    return CheckpointContents(dict(config), state, targets)


def read(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> CheckpointContents:
    """:func:`load_file` then :func:`unpack`: a checkpoint in every layout the official MatRIS
    loader reads (all with ``torch.load(weights_only=True)``): plain (published, and what
    :meth:`MatRIS.save` writes) ``{"config", "state_dict"}``, optionally ``"targets"`` (``"efs"``
    or ``"efsm"``) and other keys (ignored); nested ``{"model": {"config", "state_dict", ...}}``
    (training-run files); the legacy reference-energy key ``composition_model.fc.weight`` (both
    keys present and different: :class:`CheckpointError`); reference energies of any width ``K``
    (``fc.weight`` ``[1, K]``, elements ``Z = 1..K``)."""
    return unpack(load_file(path, map_location), str(path))
