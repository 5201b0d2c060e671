"""The κ task's protocol (matris.discovery.kappa) on diamond Si with the bundled model: a cubic,
finite κ whose mode resolution adds up to it, the symmetry kept and recorded, the displaced
supercells evaluated in batches."""

import numpy as np
import pytest
from ase.build import bulk

from matris import MatRIS
from matris.discovery import kappa as K
from matris.discovery.kappa_metrics import kappa_metrics

pytest.importorskip("phono3py")


@pytest.fixture(scope="module")
def si_kappa():
    model = MatRIS.load("matris-demo", dtype="float64")
    calls = []
    predict = model.predict

    def counted(structures, **kw):
        calls.append((len(structures), kw["batch_size"]))
        return predict(structures, **kw)

    model.predict = counted
    atoms = bulk("Si", "diamond", a=5.45)  # a little off the model's lattice constant: the relaxation moves it
    result = K.thermal_conductivity(atoms, model, [2, 2, 2], [2, 2, 2], (7, 7, 7), K.KappaProtocol(batch_size=8))
    return result, calls


@pytest.mark.slow
def test_silicon_kappa_is_cubic_and_its_modes_add_up(si_kappa):
    result, calls = si_kappa
    r = result.record
    kappa = np.asarray(r.kappa)[0]
    assert np.isfinite(kappa).all() and kappa[0] > 1.0
    assert kappa[0] == pytest.approx(kappa[1], rel=1e-8) == pytest.approx(kappa[2], rel=1e-8)
    assert np.abs(kappa[3:]).max() < 1e-8 * kappa[0]
    # each mode's share (particle-like plus its part of the coherence terms) adds up to κ
    np.testing.assert_allclose(r.mode_kappa.sum(axis=(1, 2))[0] / r.weights.sum(), kappa, rtol=1e-10, atol=1e-12)
    assert r.spg_initial == r.spg_final == 227 and not r.has_imaginary and result.relax_steps > 0
    # the displaced supercells went through the model in batches of 8
    assert sum(n for n, _ in calls) == result.n_displacements and all(b == 8 for _, b in calls)
    # a prediction scored against itself: SRME 0
    assert kappa_metrics({"si": r}, {"si": r})["kappa_SRME"] == 0.0


@pytest.mark.slow
def test_a_broken_symmetry_and_imaginary_modes_are_recorded(monkeypatch, si_kappa):
    model = MatRIS.load("matris-demo", dtype="float64")
    atoms = bulk("Si", "diamond", a=5.45)
    # a relaxation that lowers the symmetry (an atom moved): recorded, and SRME counts it as failed
    moved = atoms.copy()
    moved.positions[0] += [0.05, 0.0, 0.0]
    monkeypatch.setattr(K, "relax_with_symmetry", lambda a, calc, p: (moved.copy(), 1))
    r = K.thermal_conductivity(atoms, model, [1, 1, 1], [1, 1, 1], (3, 3, 3)).record
    assert r.spg_initial == 227 and r.spg_final != 227
    reference = si_kappa[0].record
    assert kappa_metrics({"si": r}, {"si": reference}, {"si": 227})["per_material"]["si"]["SRME"] == 2.0
