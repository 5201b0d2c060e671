"""ASE calculator for MatRIS."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import os
from typing import Any

import numpy as np
import torch
from ase import units
from ase.calculators.calculator import Calculator, all_changes

from .devices import device_and_dtype, resolve_device, resolve_dtype  # noqa: F401 - re-exported
from .graph import GraphBatch
from .model import MatRIS
from .settings import RunOptions, parse_size
from .structures import to_system, warn_implausible

#: the keywords of ASE's ``Calculator.__init__`` (ASE keeps any other keyword as a parameter, silently)
ASE_KEYWORDS = ("restart", "ignore_bad_restart_file", "label", "atoms", "directory")
#: the official MatRIS calculator's keywords that ours maps (with a note)
OFFICIAL_KEYWORDS = ("task", "mode", "activation_checkpoint")


def check_keywords(owner: str, given: dict[str, Any], valid: list[str]) -> None:
    """Raise ``TypeError`` for a keyword of ``given`` that is not in ``valid``, naming the closest
    valid one: a misspelt ``devcie="cuda"`` must not run on the CPU without a word."""
    unknown = [k for k in given if k not in valid]
    if not unknown:
        return
    key = unknown[0]
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {match[0]!r}?" if match else f"; the keywords are {', '.join(valid)}"
    raise TypeError(f"{owner} got an unexpected keyword argument {key!r}{hint}")


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
        **kwargs: ASE's ``Calculator`` keywords (``restart``, ``ignore_bad_restart_file``,
            ``label``, ``atoms``, ``directory``); any other keyword is a ``TypeError`` naming the
            closest valid one (ASE would keep it silently as a parameter). The official MatRIS
            calculator's ``mode``, ``activation_checkpoint`` and ``task`` are accepted with a
            one-line note of what they do here (:mod:`matris.official`); for that calculator's
            whole interface use :class:`matris.applications.base.MatRISCalculator`.
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
        official = {k: kwargs.pop(k) for k in OFFICIAL_KEYWORDS if k in kwargs}
        check_keywords(type(self).__name__, kwargs, self._keywords())
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
        # how this calculator's calls run (kernels, memory level), None: the model's own options
        self.run_options: RunOptions | None = None
        if official:
            self._apply_official(official)
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
        found = warn_implausible(atoms, self.model.cutoff, system=system)
        self._checked = key  # after the check passed: a structure that raised is checked again when corrected
        return found

    @classmethod
    def _keywords(cls) -> list[str]:
        """The keywords this calculator takes: its own and ASE's ``Calculator``'s."""
        own = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")]
        return own + [p for p in ASE_KEYWORDS if p not in own]

    def _apply_official(self, official: dict[str, Any]) -> None:
        """The official calculator's keywords given to ours: applied, each said in one line."""
        import warnings

        from .official import check_task, run_options

        notes = []
        if "mode" in official or "activation_checkpoint" in official:
            self.run_options = run_options(self.model.options, official.get("mode", "fast"),
                                           official.get("activation_checkpoint", True), self.model.options.tf32)
            notes.append(f"mode={official.get('mode', 'fast')!r} and activation_checkpoint="
                         f"{official.get('activation_checkpoint', True)!r} run as RunOptions(kernels="
                         f"{self.run_options.kernels!r}, memory_level={self.run_options.memory_level!r})")
        if "task" in official:
            task = check_task(official["task"])
            self.compute_stress = "s" in task
            notes.append(f"task={task!r}: this calculator computes energy and forces always, stress "
                         f"{'yes' if self.compute_stress else 'only when asked for'}, magnetic moments where the model "
                         "was trained on them")
        warnings.warn(f"{type(self).__name__}: the official MatRIS keywords {'; '.join(notes)} "
                      "(matris.applications.base.MatRISCalculator takes them as the official calculator does)",
                      UserWarning, stacklevel=3)

    def _options(self) -> RunOptions | None:
        """The options of this calculator's calls (None: the model's own)."""
        options = self.run_options
        if self.memory_limit is not None:
            options = dataclasses.replace(options or self.model.options, memory_limit=self.memory_limit)
        return options

    def _evaluate(self, forces: bool = True, stress: bool = True, magmoms: bool | None = None,
                  atomic_energies: bool = True):
        """The model on ``self.atoms`` (one structure): its :class:`~matris.model.ModelOutput`."""
        system = to_system(self.atoms)
        system.validate()  # bad input (NaN positions, Z=0) is an error before any neighbour search
        self.check_plausibility(self.atoms, system)
        graph = GraphBatch.from_systems(
            [system], self.model.cutoff, self.model.three_body_cutoff, dtype=self.dtype, device=self.device
        )
        return self.model(graph, compute_forces=forces, compute_stress=stress, compute_magmoms=magmoms,
                          compute_atomic_energies=atomic_energies, options=self._options())

    def calculate(self, atoms=None, properties=None, system_changes=all_changes) -> None:
        properties = properties or ["energy"]
        super().calculate(atoms, properties, system_changes)  # keeps a copy in self.atoms
        want_stress = self.compute_stress or "stress" in properties
        out = self._evaluate(stress=want_stress)
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
