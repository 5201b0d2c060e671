"""Equation of state: energies of isotropically scaled cells fitted with an analytic E(V)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import MatRISInputError
from .inputs import ModelLike, check_positive, prepare, require_periodic
from .plots import eos_figure, save_figure
from .relaxation import relax

EOS_FORMS = ("birchmurnaghan", "murnaghan", "vinet", "sj", "taylor", "p3")


@dataclass
class EOSResult:
    """An E(V) fit.

    volumes: ``[P]`` cell volumes, Å³; energies: ``[P]`` eV, of the whole cell (``natoms`` atoms).
    v0: Å³ and e0: eV at the minimum of the fit; bulk_modulus: GPa. structures: the scaled
    (and, with ``relax_positions``, relaxed) cells as Atoms. plot: the figure, if written.
    """

    name: str
    natoms: int
    eos: str
    volumes: np.ndarray
    energies: np.ndarray
    v0: float
    e0: float
    bulk_modulus: float
    structures: list = field(default_factory=list, repr=False)
    plot: Path | None = None
    _fit: Any = field(default=None, repr=False)

    def fit_energies(self, volumes) -> np.ndarray:
        """The fitted energy (eV) at ``volumes`` (Å³)."""
        return np.asarray(self._fit.func(np.asarray(volumes), *self._fit.eos_parameters))

    def to_dict(self) -> dict:
        n = self.natoms
        return {"name": self.name, "natoms": n, "eos": self.eos, "v0_A3": self.v0, "v0_per_atom_A3": self.v0 / n,
                "e0_eV": self.e0, "e0_per_atom_eV": self.e0 / n, "bulk_modulus_GPa": self.bulk_modulus,
                "lattice_scale_at_v0": float((self.v0 / self.volumes[len(self.volumes) // 2]) ** (1 / 3)),
                "volumes_A3": self.volumes.tolist(), "energies_eV": self.energies.tolist(),
                "plot": None if self.plot is None else str(self.plot)}


def equation_of_state(
    structure: Any,
    points: int = 11,
    volume_range: float = 0.06,
    eos: str = "birchmurnaghan",
    relax_positions: bool = True,
    fmax: float = 0.05,
    relax_steps: int = 200,
    model: ModelLike = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    plot: str | os.PathLike | None = None,
) -> EOSResult:
    """Fit E(V) of ``structure`` (Atoms or pymatgen) scaled isotropically to ``points`` volumes.

    Args:
        volume_range: volumes span V·(1 − range) … V·(1 + range) around the input volume; start
            from a relaxed structure so that the minimum lies inside.
        eos: one of :data:`EOS_FORMS` (ASE's names; Birch–Murnaghan by default).
        relax_positions: relax the atoms at each fixed cell (FIRE to ``fmax`` eV/Å, at most
            ``relax_steps`` steps); without it all cells are evaluated in one batch.
        plot: write the points and the fit to this image file.
    """
    from ase import units
    from ase.eos import EquationOfState

    if eos not in EOS_FORMS:
        raise MatRISInputError(f"unknown equation of state {eos!r}; choose one of {', '.join(EOS_FORMS)}")
    if not isinstance(points, int) or points < 5:
        raise MatRISInputError(f"points must be an integer ≥ 5 for a 4-parameter fit, got {points!r}")
    check_positive(volume_range=volume_range, fmax=fmax)
    if volume_range >= 0.5:
        raise MatRISInputError(f"volume_range {volume_range} is a fraction of the volume; use e.g. 0.06 for ±6%")
    atoms = prepare(structure, model, device, dtype, compute_stress=False)
    require_periodic(atoms, "an equation of state", "give a bulk crystal")
    calc = atoms.calc
    scales = 1 + np.linspace(-volume_range, volume_range, points)
    cells = []
    for s in scales:
        scaled = atoms.copy()
        scaled.set_cell(atoms.cell * s ** (1 / 3), scale_atoms=True)
        cells.append(scaled)
    if relax_positions:
        results = [relax(c, fmax=fmax, steps=relax_steps, relax_cell=False, model=calc) for c in cells]
        cells = [r.atoms for r in results]
        energies = np.array([r.energy for r in results])
    else:
        energies = np.array([p.energy for p in calc.model.predict(cells, batch_size=points, warn_inputs=False)])
    volumes = np.array([c.get_volume() for c in cells])
    fit = EquationOfState(volumes, energies, eos=eos)
    try:
        with warnings.catch_warnings():  # ASE warns when V0 is outside the points: checked below
            warnings.simplefilter("ignore")
            v0, e0, b = fit.fit()
    except (RuntimeError, ValueError) as exc:
        raise MatRISInputError(f"the {eos} fit failed ({exc}); relax the structure first (matris relax) so that "
                               "the minimum lies inside the sampled volumes") from None
    name = atoms.info.get("name") or atoms.get_chemical_formula()
    if not volumes.min() <= v0 <= volumes.max():
        raise MatRISInputError(
            f"{name}: the fitted minimum (V₀ = {v0:.2f} Å³) lies outside the sampled volumes "
            f"{volumes.min():.2f}–{volumes.max():.2f} Å³; relax the structure first or widen volume_range"
        )
    result = EOSResult(name=name, natoms=len(atoms), eos=eos, volumes=volumes, energies=energies, v0=float(v0),
                       e0=float(e0), bulk_modulus=float(b / units.GPa), structures=cells, _fit=fit)
    if plot is not None:
        result.plot = save_figure(eos_figure(result), plot)
    return result
