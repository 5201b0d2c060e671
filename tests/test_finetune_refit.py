"""Fine-tuning fits the user's energies (issue 65, items 1 and 2): the reference energies are
refitted on what the pretrained model does not predict, before the first step; magnetic moments the
base predicted and the fine-tune cannot keep are said to be dropped, once, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from matris.train.reference import refit_reference_energies

ROOT = Path(__file__).resolve().parent.parent


def _rows(compositions, labels, bare):
    comp = np.zeros((len(compositions), 94))
    for k, counts in enumerate(compositions):
        for z, n in counts.items():
            comp[k, z - 1] = n
    labels, bare = np.asarray(labels, float), np.asarray(bare, float)
    return comp, labels, bare


def test_refit_absorbs_the_offset_and_keeps_absent_elements():
    current = np.zeros(94)
    current[[28, 7, 0]] = [-1.0, -2.0, -3.0]  # Cu, O, H
    # Cu and O structures whose labels sit 0.5 and 0.2 eV/atom above what the network predicts
    comp, labels, bare = _rows([{29: 4}, {29: 2, 8: 2}, {29: 8}, {8: 3}],
                               [4 * 0.5 + 1.0, 2 * 0.5 + 2 * 0.2, 8 * 0.5 - 0.4, 3 * 0.2], [1.0, 0.0, -0.4, 0.0])
    full = bare + comp @ current / comp.sum(1) * comp.sum(1)  # the model's energy with its current references
    nan = np.array([np.nan])
    batches = [(comp[:2], labels[:2], bare[:2], full[:2]), (comp[2:], labels[2:], bare[2:], full[2:]),
               (comp[:1], nan, bare[:1], full[:1])]  # an unlabelled structure is skipped
    refit = refit_reference_energies(iter(batches), current)
    np.testing.assert_allclose(refit.values[[28, 7]], [0.5, 0.2], atol=1e-12)
    assert refit.values[0] == -3.0 and np.count_nonzero(refit.values) == 3  # H keeps its value
    assert refit.elements == ["O", "Cu"]
    np.testing.assert_allclose(refit.shifts, [2.2, 1.5], atol=1e-12)
    assert refit.mae_after < 1e-12 < refit.mae_before and refit.n_structures == 4
    assert "refitted the reference energies of 2 elements on 4 training structures" in refit.summary()
    assert "O +2.2000, Cu +1.5000" in refit.summary() and "-> 0.0 meV/atom" in refit.summary()
    with pytest.raises(ValueError, match="no training structure has an energy label"):
        refit_reference_energies(iter([(comp[:1], nan, bare[:1], full[:1])]), current)


@pytest.mark.slow
def test_finetune_fits_the_users_energies_from_the_cli(tmp_path):
    """The first fine-tune of a new user: the bundled model on six 32-atom rattled Cu cells labelled
    by ASE's EMT, as the docs write the command. Before the refit the model missed their energies by
    ~510 meV/atom after 3 steps (the per-element fit on composition ignored what the network predicts)."""
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.io import write

    from matris import MatRISCalculator

    frames = []
    for k in range(6):
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
        atoms.rattle(0.05, seed=k)
        atoms.calc = EMT()
        energy, forces, stress = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces, stress=stress)
        frames.append(atoms)
    write(tmp_path / "cu_emt.extxyz", frames)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-m", "matris", "finetune", "--from", "matris-demo", "--config", "finetune",
                          "--data.train", "cu_emt.extxyz", "--trainer.max_steps", "3"],
                         cwd=tmp_path, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "refitted the reference energies of 1 element on 5 training structures" in res.stderr
    assert "energy MAE on them" in res.stderr
    # the bundled model predicts magnetic moments; EMT labels have none: the run says once that they go, and why
    assert res.stderr.count("will not offer magnetic moments, which its starting model predicted: the training "
                            "data has no magnetic-moment labels") == 1
    calc = MatRISCalculator(str(tmp_path / "runs" / "finetune" / "best_model.pth.tar"))
    errors = []
    for atoms in frames:
        label = atoms.get_potential_energy()
        copy = atoms.copy()
        copy.calc = calc
        errors.append(abs(copy.get_potential_energy() - label) / len(atoms))
    assert 1000 * np.mean(errors) <= 30, f"{1000 * np.mean(errors):.1f} meV/atom on its own training cells"
