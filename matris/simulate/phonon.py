"""Harmonic phonons with phonopy: finite displacements, MatRIS forces, band structure, DOS
and thermal properties."""

from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..atomic import atomic_path
from ..errors import MatRISInputError
from ..extras import require
from .inputs import ModelLike, check_positive, prepare, require_periodic
from .plots import phonon_figure, save_figure

IMAGINARY_TOLERANCE_THZ = 0.05  # |ν| below this at Γ is numerical noise of the acoustic modes


@dataclass
class PhononResult:
    """Phonons of one structure (per primitive cell of phonopy's choice).

    band: ``distances [Q]`` (1/Å along the path), ``frequencies [Q, 3M]`` THz, ``labels`` and
    ``label_positions`` of the high-symmetry points. dos: ``frequencies [F]`` THz and
    ``total_dos [F]`` states/THz. thermal: ``temperatures [T]`` K, ``free_energy`` kJ/mol,
    ``entropy`` and ``heat_capacity`` J/(K·mol), per mole of primitive cells.
    min_frequency: THz (negative = imaginary). phonopy: the :class:`phonopy.Phonopy` object,
    force constants set, for anything further.
    """

    name: str
    supercell: list[int]
    band: dict
    dos: dict
    thermal: dict
    min_frequency: float
    phonopy: Any = field(repr=False)
    plot: Path | None = None
    saved: Path | None = None

    @property
    def has_imaginary(self) -> bool:
        return self.min_frequency < -IMAGINARY_TOLERANCE_THZ

    def to_dict(self) -> dict:
        t = self.thermal
        return {"name": self.name, "supercell": self.supercell, "min_frequency_THz": self.min_frequency,
                "max_frequency_THz": float(np.max(self.band["frequencies"])), "has_imaginary": self.has_imaginary,
                "band_labels": self.band["labels"],
                "thermal": {k: np.asarray(v).tolist() for k, v in t.items()},
                "plot": None if self.plot is None else str(self.plot),
                "phonopy_params": None if self.saved is None else str(self.saved)}


def phonons(
    structure: Any,
    supercell: Sequence[int] | int | None = None,
    displacement: float = 0.01,
    mesh: Sequence[int] | int = 20,
    t_min: float = 0.0,
    t_max: float = 1000.0,
    t_step: float = 10.0,
    npoints: int = 101,
    primitive: str | None = "auto",
    symprec: float = 1e-5,
    min_supercell_length: float = 10.0,
    batch_size: int = 8,
    model: ModelLike = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    plot: str | os.PathLike | None = None,
    save: str | os.PathLike | None = None,
) -> PhononResult:
    """Phonons of ``structure`` (Atoms or pymatgen; relax it first) by finite displacements.

    Args:
        supercell: repetitions of the input cell, 3 integers or one for all; default: the
            smallest that makes every cell vector at least ``min_supercell_length`` Å.
        displacement: Å. mesh: q-point mesh for DOS and thermal properties (3 integers or one).
        t_min: lowest temperature of the thermal properties, K.
        t_max: highest temperature of the thermal properties, K.
        t_step: temperature step of the thermal properties, K.
        npoints: q-points along the band path. primitive: phonopy's primitive_matrix
            ("auto" finds the primitive cell, None keeps the input cell).
        batch_size: displaced supercells per model call.
        plot: write the band structure and DOS to this image. save: write phonopy's
            ``phonopy_params.yaml`` (structure, displacements, forces) to this path.

    Forces of the undisplaced supercell are subtracted from those of the displaced ones, so
    residual forces of a not fully relaxed input do not enter the force constants.
    """
    from ase import Atoms
    Phonopy = require("phonopy", "phonons", "phonon calculations").Phonopy
    from phonopy.structure.atoms import PhonopyAtoms

    check_positive(displacement=displacement, t_step=t_step, min_supercell_length=min_supercell_length)
    if not 0 <= t_min <= t_max:
        raise MatRISInputError(f"need 0 ≤ t_min ≤ t_max (K), got t_min={t_min}, t_max={t_max}")
    atoms = prepare(structure, model, device, dtype, compute_stress=False)
    require_periodic(atoms, "phonons", "give a bulk crystal")
    name = atoms.info.get("name") or atoms.get_chemical_formula()
    reps = _supercell(atoms, supercell, min_supercell_length)
    unit = PhonopyAtoms(symbols=atoms.get_chemical_symbols(), cell=np.asarray(atoms.cell),
                        scaled_positions=atoms.get_scaled_positions())
    try:
        with warnings.catch_warnings():
            # phonopy 4 warns that primitive_matrix "auto" is its new default: it is our choice, asked for
            warnings.filterwarnings("ignore", message=".*primitive_matrix.*")
            ph = Phonopy(unit, supercell_matrix=np.diag(reps), primitive_matrix=primitive, symprec=symprec)
            ph.generate_displacements(distance=displacement)
    except Exception as exc:  # noqa: BLE001 - spglib and phonopy raise their own types; say it in one line
        if type(exc).__module__.split(".")[0] not in ("spglib", "phonopy") and not isinstance(exc, (ValueError,
                                                                                                   RuntimeError)):
            raise
        raise MatRISInputError(
            f"structure {name}: phonopy could not analyse its symmetry ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:150] if str(exc).strip() else 'no message'}); check the "
            f"structure (relax it first, or pass a larger symprec than {symprec:g})") from None

    def as_atoms(cell):
        return Atoms(symbols=cell.symbols, cell=cell.cell, scaled_positions=cell.scaled_positions, pbc=True)

    model_ = atoms.calc.model
    displaced = [as_atoms(c) for c in ph.supercells_with_displacements]
    # the unit cell was checked by prepare(): its displaced supercells need no warning each
    predictions = model_.predict([as_atoms(ph.supercell)] + displaced, batch_size=batch_size, warn_inputs=False)
    residual = predictions[0].forces
    ph.forces = np.array([p.forces - residual for p in predictions[1:]])
    ph.produce_force_constants()
    ph.symmetrize_force_constants()

    band = _band_structure(ph, npoints)
    ph.run_mesh(_mesh(mesh), is_gamma_center=True)
    ph.run_total_dos()
    frequency_points, total_dos = _phonopy_result(ph, "total_dos", ("frequency_points", "dos"),
                                                  "get_total_dos_dict", ("frequency_points", "total_dos"))
    dos = {"frequencies": frequency_points, "total_dos": total_dos}
    thermal_kwargs = {}
    if "exclude_gamma_acoustic" in inspect.signature(ph.run_thermal_properties).parameters:
        thermal_kwargs["exclude_gamma_acoustic"] = True  # the mesh is Γ-centred; ν = 0 modes carry no heat
    ph.run_thermal_properties(t_min=t_min, t_max=t_max, t_step=t_step, **thermal_kwargs)
    keys = ("temperatures", "free_energy", "entropy", "heat_capacity")
    thermal = dict(zip(keys, _phonopy_result(ph, "thermal_properties", keys, "get_thermal_properties_dict", keys)))
    (mesh_freq,) = _phonopy_result(ph, "mesh", ("frequencies",), "get_mesh_dict", ("frequencies",))
    result = PhononResult(name=name, supercell=list(reps), band=band, dos=dos, thermal=thermal,
                          min_frequency=float(min(np.min(mesh_freq), np.min(band["frequencies"]))), phonopy=ph)
    if plot is not None:
        result.plot = save_figure(phonon_figure(result), plot)
    if save is not None:
        result.saved = _save(ph, Path(save))
    return result


def _supercell(atoms, supercell, min_length) -> list[int]:
    if supercell is None:
        lengths = atoms.cell.lengths()
        return [int(np.ceil(min_length / length)) for length in lengths]
    reps = [supercell] * 3 if isinstance(supercell, int) else list(supercell)
    if len(reps) != 3 or not all(isinstance(r, (int, np.integer)) and r >= 1 for r in reps):
        raise MatRISInputError(f"supercell must be one or three positive integers, got {supercell!r}")
    return [int(r) for r in reps]


def _mesh(mesh) -> list[int]:
    m = [mesh] * 3 if isinstance(mesh, int) else list(mesh)
    if len(m) != 3 or not all(isinstance(x, (int, np.integer)) and x >= 1 for x in m):
        raise MatRISInputError(f"mesh must be one or three positive integers, got {mesh!r}")
    return [int(x) for x in m]


def _band_structure(ph, npoints: int) -> dict:
    """Frequencies along ASE's high-symmetry path of phonopy's primitive cell."""
    from ase.cell import Cell

    path = Cell(np.asarray(ph.primitive.cell)).bandpath(npoints=npoints)
    distances, positions, names = path.get_linear_kpoint_axis()
    label_positions, labels = [], []
    for x, name in zip(positions, names):  # a path break puts two points at one place: "K|U"
        if label_positions and abs(x - label_positions[-1]) < 1e-9:
            labels[-1] += "|" + name
        else:
            label_positions.append(x)
            labels.append(name)
    ph.run_qpoints(path.kpts)
    (freqs,) = _phonopy_result(ph, "qpoints", ("frequencies",), "get_qpoints_dict", ("frequencies",))
    return {"distances": np.asarray(distances), "frequencies": freqs, "labels": list(labels),
            "label_positions": np.asarray(label_positions), "qpoints": np.asarray(path.kpts), "path": path.path}


def _phonopy_result(ph, prop: str, attrs: tuple, getter: str, keys: tuple) -> list[np.ndarray]:
    """Arrays of a phonopy result: the result object's attributes (phonopy ≥ 3), else the
    older (now deprecated) ``get_*_dict()``."""
    obj = getattr(ph, prop, None)
    if obj is not None and all(getattr(obj, a, None) is not None for a in attrs):
        return [np.asarray(getattr(obj, a)) for a in attrs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        d = getattr(ph, getter)()
    return [np.asarray(d[k]) for k in keys]


def _save(ph, path: Path) -> Path:
    with atomic_path(path, suffix=".yaml") as tmp:
        ph.save(filename=str(tmp), settings={"force_constants": True})
    return path
