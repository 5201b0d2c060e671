"""Bad input raises MatRISInputError naming the structure and the problem; dilute systems are valid."""

import numpy as np
import pytest
import torch
from ase import Atoms

from conftest import evaluate
from matris import AtomicSystem, GraphBatch, MatRIS, MatRISInputError


@pytest.fixture(scope="module")
def model():
    return MatRIS.load(dtype=torch.float64)


def good():
    return Atoms("Si2", positions=[[0, 0, 0], [1.36, 1.36, 1.36]], cell=np.eye(3) * 5.43, pbc=True)


def _raises(model, atoms, *words):
    with pytest.raises(MatRISInputError) as info:
        model.predict([good(), atoms])
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "structure 1" in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_unknown_elements(model):
    a = good()
    a.numbers[1] = 95
    _raises(model, a, "Am", "Z=95", "1 (H) to 94")
    a.numbers[1] = 0
    _raises(model, a, "Z=0")


def test_nan_and_infinite(model):
    a = good()
    a.positions[1, 2] = np.nan
    _raises(model, a, "atom 1", "NaN")
    b = good()
    b.cell[0, 0] = np.inf
    _raises(model, b, "cell", "infinite")


def test_empty_structure(model):
    _raises(model, Atoms(cell=np.eye(3) * 4, pbc=True), "empty")


def test_degenerate_cell(model):
    a = good()
    a.cell = [[4, 0, 0], [8, 0, 0], [0, 0, 4]]
    _raises(model, a, "degenerate")
    # the same cell is fine along non-periodic directions
    a.pbc = [True, False, True]
    a.cell = [[4, 0, 0], [0, 0, 0], [0, 0, 4]]
    flat = model.predict(a)
    # a non-periodic direction's cell vector changes nothing: the energy of any other vector there
    b = a.copy()
    b.cell = [[4, 0, 0], [0, 7, 0], [0, 0, 4]]
    assert np.isfinite(flat.energy) and abs(flat.energy - model.predict(b).energy) < 1e-9
    np.testing.assert_allclose(flat.forces, model.predict(b).forces, atol=1e-9)


def test_atoms_too_close(model):
    a = good()
    a.positions[1] = [0.05, 0, 0]
    _raises(model, a, "atoms 0 and 1", "0.0500 Å", "0.1")


def test_not_a_structure(model):
    with pytest.raises(MatRISInputError, match="ase.Atoms or pymatgen"):
        model.predict(["POSCAR"])


def test_error_names_structure_in_graph_builder():
    s = AtomicSystem(np.zeros((2, 3)), np.eye(3) * 5, True, [1, 1], name="dimer")
    with pytest.raises(MatRISInputError, match=r"structure 0 \(dimer\)"):
        GraphBatch.from_systems([s], 5.0, 3.0)


@pytest.mark.filterwarnings("ignore::matris.errors.MatRISInputWarning")  # valid, and warned: it sees no neighbour
def test_isolated_atom_is_valid(model):
    """No neighbour within r_c: the embedding-only energy and zero force (the reference errors)."""
    lone = Atoms("Fe", positions=[[1, 1, 1]], cell=np.eye(3) * 20, pbc=True)
    p = model.predict(lone)
    assert np.isfinite(p.energy) and np.all(p.forces == 0)
    np.testing.assert_allclose(p.stress, 0, atol=1e-12)
    # a dilute gas: two atoms further apart than r_c, and the same atom batched with others
    gas = Atoms("Fe2", positions=[[0, 0, 0], [10, 10, 10]], cell=np.eye(3) * 25, pbc=True)
    pg = model.predict(gas)
    assert abs(pg.energy - 2 * p.energy) < 1e-10
    batch = model.predict([good(), lone, gas])
    assert abs(batch[1].energy - p.energy) < 1e-10
    assert abs(batch[2].energy - pg.energy) < 1e-10


def test_structure_without_angles_batched_with_others(model):
    """Line-graph steps are skipped per structure, so batching never changes a result."""
    dimer = Atoms("Si2", positions=[[0, 0, 0], [2.3, 0, 0]], cell=np.eye(3) * 30, pbc=False)
    alone = model.predict(dimer)
    batched = model.predict([good(), dimer], batch_size=2)[1]
    assert abs(alone.energy - batched.energy) < 1e-10
    np.testing.assert_allclose(alone.forces, batched.forces, atol=1e-10)


def test_model_evaluates_edge_free_graph(model):
    s = AtomicSystem(np.zeros((1, 3)), np.zeros((3, 3)), False, [8])
    out, g = evaluate(model, [s])
    assert g.num_bonds == 0 and torch.isnan(out.stress).all() and out.forces.abs().sum() == 0
