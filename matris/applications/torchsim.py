"""The official TorchSim model (``matris.applications.torchsim.MatRISTorchSimModel``), over
:class:`matris.simulate.batched.MatRISModel`."""

from __future__ import annotations

import os

import torch

from ..model import MatRIS
from ..official import TASKS, check_mode, run_options
from ..simulate.batched import MatRISModel


class MatRISTorchSimModel(MatRISModel):
    """MatRIS for TorchSim, by ``target`` (``"e"``, ``"em"``, ``"ef"``, ``"efs"``, ``"efsm"``).

    ``forward(state)`` returns ``energy`` ``[S]`` (eV, total), and by target ``forces`` ``[N, 3]``
    eV/Å, ``stress`` ``[S, 3, 3]`` eV/Å³ (zero for a structure without a 3-D cell), ``magmoms``
    ``[N]`` μB, all detached. Non-periodic directions need no cell vector; the state is never
    modified. ``mode``, ``activation_checkpoint``, ``tf32``: as for
    :class:`matris.applications.base.MatRISCalculator`. ``dtype``: float32 (the official one's
    only) or float64.
    """

    def __init__(self, model: str | os.PathLike | MatRIS = "matris_10m_oam", *,
                 device: str | torch.device | None = None, dtype: torch.dtype = torch.float32, mode: str = "fast",
                 target: str = "efs", activation_checkpoint: bool = True, tf32: bool = False) -> None:
        check_mode(mode)
        if target not in TASKS:
            raise ValueError("target must be 'e', 'em', 'ef', 'efs', or 'efsm'")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"MatRISTorchSimModel runs in torch.float32 or torch.float64, got {dtype}")
        if isinstance(model, MatRIS) and device is None:
            device = model.device
        super().__init__(model, device="auto" if device is None else device, dtype=dtype,
                         compute_stress="s" in target, compute_forces="f" in target)
        self.target = target
        self.mode = mode
        self.activation_checkpoint = activation_checkpoint
        self.tf32 = tf32
        self._compute_magmoms = "m" in target
        self.run_options = run_options(self.model.options, mode, activation_checkpoint, tf32)
        self.cutoff = self.model.config["pairwise_cutoff"]


__all__ = ["MatRISTorchSimModel"]
