"""Reading and writing a model's checkpoint: the published format (config + state_dict), by name,
URL or path (:mod:`matris.pretrained` resolves and verifies), in every layout the official loader
reads (:mod:`matris.checkpoint_files`). The methods of :class:`matris.MatRIS` that load and save.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import torch

from . import checkpoint_files as ckpt_io
from .errors import CheckpointError
from .targets import DEFAULT_TARGETS, normalize_targets


class CheckpointIO:
    """The loading and saving methods of :class:`matris.MatRIS` (a mixin: ``cls`` is the model class)."""

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, map_location: str | torch.device = "cpu",
                        targets: str | None = None, default_targets: str | None = None) -> Self:
        """Load a checkpoint file in any layout the official loader reads (see
        :func:`matris.checkpoint_files.read`): plain ``{"config", "state_dict"}``, nested
        ``{"model": {...}}``, the legacy reference key, any reference width.

        Loaded with ``weights_only=True``: no arbitrary objects are unpickled. Extra
        top-level keys (optimizer state, epoch) are ignored. ``targets`` (``"efs"`` or
        ``"efsm"``) overrides what the file says; a file that says nothing gets
        ``default_targets``, else those of the published model it is (matched by content or
        official file name, see :func:`matris.pretrained.entry_for_file`), else ``"efsm"``.
        """
        contents = ckpt_io.read(path, map_location)
        model = cls.from_state(contents.config, contents.state_dict, source=str(path))
        model.name = str(path)
        chosen = targets or contents.targets or default_targets
        if chosen is None:
            from .pretrained import entry_for_file

            entry = entry_for_file(path)
            chosen = entry.targets if entry is not None else DEFAULT_TARGETS
        model.targets = normalize_targets(chosen, str(path))
        return model

    @classmethod
    def load(cls, model: str | os.PathLike | None = None, device: str | torch.device | None = "auto",
             dtype: str | torch.dtype = torch.float32, *, targets: str | None = None,
             progress: bool | None = None, download: Any = None, model_name: str | os.PathLike | None = None
             ) -> Self:
        """A model by name, URL or checkpoint path; ``None`` is the bundled demo model.

        Names are those of :mod:`matris.pretrained` (``matris models`` lists them, official
        keys such as ``matris_10m_oam`` included; ``-``/``_`` and case are ignored), e.g.
        ``"matris-10m-oam"``: downloaded once into the cache (``$MATRIS_CACHE``, default
        ``~/.cache/matris``) and verified on every load. An ``https://`` URL is downloaded,
        cached and verified the same way. ``targets``: override what the model is taken to
        predict (``"efs"``: no magnetic moments); by default the checkpoint's own, then the
        registry's. ``progress``: show a download bar (``None``: when stderr is a terminal);
        ``download``: its timeout, retries and backoff (:class:`matris.pretrained.DownloadSettings`).
        ``device``: "auto" (the default: CUDA when present, else the CPU), "cpu", "cuda" or
        "cuda:N"; ``dtype``: float32 (the default) or float64 (or their names). Without ``model``
        the bundled demo model is loaded, and the first such load in a process says so (a
        ``UserWarning``; one stderr line in the CLI).
        """
        from .bundled import announce_default_model
        from .devices import resolve_device, resolve_dtype
        from .pretrained import REGISTRY, resolve

        if model_name is not None:  # the official keyword: MatRIS.load(model_name=..., device=None)
            if model is not None:
                raise TypeError("MatRIS.load got both model and model_name; pass one of them")
            model = model_name
        device, dtype = resolve_device("auto" if device is None else device), resolve_dtype(dtype)
        if model is None:
            announce_default_model()

        path = resolve(model, progress=progress, check=cls.check_checkpoint, settings=download)
        entry = REGISTRY.find(str(model)) if isinstance(model, str) else None
        net = cls.from_checkpoint(path, map_location="cpu", targets=targets,
                                  default_targets=entry.targets if entry is not None else None)
        if entry is not None:
            net.name = entry.name
        return net.to(device=device, dtype=dtype)

    @classmethod
    def from_state(cls, config: dict[str, Any], state_dict: dict[str, torch.Tensor], source: str = "state") -> Self:
        """Build a model from a checkpoint's ``config`` dict and ``state_dict`` (strict match).

        Reference energies are built at the width of ``reference_energy.fc.weight`` when the
        state_dict has them, whatever the config names (as the official loader does).
        """
        try:
            model = cls(dict(config))
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: invalid config: {exc}") from None
        weight = state_dict.get(ckpt_io.REFERENCE_KEY)
        if weight is not None:
            model.set_reference_width(int(weight.shape[-1]))
        wrong = ckpt_io.shape_mismatches(model.state_dict(), state_dict)
        if wrong:  # named here in one line: torch's message lists every tensor over many lines
            more = f" (and {len(wrong) - 1} more tensors)" if len(wrong) > 1 else ""
            raise CheckpointError(
                f"{source}: state_dict does not match its config (the weights do not fit the architecture it "
                f"describes): {wrong[0]}{more}; the config and the state_dict must come from the same model (save it "
                "with model.save(PATH))")
        try:
            missing, unexpected = model.load_state_dict(state_dict, strict=False)
        except RuntimeError as exc:  # anything else torch refuses
            first = str(exc).strip().splitlines()[-1].strip()[:300]
            raise CheckpointError(f"{source}: state_dict does not match its config: {first}") from exc
        if missing or unexpected:
            raise CheckpointError(
                f"{source}: state_dict does not match its config: "
                f"missing {missing[:5]}{'…' if len(missing) > 5 else ''},"
                f" unexpected {unexpected[:5]}{'…' if len(unexpected) > 5 else ''}"
            )
        return model.eval()

    @classmethod
    def from_dict(cls, dct: Mapping[str, Any]) -> Self:
        """A model from a loaded checkpoint dict (the official ``MatRIS.from_dict``): ``{"config",
        "state_dict"}``, nested under ``"model"`` or not, the legacy reference key included."""
        contents = ckpt_io.unpack(dict(dct), "checkpoint dict")
        model = cls.from_state(contents.config, contents.state_dict)
        if contents.targets:
            model.targets = normalize_targets(contents.targets, "checkpoint dict")
        return model

    @classmethod
    def check_checkpoint(cls, contents: ckpt_io.CheckpointContents, source: str) -> None:
        """Raise :class:`CheckpointError` unless ``contents`` (a read checkpoint) builds its own
        config's architecture with a strict state-dict match: the check of a downloaded file
        without a published hash (``check`` of :func:`matris.pretrained.resolve`)."""
        cls.from_state(contents.config, contents.state_dict, source=source)

    def checkpoint_state(self, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
        """The published checkpoint dict: config, a ``dtype`` (float32) CPU state_dict, and
        ``targets`` (an extra key, which the official loader ignores)."""
        state = {k: v.detach().to("cpu", dtype=dtype if v.is_floating_point() else None).clone()
                 for k, v in self.state_dict().items()}
        return {"config": self.config.to_dict(), "state_dict": state, "targets": self.targets}

    def save(self, path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
        """Write the published format to ``path`` atomically (temp file + rename)."""
        from .atomic import atomic_path

        with atomic_path(path, suffix=".tmp") as tmp:
            torch.save(self.checkpoint_state(dtype), tmp)
        return Path(path)
