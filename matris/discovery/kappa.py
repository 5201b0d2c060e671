"""Lattice thermal conductivity with a MatRIS model, as Matbench Discovery's κ task computes it.

The protocol is the benchmark's own, setting for setting, at janosh/matbench-discovery commit
2c7f9fc42d018711dc2f5df573d225ea6d2d17b2 (:data:`BENCHMARK_COMMIT`; files named below are at
that commit; after Póta et al., arXiv:2408.00755):

1. space group of the input (moyopy, symprec 1e-5: ``phonons/adapters/standard.py``
   ``space_group_number``, ``phonons/pipeline.py`` ``KappaSettings.symprec``);
2. relaxation with the symmetry kept: ASE ``FixSymmetry(symprec=0.01)`` (``relax_symprec``),
   ``FrechetCellFilter(mask=NO_TILT_MASK)`` (no cell tilts), FIRE to the model's ``force_max``
   (MatRIS: 1e-5 eV/Å, ``models/matris/matris-10m-oam.yml`` ``hyperparams.evaluation.kappa``),
   at most 300 steps (``StandardKappaAdapter.relax``); the space group again (moyopy, 1e-5): a
   change is a broken symmetry;
3. phono3py (symprec 1e-5, primitive "auto", the given supercells and q-mesh), displacements of
   0.03 Å (the MatRIS yml's ``displacement_distance``; ``is_plusminus="auto"``); FC2 from the
   displaced supercells' forces (``produce_fc2(symmetrize_fc2=True)``), the phonons on the mesh
   and the imaginary-mode check (``phonons/__init__.py`` ``check_imaginary_freqs``,
   :func:`~.kappa_metrics.has_imaginary_modes`) (``thermal_conductivity.get_fc2_and_freqs``);
4. imaginary modes or a broken symmetry: κ is not computed (NaN: SRD −2, SRME 2),
   ``pipeline.should_calculate_conductivity``; else FC3 (``produce_fc3(symmetrize_fc3r=True)``)
   and κ by phono3py's Wigner transport equation in the relaxation-time approximation,
   ``transport_type="MS-SMM19"`` (Simoncelli, Marzari, Mauri 2019, with isotope scattering,
   boundary mean free path 1e6 μm), at 300 K (``thermal_conductivity.calculate_conductivity``);
   each mode's total κ splits the coherence term as the benchmark does
   (:func:`~.kappa_metrics.mode_kappa_total`).

MS-SMM19 exists in phono3py 3.30 (the version the benchmark pins; phono3py ≥ 3.31 removed it:
there its call raises NotImplementedError). With a phono3py without it the calculation falls
back to phono3py's ``SMM19`` method with a warning (``KappaResult.method`` says which ran): a
different velocity operator, κ̄ about 1–3 % lower on Si, MgO and NaCl (``docs/discovery.md``).

The displaced supercells are evaluated by the model (:meth:`matris.MatRIS.predict`) one by one
by default, as the benchmark's ASE calculator calls: the forces are then bitwise the
benchmark's; batches (``batch_size`` > 1) are faster but differ by ~2e-16 eV/Å, which moves
MgO's κ by 0.3 % with the demo model. float64 by default: force constants are
differences of forces at 0.03 Å, so float32's force noise enters them. Units: Å, eV, THz,
W/(m·K).
"""

from __future__ import annotations

import inspect
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..extras import require
from .kappa_metrics import KappaRecord, has_imaginary_modes, mode_kappa_total

BENCHMARK_COMMIT = "2c7f9fc42d018711dc2f5df573d225ea6d2d17b2"
# FrechetCellFilter's mask of the benchmark's symmetry-constrained relaxation: the three normal
# strains only (phonons/adapters/standard.py, NO_TILT_MASK)
NO_TILT_MASK = [True, True, True, False, False, False]
WIGNER_METHOD = "MS-SMM19"


@dataclass
class KappaProtocol:
    """The κ task's settings: the benchmark's ``KappaSettings`` defaults
    (``phonons/pipeline.py``) with the MatRIS yml's overrides (displacement 0.03 Å,
    ``force_max`` 1e-5 eV/Å)."""

    displacement: float = 0.03  # Å (MatRIS yml; the benchmark's default is 0.01)
    temperatures: tuple[float, ...] = (300.0,)  # K
    symprec: float = 1e-5  # space groups (moyopy) and phono3py
    relax_symprec: float = 0.01  # FixSymmetry during the relaxation
    fmax: float = 1e-5  # eV/Å (MatRIS yml force_max; the benchmark's default is 1e-4)
    max_steps: int = 300
    relax: bool = True
    boundary_mfp: float = 1e6  # μm
    method: str = WIGNER_METHOD  # phono3py transport_type
    conductivity_broken_symm: bool = False  # compute κ even where the relaxation broke the symmetry
    # displaced supercells per model call: 1, as the benchmark's one-by-one calculator calls, gives
    # forces bitwise equal to them; a batch sums in another order (~2e-16 eV/Å), which alone moves
    # MgO's κ by 0.3 % (SRME 0.01 against the benchmark's code; docs/discovery.md)
    batch_size: int = 1


@dataclass
class KappaResult:
    """One material's κ calculation: the record the metrics read (:class:`KappaRecord`), the
    frequencies ``[q, b]`` (THz), and what it cost. ``method``: the phono3py transport type that
    ran (None where κ was not computed: imaginary modes or a broken symmetry)."""

    record: KappaRecord
    frequencies: np.ndarray
    n_displacements: int
    seconds: dict = field(default_factory=dict)  # relax, forces, kappa
    relax_steps: int = 0
    method: str | None = None
    reached_max_steps: bool = False

    @property
    def kappa_average(self) -> float:
        """κ̄ at the first temperature (W/(m·K)); NaN where κ was not computed."""
        return float(np.asarray(self.record.kappa)[0, :3].mean())


def spacegroup_number(atoms, symprec: float = 1e-5) -> int:
    """The international space group number of ``atoms`` (moyopy, as the benchmark's
    ``space_group_number``)."""
    from moyopy import MoyoDataset
    from moyopy.interface import MoyoAdapter

    return int(MoyoDataset(MoyoAdapter.from_atoms(atoms), symprec=symprec).number)


def relax_with_symmetry(atoms, calculator, protocol: KappaProtocol):
    """``atoms`` relaxed (positions and cell, no tilts) with its space group kept, as the
    benchmark's ``StandardKappaAdapter.relax``; returns (relaxed copy, steps taken)."""
    from ase.constraints import FixSymmetry
    from ase.filters import FrechetCellFilter
    from ase.optimize import FIRE

    atoms = atoms.copy()
    atoms.calc = calculator
    atoms.set_constraint(FixSymmetry(atoms, symprec=protocol.relax_symprec))
    opt = FIRE(FrechetCellFilter(atoms, mask=NO_TILT_MASK), logfile=None)
    opt.run(fmax=protocol.fmax, steps=protocol.max_steps)
    atoms.calc = None
    atoms.constraints = None
    return atoms, int(opt.get_number_of_steps())


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
    constants; ``mesh``: the q-point mesh ``(n1, n2, n3)``. Where the phonons have imaginary modes
    or the relaxation changed the space group, κ is not computed: the record's ``kappa`` is NaN
    and it has no mode resolution (the benchmark's ``calculate_kappa_for_structure``)."""
    require("phono3py", "kappa", "thermal conductivity")
    from phono3py import Phono3py
    from phonopy.structure.atoms import PhonopyAtoms

    from ..calculator import MatRISCalculator

    protocol = protocol or KappaProtocol()
    seconds = {}
    spg_initial = spacegroup_number(atoms, protocol.symprec)
    t0 = time.perf_counter()
    steps = 0
    if protocol.relax and protocol.max_steps > 0:
        atoms, steps = relax_with_symmetry(atoms, MatRISCalculator(model), protocol)
    seconds["relax"] = time.perf_counter() - t0
    spg_final = spacegroup_number(atoms, protocol.symprec) if protocol.relax and protocol.max_steps > 0 else spg_initial

    # the unit cell as the benchmark's init_phono3py passes it (symbols, the cell, Cartesian positions)
    unit = PhonopyAtoms(atoms.symbols, cell=atoms.cell, positions=atoms.positions)
    with warnings.catch_warnings():  # phono3py ≥ 3.31 warns that "auto" finds the primitive cell: it is asked to
        warnings.filterwarnings("ignore", message="primitive_matrix defaulted")
        ph3 = Phono3py(unit, supercell_matrix=_matrix(fc3_supercell),
                       phonon_supercell_matrix=_matrix(fc2_supercell), primitive_matrix="auto",
                       symprec=protocol.symprec, log_level=0)
    ph3.mesh_numbers = tuple(int(n) for n in mesh)
    ph3.generate_displacements(distance=protocol.displacement, is_plusminus="auto")
    t0 = time.perf_counter()
    fc2_cells = ph3.phonon_supercells_with_displacements
    ph3.phonon_forces = displaced_forces(model, fc2_cells, len(ph3.phonon_supercell), protocol.batch_size)
    seconds["forces"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ph3.produce_fc2(symmetrize_fc2=True)
    ph3.init_phph_interaction(symmetrize_fc3q=False)
    ph3.run_phonon_solver()
    frequencies = np.asarray(ph3.get_phonon_data()[0])
    imaginary = has_imaginary_modes(frequencies)
    broken = spg_final != spg_initial
    n_displacements = sum(c is not None for c in fc2_cells)
    seconds["kappa"] = time.perf_counter() - t0
    if imaginary or (broken and not protocol.conductivity_broken_symm):  # κ not computed: NaN
        record = KappaRecord(kappa=np.full((len(protocol.temperatures), 6), np.nan), has_imaginary=imaginary,
                             spg_initial=spg_initial, spg_final=spg_final)
        return KappaResult(record=record, frequencies=frequencies, seconds=seconds, relax_steps=steps,
                           n_displacements=n_displacements, reached_max_steps=steps >= protocol.max_steps)

    t0 = time.perf_counter()
    fc3_cells = ph3.supercells_with_displacements
    ph3.forces = displaced_forces(model, fc3_cells, len(ph3.supercell), protocol.batch_size)
    n_displacements += sum(c is not None for c in fc3_cells)
    seconds["forces"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ph3.produce_fc3(symmetrize_fc3r=True)
    ph3.init_phph_interaction(symmetrize_fc3q=False)
    method = wigner_method(protocol.method)
    ph3.run_thermal_conductivity(temperatures=list(protocol.temperatures), is_isotope=True,
                                 boundary_mfp=protocol.boundary_mfp, **_transport(ph3, method))
    k = ph3.thermal_conductivity
    kappa, mode_p, mode_c = _wigner_output(k)
    mode_kappa = mode_kappa_total(mode_p, mode_c, np.asarray(k.mode_heat_capacities))
    record = KappaRecord(kappa=kappa, mode_kappa=mode_kappa,
                         weights=np.asarray(k.grid_weights, dtype=float), has_imaginary=imaginary,
                         spg_initial=spg_initial, spg_final=spg_final)
    seconds["kappa"] += time.perf_counter() - t0
    return KappaResult(record=record, frequencies=np.asarray(k.frequencies), seconds=seconds, relax_steps=steps,
                       n_displacements=n_displacements, method=method,
                       reached_max_steps=steps >= protocol.max_steps)


def has_ms_smm19() -> bool:
    """Whether the installed phono3py has the benchmark's Wigner method ``MS-SMM19`` (3.30)."""
    try:
        from phono3py.conductivity.factory import _REGISTRY  # noqa: PLC0415
    except ImportError:
        return False
    try:
        import phono3py.conductivity.ms_smm19  # noqa: F401, PLC0415  registers the method
    except ImportError:
        pass
    return any(str(k).lower().startswith("ms-smm19") for k in _REGISTRY)


def wigner_method(requested: str = WIGNER_METHOD) -> str:
    """The transport type to run: ``requested`` where the installed phono3py has it; the
    benchmark's ``MS-SMM19`` falls back to ``SMM19`` (with a warning) on a phono3py without it."""
    if requested.upper() != WIGNER_METHOD or has_ms_smm19():
        return requested
    warnings.warn("this phono3py has no MS-SMM19 (the Wigner RTA method of Matbench Discovery, phono3py 3.30): "
                  "κ is computed with SMM19, which differs from the benchmark's by ~1-3 % (pip install "
                  "'phono3py==3.30.0' 'phonopy>=3.5,<3.6' for the benchmark's method)", stacklevel=3)
    return "SMM19"


def _wigner_output(k) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """phono3py's Wigner-RTA results (first smearing): the total κ ``[T, 6]``, the particle-like
    mode κ ``[T, q, b, 6]`` and the coherence matrix ``[T, q, b, b, 6]``, as the benchmark reads
    them (``get_extra_kappa_output()``: ``kappa_TOT_RTA``, ``mode_kappa_P_RTA``, ``mode_kappa_C``;
    phono3py 3.30's MS-SMM19), or from the band-pair matrix ``mode_kappa_matrix`` of SMM19
    (its diagonal the particle-like part, the rest the coherence)."""
    extra = k.get_extra_kappa_output() if hasattr(k, "get_extra_kappa_output") else None
    if extra and "mode_kappa_C" in extra:
        return (np.asarray(extra["kappa_TOT_RTA"][0], dtype=float),
                np.asarray(extra["mode_kappa_P_RTA"][0], dtype=float),
                np.asarray(extra["mode_kappa_C"][0], dtype=float))
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


def _transport(ph3, method: str) -> dict:
    """The keyword that selects the Wigner transport equation: ``transport_type`` (phono3py
    ≥ 3.30) or ``conductivity_type`` (older)."""
    params = inspect.signature(ph3.run_thermal_conductivity).parameters
    if "transport_type" in params:
        return {"transport_type": method}
    return {"conductivity_type": "wigner"}


def _matrix(value) -> np.ndarray:
    m = np.asarray(value, dtype=int)
    return np.diag(m) if m.shape == (3,) else m
