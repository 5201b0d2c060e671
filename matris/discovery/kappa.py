"""Lattice thermal conductivity with a MatRIS model, as Matbench Discovery's κ task computes it.

The protocol of the benchmark (janosh/matbench-discovery @ 023dca9a,
``matbench_discovery/phonons/thermal_conductivity.py``, after Póta et al., arXiv:2408.00755):

1. relax the structure with its symmetry kept (ASE ``FixSymmetry``, ``FrechetCellFilter``,
   FIRE, fmax 1e-4 eV/Å, at most 300 steps) and record the space group before and after
   (spglib, symprec 1e-5): a change counts as broken symmetry (SRME = 2);
2. second- and third-order force constants from finite displacements of 0.03 Å in the given
   supercells (phono3py, symmetrised); the displaced supercells are evaluated by the model in
   batches, one graph per batch (:meth:`matris.MatRIS.predict`, halved where a batch does not
   fit in memory);
3. phonons on the q-point mesh: imaginary modes (:func:`~.kappa_metrics.has_imaginary_modes`)
   are recorded (SRME = 2);
4. κ at 300 K by phono3py's Wigner transport equation in the relaxation-time approximation
   (particle-like plus coherence terms, isotope scattering, boundary mean free path 1 m), and
   each mode's total κ (:func:`~.kappa_metrics.mode_kappa_total`) for κ_SRME.

float64 by default: force constants are differences of forces at 0.03 Å, so float32's force
noise enters them (``docs/discovery.md`` gives the measured difference). Units: Å, eV, THz,
W/(m·K).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..extras import require
from .kappa_metrics import KappaRecord, has_imaginary_modes, mode_kappa_total


@dataclass
class KappaProtocol:
    """The κ task's settings (the benchmark's defaults)."""

    displacement: float = 0.03  # Å
    temperatures: tuple[float, ...] = (300.0,)  # K
    symprec: float = 1e-5
    fmax: float = 1e-4  # eV/Å, symmetry-constrained relaxation
    max_steps: int = 300
    relax: bool = True
    boundary_mfp: float = 1e6  # μm
    batch_size: int = 8  # displaced supercells per model call


@dataclass
class KappaResult:
    """One material's κ calculation: the record the metrics read (:class:`KappaRecord`), the
    frequencies ``[q, b]`` (THz), and what it cost."""

    record: KappaRecord
    frequencies: np.ndarray
    n_displacements: int
    seconds: dict = field(default_factory=dict)  # relax, forces, kappa
    relax_steps: int = 0

    @property
    def kappa_average(self) -> float:
        """κ̄ at the first temperature (W/(m·K))."""
        return float(np.asarray(self.record.kappa)[0, :3].mean())


def spacegroup_number(atoms, symprec: float = 1e-5) -> int:
    """The international space group number of ``atoms`` (spglib)."""
    from .geometry import symmetry_dataset

    data = symmetry_dataset((atoms.cell[:], atoms.get_scaled_positions(), atoms.numbers), symprec)
    if data is None:
        raise ValueError(f"spglib found no symmetry for {atoms.get_chemical_formula()} at symprec {symprec}")
    return int(data.number)


def relax_with_symmetry(atoms, calculator, protocol: KappaProtocol):
    """``atoms`` relaxed (positions and cell) with its space group kept; returns (relaxed copy,
    steps taken)."""
    from ase.constraints import FixSymmetry
    from ase.filters import FrechetCellFilter
    from ase.optimize import FIRE

    atoms = atoms.copy()
    atoms.calc = calculator
    atoms.set_constraint(FixSymmetry(atoms, symprec=protocol.symprec))
    opt = FIRE(FrechetCellFilter(atoms), logfile=None)
    opt.run(fmax=protocol.fmax, steps=protocol.max_steps)
    atoms.set_constraint()
    return atoms, int(opt.nsteps)


def displaced_forces(model, supercells: list, n_atoms: int, batch_size: int) -> np.ndarray:
    """Forces ``[n, n_atoms, 3]`` (eV/Å) of phono3py's displaced supercells (``PhonopyAtoms``;
    None: a displacement symmetry makes unnecessary, zero forces), evaluated in batches."""
    from ase import Atoms

    todo = [(k, Atoms(s.symbols, cell=s.cell, positions=s.positions, pbc=True)) for k, s in enumerate(supercells)
            if s is not None]
    out = np.zeros((len(supercells), n_atoms, 3))
    if todo:
        preds = model.predict([a for _, a in todo], batch_size=batch_size, compute_stress=False,
                              compute_magmoms=False, progress=False)
        for (k, _), p in zip(todo, preds):
            out[k] = p.forces
    return out


def thermal_conductivity(atoms, model, fc2_supercell, fc3_supercell, mesh, protocol: KappaProtocol | None = None
                         ) -> KappaResult:
    """κ of ``atoms`` (ASE Atoms) with ``model`` (a :class:`matris.MatRIS`) by the κ task's
    protocol (module docstring); ``fc2_supercell``, ``fc3_supercell``: ``[3, 3]`` supercell
    matrices (or three multiples) of the unit cell for the second- and third-order force
    constants; ``mesh``: the q-point mesh ``(n1, n2, n3)``."""
    require("phono3py", "kappa", "thermal conductivity")
    from phono3py import Phono3py
    from phonopy.structure.atoms import PhonopyAtoms

    from ..calculator import MatRISCalculator

    protocol = protocol or KappaProtocol()
    seconds = {}
    spg_initial = spacegroup_number(atoms, protocol.symprec)
    t0 = time.perf_counter()
    steps = 0
    if protocol.relax:
        atoms, steps = relax_with_symmetry(atoms, MatRISCalculator(model), protocol)
    seconds["relax"] = time.perf_counter() - t0
    spg_final = spacegroup_number(atoms, protocol.symprec)

    unit = PhonopyAtoms(symbols=atoms.get_chemical_symbols(), cell=atoms.cell[:], positions=atoms.positions)
    with warnings.catch_warnings():  # phono3py 4 warns that "auto" finds the primitive cell: it is asked to
        warnings.filterwarnings("ignore", message="primitive_matrix defaulted")
        ph3 = Phono3py(unit, supercell_matrix=_matrix(fc3_supercell),
                       phonon_supercell_matrix=_matrix(fc2_supercell), primitive_matrix="auto",
                       symprec=protocol.symprec, log_level=0)
    ph3.mesh_numbers = list(mesh)
    ph3.generate_displacements(distance=protocol.displacement)
    t0 = time.perf_counter()
    fc2_cells, fc3_cells = ph3.phonon_supercells_with_displacements, ph3.supercells_with_displacements
    ph3.phonon_forces = displaced_forces(model, fc2_cells, len(ph3.phonon_supercell), protocol.batch_size)
    ph3.forces = displaced_forces(model, fc3_cells, len(ph3.supercell), protocol.batch_size)
    seconds["forces"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if hasattr(ph3, "symmetrize_fc3"):  # phono3py 4: produce, then symmetrise
        ph3.produce_fc2()
        ph3.produce_fc3()
        ph3.symmetrize_fc2()
        ph3.symmetrize_fc3()
    else:
        ph3.produce_fc2(symmetrize_fc2=True)
        ph3.produce_fc3(symmetrize_fc3r=True)
    ph3.init_phph_interaction(symmetrize_fc3q=False)
    ph3.run_phonon_solver()
    frequencies = np.asarray(ph3.get_phonon_data()[0])
    imaginary = has_imaginary_modes(frequencies)
    ph3.run_thermal_conductivity(temperatures=list(protocol.temperatures), is_isotope=True,
                                 boundary_mfp=protocol.boundary_mfp, **_wigner(ph3))
    k = ph3.thermal_conductivity
    kappa, mode_p, mode_c = _wigner_output(k)
    mode_kappa = mode_kappa_total(mode_p, mode_c, np.asarray(k.mode_heat_capacities))
    record = KappaRecord(kappa=kappa, mode_kappa=mode_kappa,
                         weights=np.asarray(k.grid_weights, dtype=float), has_imaginary=imaginary,
                         spg_initial=spg_initial, spg_final=spg_final)
    seconds["kappa"] = time.perf_counter() - t0
    return KappaResult(record=record, frequencies=np.asarray(k.frequencies), seconds=seconds, relax_steps=steps,
                       n_displacements=sum(c is not None for c in fc2_cells) + sum(c is not None for c in fc3_cells))


def _wigner_output(k) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """phono3py's Wigner-RTA results (first smearing): the total κ ``[T, 6]``, the particle-like
    mode κ ``[T, q, b, 6]`` and the coherence matrix ``[T, q, b, b, 6]`` (zero diagonal), from
    phono3py 3 (``kappa_TOT_RTA``, ``mode_kappa_P_RTA``, ``mode_kappa_C``) or 4 (the band-pair
    matrix ``mode_kappa_matrix``: its diagonal is the particle-like part)."""
    try:
        matrix = np.asarray(k.mode_kappa_matrix[0], dtype=float)
    except AttributeError:
        return (np.asarray(k.kappa_TOT_RTA[0], dtype=float), np.asarray(k.mode_kappa_P_RTA[0], dtype=float),
                np.asarray(k.mode_kappa_C[0], dtype=float))
    diagonal = np.einsum("tqbbc->tqbc", matrix).copy()
    coherence = matrix.copy()
    n = matrix.shape[2]
    coherence[:, :, np.arange(n), np.arange(n), :] = 0.0
    return np.asarray(k.kappa[0], dtype=float), diagonal, coherence


def _wigner(ph3) -> dict:
    """The keyword that selects the Wigner transport equation: ``transport_type`` (phono3py 4) or
    ``conductivity_type`` (phono3py 3)."""
    import inspect

    params = inspect.signature(ph3.run_thermal_conductivity).parameters
    if "transport_type" in params:  # phono3py 4 names it after Simoncelli, Marzari and Mauri (2019)
        return {"transport_type": "smm19"}
    return {"conductivity_type": "wigner"}


def _matrix(value) -> np.ndarray:
    m = np.asarray(value, dtype=int)
    return np.diag(m) if m.shape == (3,) else m
