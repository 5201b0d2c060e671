"""Reading checkpoint files in every layout the official MatRIS loader reads.

Layouts (all loaded with ``torch.load(weights_only=True)``):

- plain (published, and what :meth:`MatRIS.save` writes): ``{"config", "state_dict"}``,
  optionally ``"targets"`` (``"efs"`` or ``"efsm"``) and any other keys (ignored);
- nested: ``{"model": {"config", "state_dict", ...}, ...}`` (training-run files);
- the legacy reference-energy key ``composition_model.fc.weight`` instead of
  ``reference_energy.fc.weight`` (both present and different: :class:`CheckpointError`);
- reference energies of any width ``K`` (``fc.weight`` of shape ``[1, K]``, elements
  ``Z = 1..K``), not only 94.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ..checkpoint_files import check_path, explain_load_error
from ..errors import CheckpointError, MatRISInputError
from ..targets import normalize_targets

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
    """``torch.load(path, weights_only=True)``, with one-line errors (see
    :mod:`matris.checkpoint_files`): ``FileNotFoundError`` for a missing file,
    :class:`MatRISInputError` for a folder, :class:`CheckpointError` for a file that is empty,
    not a torch file, truncated, or a pickled object rather than weights."""
    path = check_path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - re-raised as one clear line
        raise explain_load_error(path, exc) from exc


def shape_mismatches(expected: dict[str, torch.Tensor], state: dict[str, Any]) -> list[str]:
    """``"KEY is [a, b], the config makes it [c, d]"`` for every tensor of ``state`` whose shape
    differs from the same key of ``expected`` (a freshly built model's ``state_dict()``)."""
    out = []
    for key, want in expected.items():
        got = state.get(key)
        if isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(want.shape):
            out.append(f"{key} is {list(got.shape)}, the config makes it {list(want.shape)}")
    return out


def unpack(obj: Any, source: str) -> CheckpointContents:
    """The config, state_dict and targets of a loaded checkpoint object, in any layout above."""
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
    """:func:`load_file` then :func:`unpack`."""
    return unpack(load_file(path, map_location), str(path))


__all__ = ["CheckpointContents", "read", "load_file", "unpack", "shape_mismatches", "REFERENCE_KEY",
           "LEGACY_REFERENCE_KEY"]
