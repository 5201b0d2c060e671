"""Per-atom energies: they partition the energy, follow the atoms, and show how far the model sees."""

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule

from conftest import FIXTURES, load_fixture_model
from matris import GraphBatch, MatRIS, MatRISCalculator
from matris.structures import to_system

FLOAT64_FOLDERS = ["small_sh_float64", "small_fourier_float64", "mixed_widths_float64"]
TINY = FIXTURES.parent / "random-tiny.pth.tar"


def _structures():
    si = bulk("Si", "diamond", a=5.43, cubic=True)
    si.rattle(0.05, seed=1)
    nacl = bulk("NaCl", "rocksalt", a=5.64) * (2, 1, 1)
    return [si, nacl, molecule("H2O")]


@pytest.mark.parametrize("folder", FLOAT64_FOLDERS)
def test_atomic_energies_sum_to_the_energy_in_a_batch(folder):
    model = load_fixture_model(folder)
    structures = _structures()
    for a in structures:  # fixture models cover few elements: only what they take
        a.numbers = np.where(a.numbers > 20, 14, a.numbers)
    g = GraphBatch.from_systems([to_system(a) for a in structures], model.cutoff, model.three_body_cutoff,
                                dtype=torch.float64)
    out = model(g, compute_atomic_energies=True)
    sums = torch.zeros_like(out.energy).index_add(0, g.atom_batch, out.atomic_energies)
    assert torch.allclose(sums, out.energy, rtol=0, atol=1e-10 * float(out.energy.abs().max()))
    alone = model(GraphBatch.from_systems([to_system(structures[0])], model.cutoff, model.three_body_cutoff,
                                          dtype=torch.float64), compute_atomic_energies=True)
    n0 = len(structures[0])
    assert torch.allclose(alone.atomic_energies, out.atomic_energies[:n0], rtol=0, atol=1e-12)


def test_calculator_and_predict_give_per_atom_energies():
    model = MatRIS.load("matris-demo", dtype="float64")
    atoms = _structures()[0]
    atoms.calc = MatRISCalculator(model)
    energies = atoms.get_potential_energies()
    assert energies.shape == (len(atoms),)
    assert energies.sum() == pytest.approx(atoms.get_potential_energy(), abs=1e-9)
    p = model.predict(atoms)
    assert np.allclose(p.atomic_energies, energies, atol=1e-10)
    assert "atomic_energies" in p.to_dict()
    # atoms follow a permutation
    order = np.random.default_rng(0).permutation(len(atoms))
    q = model.predict(atoms[order])
    assert np.allclose(q.atomic_energies, energies[order], atol=1e-10)


def _chain_atomic_energies(model, positions):
    atoms = Atoms("Si%d" % len(positions), positions=positions)
    g = GraphBatch.from_systems([to_system(atoms)], model.cutoff, model.three_body_cutoff, dtype=torch.float64)
    return model(g, compute_forces=False, compute_stress=False, compute_atomic_energies=True).atomic_energies.numpy()


def test_receptive_field_spans_several_bonds_per_block():
    """Information travels more than one bond per interaction block: the atom attention,
    then Refine with the neighbours' updated features, and the line graph's bond-to-bond
    messages each pass it on. On a zigzag chain whose atoms see only their nearest neighbours
    (all bonds short enough to form angles), moving the end atom changes the energies of atoms
    up to 5 bonds away with the 2-block fixture, and of none farther: the receptive field is
    2–3 bonds per block, not one (what a LAMMPS ghost shell or a domain decomposition must cover)."""
    model = MatRIS.load(TINY, dtype="float64")
    assert model.config.num_layers == 2
    spacing, n = 3.5, 16  # < r_3 = 4 Å; the second neighbour (7 Å) is beyond r_c = 6 Å
    pos = np.zeros((n, 3))
    pos[:, 0] = np.arange(n) * spacing
    pos[:, 1] = 0.3 * (np.arange(n) % 2)
    base = _chain_atomic_energies(model, pos)
    moved = pos.copy()
    moved[-1, 1] += 0.05
    changed = np.nonzero(np.abs(_chain_atomic_energies(model, moved) - base) > 1e-13)[0]
    reach = (n - 1) - changed.min()  # bonds between the moved atom and the farthest changed one
    assert reach == 5
    assert reach > model.config.num_layers  # more than one bond per block
