"""The official ASE calculator (``matris.applications.base.MatRISCalculator``) and the relaxation
observer (``TrajectoryObserver``), over :class:`matris.MatRISCalculator`."""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
import torch
from ase import Atoms, units
from ase.calculators.calculator import Calculator, all_changes
from ase.optimize import BFGS, FIRE, LBFGS, BFGSLineSearch, LBFGSLineSearch, MDMin

from ..calculator import MatRISCalculator as _Calculator
from ..model import MatRIS
from ..official import check_mode, check_task, run_options

#: the optimizers ``StructOptimizer(optimizer=NAME)`` takes, by name
OPTIMIZERS = {cls.__name__: cls for cls in (BFGS, BFGSLineSearch, FIRE, LBFGS, LBFGSLineSearch, MDMin)}
_NAMES = ("energy", "forces", "stress", "magmoms")


class MatRISCalculator(_Calculator):
    """The official MatRIS calculator: ``MatRISCalculator(model, task, device, mode,
    activation_checkpoint, tf32)``.

    Results as the official one gives them: ``energy`` (eV, total), ``ref_energy`` (eV, the
    reference energies' part of it), and by ``task`` (``"e"``, ``"em"``, ``"ef"``, ``"efs"``,
    ``"efsm"``): ``forces`` ``[N, 3]`` eV/Å, ``stress`` ``[3, 3]`` eV/Å³ (ASE's sign; zero for a
    structure without a 3-D cell), ``magmoms`` ``[N]`` μB. ``implemented_properties`` follow
    ``task``. The caller's Atoms are never modified.

    Args:
        model: a model name (official keys such as ``"matris_10m_oam"`` or ours), a checkpoint
            path or URL, or a :class:`matris.MatRIS`.
        task: what to compute (above).
        device: "cpu" (the official default), "cuda", "cuda:N"; None: CUDA when present.
        mode: "fast" (the fused kernels) or "torch" (the PyTorch references); same numbers.
        activation_checkpoint: True, recompute activations when memory requires it (the fastest
            memory level that fits); False, keep every activation.
        tf32: TF32 matmuls on CUDA (faster, less exact).
        dtype: ours (:class:`matris.MatRISCalculator`): float32 or float64.
        memory_limit: ours: a size such as ``"8 GB"`` the calls must fit in.
        compile: ours: ``torch.compile`` the model.
        **kwargs: ASE ``Calculator`` keywords; any other keyword is a ``TypeError`` naming the closest.
    """

    implemented_properties = list(_NAMES)

    def __init__(self, model: str | os.PathLike | MatRIS = "matris_10m_oam", task: str = "efs",
                 device: str | None = "cpu", mode: str = "fast", activation_checkpoint: bool = True,
                 tf32: bool = False, *, dtype: str | torch.dtype | None = None, memory_limit: Any = None,
                 compile: bool = False, **kwargs: Any) -> None:
        if "checkpoint" in kwargs:
            raise TypeError("Use activation_checkpoint instead of checkpoint.")
        check_task(task)
        check_mode(mode)
        loaded = not isinstance(model, MatRIS)
        super().__init__(model, device="auto" if device is None else device, dtype=dtype, compute_stress="s" in task,
                         compile=compile, tf32=tf32, memory_limit=memory_limit, **kwargs)
        if loaded:  # the official calculator's own model takes no gradients
            self.model.requires_grad_(False)
        self.task = task
        self.mode = mode
        self.activation_checkpoint = activation_checkpoint
        self.tf32 = tf32
        self.run_options = run_options(self.model.options, mode, activation_checkpoint, tf32)
        self.stress_unit = units.GPa
        self.implemented_properties = [name for key, name in zip("efsm", _NAMES) if key in task]

    def calculate(self, atoms: Atoms | None = None, properties: list[str] | None = None,
                  system_changes: list[str] = all_changes) -> None:
        Calculator.calculate(self, atoms, properties, system_changes)  # keeps a copy in self.atoms
        task = self.task
        out = self._evaluate(forces="f" in task, stress="s" in task, magmoms="m" in task, atomic_energies=False)
        energy = float(out.energy[0])
        self.results = {"energy": energy, "free_energy": energy, "ref_energy": self._reference_energy()}
        if out.forces is not None:
            self.results["forces"] = out.forces.detach().cpu().numpy().astype(np.float64)
        if out.stress is not None:
            stress = np.nan_to_num(out.stress[0].detach().cpu().numpy().astype(np.float64), nan=0.0)
            self.results["stress"] = stress * self.stress_unit
        if "m" in task:
            self.results["magmoms"] = out.magmoms.detach().cpu().numpy().astype(np.float64)

    def _reference_energy(self) -> float:
        """The reference energies' part of the energy (eV): the official ``results["ref_energy"]``."""
        reference = self.model.reference_energy
        if reference is None:
            return 0.0
        z = torch.as_tensor(self.atoms.get_atomic_numbers(), dtype=torch.int64, device=self.model.device)
        n = len(self.atoms)
        per = reference(z, torch.zeros_like(z), torch.tensor([n], device=z.device))
        return float(per[0]) * (n if self.model.is_intensive else 1)


class TrajectoryObserver:
    """Records a relaxation frame per call: ``energies`` (eV), ``forces`` (eV/Å), ``stresses``
    (Voigt, eV/Å³; None without stress), ``magmoms`` (μB; None without), ``atom_positions`` (Å)
    and ``cells`` (Å) of ``atoms``."""

    def __init__(self, atoms: Atoms) -> None:
        self.atoms = atoms
        self.energies: list[float] = []
        self.forces: list[np.ndarray] = []
        self.stresses: list[np.ndarray | None] = []
        self.magmoms: list[np.ndarray | None] = []
        self.atom_positions: list[np.ndarray] = []
        self.cells: list[np.ndarray] = []

    def __call__(self) -> None:
        atoms = self.atoms
        offered = atoms.calc.implemented_properties
        self.energies.append(atoms.get_potential_energy())
        self.forces.append(atoms.get_forces())
        self.stresses.append(atoms.get_stress() if "stress" in offered else None)
        self.magmoms.append(atoms.get_magnetic_moments() if "magmoms" in offered else None)
        self.atom_positions.append(atoms.get_positions())
        self.cells.append(atoms.cell.array.copy())

    def __len__(self) -> int:
        return len(self.energies)

    def save(self, filename: str | os.PathLike) -> None:
        """Pickle the frames to ``filename`` (keys ``energy``, ``forces``, ``stresses``,
        ``magmoms``, ``atom_positions``, ``cell``, ``atomic_number``), through a temporary file."""
        from ..atomic import atomic_path

        frames = {"energy": self.energies, "forces": self.forces, "stresses": self.stresses,
                  "magmoms": self.magmoms, "atom_positions": self.atom_positions, "cell": self.cells,
                  "atomic_number": self.atoms.get_atomic_numbers()}
        with atomic_path(filename, suffix=".tmp") as tmp, open(tmp, "wb") as handle:
            pickle.dump(frames, handle)


__all__ = ["MatRISCalculator", "TrajectoryObserver", "OPTIMIZERS"]
