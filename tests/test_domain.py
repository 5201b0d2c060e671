"""MatRIS on a domain decomposition (matris.domain), every rank in one process: the same energies,
per-atom energies, forces and stress as the whole-system calculator in float64, for subdomains
thinner than one bond, triclinic cells, element mixes, slabs and cells smaller than the cutoff;
and every exchange of every block is needed."""

from __future__ import annotations

import numpy as np
import pytest
from ase.build import bulk, fcc100

from matris import MatRIS, MatRISCalculator
from matris.domain import EXCHANGES
from matris.lammps.ranks import simulate


@pytest.fixture(scope="module")
def model():
    return MatRIS.load("matris-demo", dtype="float64")


def reference(model, atoms):
    atoms = atoms.copy()
    atoms.calc = MatRISCalculator(model)
    stress = atoms.get_stress() if atoms.pbc.all() else None
    return atoms.get_potential_energy(), atoms.get_potential_energies(), atoms.get_forces(), stress


def check(model, atoms, grid, rel=1e-11):
    e, ea, f, s = reference(model, atoms)
    out = simulate(model, atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers, grid=grid)
    assert len(out["ranks"]) == int(np.prod(grid)) and sum(out["ranks"]) == len(atoms)
    assert abs(out["energy"] - e) <= rel * abs(e)
    assert np.abs(out["atomic"] - ea).max() <= rel * np.abs(ea).max()
    assert np.abs(out["forces"] - f).max() <= rel * np.abs(f).max()
    if s is not None:
        assert np.abs(out["stress"] - s).max() <= rel * np.abs(s).max()
    return out


@pytest.mark.parametrize("grid", [(1, 1, 1), (2, 1, 1), (4, 1, 1), (2, 2, 2), (8, 1, 1)])
def test_thin_subdomains_of_a_triclinic_element_mix(model, grid):
    atoms = bulk("NaCl", "rocksalt", a=5.5, cubic=True) * (2, 1, 1)
    atoms.set_cell(atoms.cell.array + np.array([[0, 0.3, 0.2], [0.4, 0, 0], [0.1, -0.3, 0]]), scale_atoms=True)
    atoms.rattle(0.05, seed=3)
    # (8, 1, 1): slabs 1.4 Å thick, thinner than a bond (r_c = 5 Å) and than a block's reach
    check(model, atoms, grid)


def test_a_cell_smaller_than_the_cutoff_and_a_slab(model):
    small = bulk("Si", "diamond", a=5.43)  # 3.8 Å edges: many images of each atom on each rank
    small.rattle(0.05, seed=5)
    check(model, small, (2, 1, 1))
    check(model, small, (1, 3, 1))  # a rank without atoms
    slab = fcc100("Cu", size=(2, 2, 3), vacuum=6.0)  # open along z
    slab.rattle(0.03, seed=4)
    check(model, slab, (2, 2, 1))


def test_a_rank_without_angles_in_a_structure_with_angles(model):
    # a tight Cu4 tetrahedron (2.5 Å bonds, angles) on the left rank; on the right rank atoms
    # 4–4.5 Å apart: bonds, but none shorter than r_3 = 3 Å, so that rank has no angle at all
    left = np.array([[3.0, 3.0, 3.0], [5.5, 3.0, 3.0], [4.25, 5.17, 3.0], [4.25, 3.72, 5.04]])
    right = np.array([[12.0, 2.0, 2.0], [16.0, 2.5, 2.0], [12.5, 6.5, 2.0], [16.5, 6.0, 6.2]])
    from ase import Atoms

    atoms = Atoms("Cu8", positions=np.concatenate([left, right]), cell=[20.0, 9.0, 9.0], pbc=True)
    out = check(model, atoms, (2, 1, 1))
    assert out["ranks"] == [4, 4]


@pytest.mark.parametrize("block", [0, 2])
def test_every_exchange_is_needed(model, block):
    atoms = bulk("Si", "diamond", a=5.43, cubic=True) * (2, 1, 1)
    atoms.rattle(0.05, seed=2)
    e, _, f, _ = reference(model, atoms)
    for step in EXCHANGES:
        if block == len(model.interaction_block) - 1 and step == "atom_refine":
            continue  # after the last block only owned atoms are read
        out = simulate(model, atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers, grid=(2, 1, 1),
                       skip=(block, step))
        assert abs(out["energy"] - e) > 1e-8 or np.abs(out["forces"] - f).max() > 1e-8, step


def test_float32_agrees_to_float32_rounding():
    model = MatRIS.load("matris-demo", dtype="float32")
    atoms = bulk("Si", "diamond", a=5.43, cubic=True)
    atoms.rattle(0.05, seed=2)
    e, _, f, _ = reference(model, atoms)
    out = simulate(model, atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers, grid=(2, 1, 1))
    assert abs(out["energy"] - e) <= 1e-5 * abs(e)
    assert np.abs(out["forces"] - f).max() <= 1e-4


def test_the_graph_moves_to_the_models_device(model):
    """The graph is built on the host; evaluate moves its indices to the model's device (cuda:<local
    rank> in LAMMPS), every index tensor of it."""
    import torch

    from matris.domain import build_graphs
    from matris.lammps.ranks import split_system

    atoms = bulk("Si", "diamond", a=5.43, cubic=True)
    domains, comm = split_system(atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers, (2, 1, 1), 6.0)
    graphs = build_graphs(domains, comm, torch.as_tensor(atoms.cell.array), model.cutoff, model.three_body_cutoff)
    moved = graphs[0].to(torch.device("meta"))
    tensors = [v for v in vars(moved).values() if isinstance(v, torch.Tensor)]
    assert len(tensors) >= 12 and all(t.device.type == "meta" for t in tensors)
    assert moved.n_slots == graphs[0].n_slots and moved.domain is graphs[0].domain
