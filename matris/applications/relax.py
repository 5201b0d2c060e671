"""The official structure optimizer (``matris.applications.relax.StructOptimizer``): an ASE
optimizer, optionally on a cell filter, driving :class:`matris.applications.base.MatRISCalculator`."""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any

from ase import Atoms
from ase.filters import Filter
from ase.optimize.optimize import Optimizer

from ..model import MatRIS
from .base import OPTIMIZERS, MatRISCalculator, TrajectoryObserver


class StructOptimizer:
    """Relax atomic positions, and optionally the cell, with a named ASE optimizer.

    ``optimizer``: a name of :data:`matris.applications.base.OPTIMIZERS` (FIRE, BFGS, LBFGS,
    BFGSLineSearch, LBFGSLineSearch, MDMin) or an ASE ``Optimizer`` class. The other arguments go
    to :class:`~matris.applications.base.MatRISCalculator` (``model`` may also be a
    :class:`matris.MatRIS`; ``calculator=`` takes a ready one instead).
    """

    def __init__(self, model: str | os.PathLike | MatRIS = "matris_10m_oam", task: str = "efs",
                 optimizer: str | type[Optimizer] = "FIRE", device: str | None = "cpu", mode: str = "fast",
                 activation_checkpoint: bool = False, tf32: bool = False, *,
                 calculator: MatRISCalculator | None = None) -> None:
        if isinstance(optimizer, str):
            if optimizer not in OPTIMIZERS:
                raise ValueError(f"Optimizer {optimizer} not found. Select from {list(OPTIMIZERS)}")
            optimizer = OPTIMIZERS[optimizer]
        self.optimizer: type[Optimizer] = optimizer
        self.calculator = calculator if calculator is not None else MatRISCalculator(
            model=model, task=task, device=device, mode=mode, activation_checkpoint=activation_checkpoint, tf32=tf32)

    def relax(self, atoms: Any, fmax: float = 0.05, steps: int = 500, relax_cell: bool = True,
              ase_filter: str | type[Filter] = "FrechetCellFilter", save_path: str | None = None,
              loginterval: int = 1, verbose: bool = True, assign_magmoms: bool = True,
              **kwargs: Any) -> dict[str, Any]:
        """Relax ``atoms`` (ASE ``Atoms``, relaxed in place; or a pymatgen ``Structure``/``Molecule``,
        converted) until every force is below ``fmax`` eV/Å or ``steps`` steps have run.

        ``relax_cell``: also the cell, through ``ase_filter`` (a name in ``ase.filters`` or a
        class). ``loginterval``: record a frame every so many steps (and the last one).
        ``save_path``: pickle the frames there (:meth:`TrajectoryObserver.save`). ``verbose``:
        the optimizer's log on stdout. ``assign_magmoms``: the final magnetic moments as the
        structure's ``magmom`` site property. ``kwargs`` go to the optimizer.

        Returns ``{"final_structure": Structure | Molecule, "trajectory": TrajectoryObserver}``:
        a ``Molecule`` where no direction is periodic, else a ``Structure``.
        """
        from ..extras import require

        adaptor = require("pymatgen.io.ase", "discovery", "StructOptimizer.relax (its result is a pymatgen "
                          "structure)", package="pymatgen").AseAtomsAdaptor
        if loginterval <= 0:
            raise ValueError("loginterval must be positive")
        if relax_cell and isinstance(ase_filter, str):
            import ase.filters

            found = getattr(ase.filters, ase_filter, None)
            if not (isinstance(found, type) and issubclass(found, Filter)):
                raise ValueError(f"Unknown ASE cell filter: {ase_filter}")
            ase_filter = found
        if not isinstance(atoms, Atoms):
            atoms = adaptor.get_atoms(atoms)
        atoms.calc = self.calculator
        log = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
        with log:
            observer = TrajectoryObserver(atoms)
            optimizer = self.optimizer(ase_filter(atoms) if relax_cell else atoms, **kwargs)
            optimizer.attach(observer, interval=loginterval)
            optimizer.run(fmax=fmax, steps=steps)
            if optimizer.nsteps % loginterval:
                observer()  # the last frame, which the interval skipped
        if save_path is not None:
            observer.save(save_path)
        final = adaptor.get_structure(atoms) if atoms.pbc.any() else adaptor.get_molecule(atoms)
        if assign_magmoms and "magmoms" in self.calculator.implemented_properties:
            final.add_site_property("magmom", atoms.get_magnetic_moments().tolist())
        return {"final_structure": final, "trajectory": observer}


__all__ = ["StructOptimizer"]
