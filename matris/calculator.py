"""ASE calculator for MatRIS."""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

import numpy as np
import torch
from ase import units
from ase.calculators.calculator import Calculator, all_changes

from .devices import device_and_dtype, resolve_device, resolve_dtype  # noqa: F401 - re-exported
from .graph import GraphBatch
from .model import MatRIS
from .settings import parse_size
from .structures import to_system, warn_implausible


class MatRISCalculator(Calculator):
    """MatRIS as an ASE calculator.

    Properties: ``energy`` and ``free_energy`` (eV), ``energies`` (per-atom energies, eV; they
    sum to the energy), ``forces`` (eV/Å), ``stress`` (ASE
    units eV/Å³, Voigt order xx yy zz yz xz xy; only for cells with a volume), ``magmoms``
    (μB; only for models trained on them: with ``model.targets == "efs"`` ASE raises
    ``PropertyNotImplementedError``). The caller's Atoms are never modified.

    Args:
        model: a :class:`MatRIS`, a model name (see ``matris models``), a checkpoint path or
            URL, or None for the bundled demo model.
        device: "auto" (CUDA when present, else the CPU), "cpu", "cuda" or "cuda:1". Not
            given: a :class:`MatRIS` keeps its own device and dtype (it is used as is, never
            converted in place); a name or path runs on device "auto" in float32 (the rule of
            :mod:`matris.devices`).
        dtype: "float32" or "float64"; not given, as for ``device``.
        compute_stress: set False to skip the stress (a little faster in MD at fixed cell).
        compile: compile the model's energy function (:meth:`MatRIS.compile`, dynamic shapes;
            the first call takes tens of seconds; opt-in: measure it on your machine, see
            ``benchmarks/cpu_speed.py``). A :class:`MatRIS` passed in is copied first.
        tf32: TF32 matmuls on CUDA for this calculator's calls (faster, less exact; see
            :attr:`RunOptions.tf32`). A :class:`MatRIS` passed in is copied first.
        memory_limit: the memory one call may use beyond the loaded model, e.g. ``"8 GB"`` (or
            bytes); the model then keeps less and recomputes more (same numbers), and a structure
            that needs more even at the lowest level raises :class:`matris.MemoryLimitError` before
            the call starts. None (the default): a share of what the device has free.
        **kwargs: passed on to ASE's ``Calculator``.
    """

    implemented_properties = ["energy", "free_energy", "energies", "forces", "stress", "magmoms"]

    def __init__(
        self,
        model: MatRIS | str | os.PathLike | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        compute_stress: bool = True,
        compile: bool = False,
        tf32: bool = False,
        memory_limit: str | int | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        device, dtype = device_and_dtype(model, device, dtype)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        if isinstance(model, MatRIS):
            changes = (compile and not model.compiled) or tf32 != model.options.tf32
            if model.dtype != self.dtype or model.device != self.device or changes:
                model = copy.deepcopy(model)  # Module.to() works in place: leave the caller's model alone
            self.model = model.to(device=self.device, dtype=self.dtype).eval()
        else:
            self.model = MatRIS.load(model, device=self.device, dtype=self.dtype).eval()
        if compile and not self.model.compiled:
            self.model.compile()
        self.model.options.tf32 = tf32
        # this calculator's calls only (a model passed in may serve others): checked here, not at the first call
        self.memory_limit = parse_size(memory_limit, "memory_limit")
        self.compute_stress = compute_stress
        self._checked = None  # the (numbers, pbc) last checked for plausibility
        # a model trained without magnetic moments (targets "efs") does not offer them
        self.implemented_properties = [p for p in type(self).implemented_properties
                                       if p != "magmoms" or self.model.predicts_magmoms]

    def check_plausibility(self, atoms, system=None) -> list[str]:
        """Warn (:class:`~matris.errors.MatRISInputWarning`) if ``atoms`` look like an input
        mistake (:func:`matris.structures.implausibilities`), once per structure: only a new
        composition or periodicity is checked again, not every MD or relaxation step (the check
        is one neighbour search within ≤ 1.7 Å, far below the cost of a model call)."""
        system = system if system is not None else to_system(atoms)
        key = (system.atomic_numbers.tobytes(), system.pbc.tobytes())
        if key == getattr(self, "_checked", None):  # (a calculator unpickled from an older version has none)
            return []
        self._checked = key
        return warn_implausible(atoms, self.model.cutoff, system=system)

    def calculate(self, atoms=None, properties=None, system_changes=all_changes) -> None:
        properties = properties or ["energy"]
        super().calculate(atoms, properties, system_changes)  # keeps a copy in self.atoms
        system = to_system(self.atoms)
        self.check_plausibility(self.atoms, system)
        graph = GraphBatch.from_systems(
            [system], self.model.cutoff, self.model.three_body_cutoff, dtype=self.dtype, device=self.device
        )
        want_stress = self.compute_stress or "stress" in properties
        options = (None if self.memory_limit is None
                   else dataclasses.replace(self.model.options, memory_limit=self.memory_limit))
        out = self.model(graph, compute_forces=True, compute_stress=want_stress, compute_atomic_energies=True,
                         options=options)
        energy = float(out.energy[0])
        self.results = {
            "energy": energy,
            "free_energy": energy,
            "energies": out.atomic_energies.detach().cpu().numpy().astype(np.float64),
            "forces": out.forces.detach().cpu().numpy().astype(np.float64),
        }
        if out.magmoms is not None:
            self.results["magmoms"] = out.magmoms.detach().cpu().numpy().astype(np.float64)
        if want_stress:
            stress = out.stress[0].detach().cpu().numpy().astype(np.float64)
            if not np.isnan(stress).any():
                s = stress * units.GPa
                self.results["stress"] = np.array([s[0, 0], s[1, 1], s[2, 2], s[1, 2], s[0, 2], s[0, 1]])
