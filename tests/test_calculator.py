"""ASE calculator and batched prediction."""

import numpy as np
import pytest
import torch
from ase import Atoms, units
from ase.build import bulk, molecule
from ase.md.verlet import VelocityVerlet
from pymatgen.core import Lattice, Molecule, Structure

from matris import MatRIS, MatRISCalculator
from matris.bundled import DEMO_CHECKPOINT


@pytest.fixture(scope="module")
def model():
    return MatRIS.load(dtype=torch.float64)


def rattled_si(seed=0):
    a = bulk("Si", "diamond", a=5.43, cubic=True)
    a.rattle(0.05, seed=seed)
    return a


def test_calculator_properties_and_units(model):
    atoms = rattled_si()
    atoms.calc = MatRISCalculator(model, dtype="float64")
    p = model.predict(atoms)
    assert atoms.get_potential_energy() == pytest.approx(p.energy, abs=1e-10)
    assert atoms.get_potential_energy(force_consistent=True) == pytest.approx(p.energy, abs=1e-10)
    np.testing.assert_allclose(atoms.get_forces(), p.forces, atol=1e-10)
    voigt = atoms.get_stress()
    full = atoms.get_stress(voigt=False)
    np.testing.assert_allclose(full / units.GPa, p.stress, atol=1e-8)
    assert voigt.shape == (6,)
    np.testing.assert_allclose(atoms.get_magnetic_moments(), p.magmoms, atol=1e-12)


def test_calculator_does_not_modify_atoms(model):
    atoms = rattled_si()
    atoms.positions += 7.3  # outside the cell
    before = atoms.copy()
    atoms.calc = MatRISCalculator(model)
    atoms.get_forces()
    atoms.get_stress()
    assert atoms == before
    assert np.array_equal(atoms.positions, before.positions)
    assert set(atoms.arrays) == set(before.arrays) and atoms.info == before.info


def test_calculator_accepts_path_and_default(model):
    atoms = rattled_si()
    e_default = MatRISCalculator().get_potential_energy(atoms)
    e_path = MatRISCalculator(str(DEMO_CHECKPOINT)).get_potential_energy(atoms)
    e_obj = MatRISCalculator(model, dtype="float32").get_potential_energy(atoms)
    assert e_default == e_path
    assert abs(e_obj - e_default) < 1e-4
    assert model.dtype == torch.float64  # the caller's model is not converted in place


def test_molecule_has_no_stress():
    m = molecule("CH4")
    m.calc = MatRISCalculator()
    assert np.isfinite(m.get_potential_energy())
    from ase.calculators.calculator import PropertyNotImplementedError

    with pytest.raises(PropertyNotImplementedError):
        m.get_stress()


def test_md_runs_and_conserves_energy_roughly():
    atoms = rattled_si(1)
    atoms.calc = MatRISCalculator(dtype="float64")
    dyn = VelocityVerlet(atoms, timestep=0.5 * units.fs)
    e0 = atoms.get_total_energy()
    dyn.run(10)
    assert abs(atoms.get_total_energy() - e0) < 1e-3 * len(atoms)


def test_pymatgen_and_ase_agree(model):
    atoms = rattled_si(2)
    structure = Structure(Lattice(atoms.cell[:]), atoms.get_chemical_symbols(), atoms.positions,
                          coords_are_cartesian=True)
    pa, ps = model.predict([atoms, structure])
    assert abs(pa.energy - ps.energy) < 1e-10
    np.testing.assert_allclose(pa.forces, ps.forces, atol=1e-10)
    mol = Molecule(["O", "H", "H"], [[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
    pm = model.predict(mol)
    assert pm.stress is None and pm.forces.shape == (3, 3)


def test_batch_size_does_not_change_results(model):
    structures = [rattled_si(k) for k in range(3)] + [molecule("H2O"), bulk("Cu", "fcc", a=3.6)]
    one = model.predict(structures, batch_size=1)
    many = model.predict(structures, batch_size=4)
    for a, b in zip(one, many):
        assert abs(a.energy - b.energy) < 1e-10
        np.testing.assert_allclose(a.forces, b.forces, atol=1e-10)


def test_batch_that_runs_out_of_memory_is_split(model, monkeypatch):
    import matris.predict as predict_module

    calls = []
    real_run = predict_module._run

    def fake_run(m, systems, offset, options):
        calls.append(len(systems))
        if len(systems) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_run(m, systems, offset, options)

    monkeypatch.setattr(predict_module, "_run", fake_run)
    structures = [rattled_si(k) for k in range(4)]
    preds = model.predict(structures, batch_size=4)
    monkeypatch.undo()
    assert len(preds) == 4 and calls[0] == 4 and max(calls[1:]) <= 2
    ref = model.predict(structures, batch_size=1)
    for a, b in zip(preds, ref):
        assert abs(a.energy - b.energy) < 1e-10


def test_single_structure_oom_is_reported(model, monkeypatch):
    import matris.predict as predict_module

    def fake_run(m, systems, offset, options):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(predict_module, "_run", fake_run)
    with pytest.raises(MemoryError, match="does not fit in memory"):
        model.predict([rattled_si()])


def test_progress_bar_on_long_lists(model, capsys):
    atoms = Atoms("H2", positions=[[0, 0, 0], [0.74, 0, 0]])
    preds = model.predict([atoms] * 3, progress=True)
    assert len(preds) == 3
    assert "MatRIS predict" in capsys.readouterr().err


def test_prediction_to_dict(model):
    d = model.predict(rattled_si()).to_dict()
    assert set(d) == {"name", "energy", "energy_per_atom", "forces", "stress_GPa", "magmoms", "atomic_energies"}
    assert sum(d["atomic_energies"]) == pytest.approx(d["energy"], abs=1e-5)
    assert len(d["forces"]) == 8


def test_bad_device_and_dtype_are_clear():
    from matris import MatRISInputError

    with pytest.raises(MatRISInputError, match="float32"):
        MatRISCalculator(dtype="float16")
    if not torch.cuda.is_available():
        with pytest.raises(MatRISInputError, match="no CUDA GPU"):
            MatRISCalculator(device="cuda")
    with pytest.raises(MatRISInputError, match="unknown device"):
        MatRISCalculator(device="gpu0")


@pytest.mark.slow
def test_quickstart_example_runs():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "examples" / "quickstart.py"
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "NaCl" in res.stdout and "Si8 energy" in res.stdout
