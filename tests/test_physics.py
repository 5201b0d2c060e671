"""Symmetries, extensivity, and forces/stress as derivatives of the energy (float64)."""

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from conftest import evaluate, random_system
from matris import AtomicSystem
from matris.model.model import EV_PER_A3_TO_GPA


@pytest.fixture(scope="module")
def system():
    return random_system(np.random.default_rng(42), n=6, a=4.3)


def _eval(model, s, **kw):
    out, _ = evaluate(model, [s], **kw)
    return out.energy.item(), out.forces.numpy(), out.stress[0].numpy(), out.magmoms.numpy()


@pytest.mark.parametrize("model_name", ["model64", "fourier64"])
def test_rotation_translation_permutation(request, model_name, system):
    model = request.getfixturevalue(model_name)
    e, f, s, m = _eval(model, system)
    rot = Rotation.random(random_state=3).as_matrix()
    rotated = AtomicSystem(system.positions @ rot.T, system.cell @ rot.T, True, system.atomic_numbers)
    e2, f2, s2, m2 = _eval(model, rotated)
    assert abs(e2 - e) < 1e-10
    np.testing.assert_allclose(f2, f @ rot.T, atol=1e-10)
    np.testing.assert_allclose(s2, rot @ s @ rot.T, atol=1e-9)
    np.testing.assert_allclose(m2, m, atol=1e-12)

    shifted = AtomicSystem(system.positions + np.array([0.37, -1.2, 5.1]), system.cell, True, system.atomic_numbers)
    e3, f3, s3, _ = _eval(model, shifted)
    assert abs(e3 - e) < 1e-10
    np.testing.assert_allclose(f3, f, atol=1e-10)
    np.testing.assert_allclose(s3, s, atol=1e-9)

    perm = np.random.default_rng(0).permutation(system.num_atoms)
    permuted = AtomicSystem(system.positions[perm], system.cell, True, system.atomic_numbers[perm])
    e4, f4, s4, m4 = _eval(model, permuted)
    assert abs(e4 - e) < 1e-10
    np.testing.assert_allclose(f4, f[perm], atol=1e-10)
    np.testing.assert_allclose(m4, m[perm], atol=1e-12)


def test_wrapping_atoms_into_cell_changes_nothing(model64, system):
    frac = np.linalg.solve(system.cell.T, system.positions.T).T
    wrapped = AtomicSystem((frac % 1.0) @ system.cell, system.cell, True, system.atomic_numbers)
    e, f, s, _ = _eval(model64, system)
    e2, f2, s2, _ = _eval(model64, wrapped)
    assert abs(e - e2) < 1e-10
    np.testing.assert_allclose(f2, f, atol=1e-10)


def test_supercell_is_extensive(model64, system):
    e, f, s, m = _eval(model64, system)
    reps = [system.positions + n * system.cell[0] for n in range(2)]
    sc = AtomicSystem(np.concatenate(reps), system.cell * np.array([[2], [1], [1]]), True,
                      np.tile(system.atomic_numbers, 2))
    e2, f2, s2, m2 = _eval(model64, sc)
    assert abs(e2 - 2 * e) < 1e-9
    np.testing.assert_allclose(f2, np.concatenate([f, f]), atol=1e-9)
    np.testing.assert_allclose(s2, s, atol=1e-8)
    np.testing.assert_allclose(m2, np.concatenate([m, m]), atol=1e-10)


def test_forces_are_finite_differences_of_energy(model64, system):
    _, f, _, _ = _eval(model64, system)
    h = 1e-5
    for atom, k in [(0, 0), (2, 1), (5, 2), (3, 0)]:
        energies = []
        for sign in (1, -1):
            pos = system.positions.copy()
            pos[atom, k] += sign * h
            energies.append(_eval(model64, AtomicSystem(pos, system.cell, True, system.atomic_numbers))[0])
        assert abs(-(energies[0] - energies[1]) / (2 * h) - f[atom, k]) < 1e-6


def test_stress_is_finite_difference_of_energy(model64, system):
    _, _, s, _ = _eval(model64, system)
    h = 1e-5
    volume = abs(np.linalg.det(system.cell))
    for i, j in [(0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (0, 2)]:
        energies = []
        for sign in (1, -1):
            eps = np.zeros((3, 3))
            eps[i, j] += sign * h / 2
            eps[j, i] += sign * h / 2
            deform = np.eye(3) + eps
            strained = AtomicSystem(system.positions @ deform, system.cell @ deform, True, system.atomic_numbers)
            energies.append(_eval(model64, strained)[0])
        fd = (energies[0] - energies[1]) / (2 * h) / volume * EV_PER_A3_TO_GPA
        assert abs(fd - s[i, j]) < 1e-5, (i, j, fd, s[i, j])


def test_smooth_inside_the_cutoffs(model64):
    """Energy is differentiable while no neighbour crosses a cutoff: its finite-difference
    derivative along a path agrees with the forces at every point of the path."""
    base = np.array([[0.0, 0, 0], [2.3, 0, 0], [0.2, 2.4, 0.3]])
    def run(x):
        pos = base.copy()
        pos[1, 0] = x
        out, _ = evaluate(model64, [AtomicSystem(pos, np.zeros((3, 3)), False, [14, 14, 8])], compute_stress=False)
        return out.energy.item(), out.forces.numpy()[1, 0]
    for x in np.linspace(2.0, 3.8, 7):
        (ep, _), (em, _) = run(x + 1e-5), run(x - 1e-5)
        assert abs(-(ep - em) / 2e-5 - run(x)[1]) < 1e-6


def _dimer_plus(model, third_y):
    pos = np.array([[0.0, 0, 0], [2.5, 0, 0], [0, third_y, 0]])
    out, g = evaluate(model, [AtomicSystem(pos, np.zeros((3, 3)), False, [14, 14, 14])], compute_stress=False)
    return out.energy.item(), out.forces.numpy(), g


def test_behaviour_as_a_neighbour_crosses_the_cutoffs(model64):
    """What the published architecture does at r_c and r_3, pinned.

    At r_c the Bessel envelope makes the force on the crossing atom vanish from both sides,
    but the energy and the other atoms' forces step: the attention weights bonds by a
    softmax that does not go to zero with the bond length, so a bond at r_c still takes its
    share. At r_3 the line graph gains or loses angles, and energy and forces step. These steps
    are properties of the reference model (matching it is the contract); this test checks they
    are clean steps (independent of how close to the cutoff we look), not numerical noise or a
    spike.
    """
    rc, r3 = model64.cutoff, model64.three_body_cutoff
    jumps = {}
    for d in (1e-4, 1e-7):
        ei, fi, gi = _dimer_plus(model64, rc - d)
        eo, fo, go = _dimer_plus(model64, rc + d)
        assert 2 * gi.num_bonds == 2 * go.num_bonds + 2  # the third atom's bond to atom 0 appears
        assert np.abs(fi[2] - fo[2]).max() < 1e-3 * (d / 1e-4)  # the crossing atom's force → 0
        jumps.setdefault("rc", []).append(ei - eo)
        jumps.setdefault("rc_forces", []).append(np.abs(fi - fo).max())
        ei, fi, gi = _dimer_plus(model64, r3 - d)
        eo, fo, go = _dimer_plus(model64, r3 + d)
        assert gi.num_angles > go.num_angles
        jumps.setdefault("r3", []).append(ei - eo)
    for key, (far, near) in jumps.items():
        assert abs(far - near) < 1e-3 * max(1.0, abs(near)), (key, far, near)
    # the steps are real and of the size docs/contract.md documents for this fixture and trimer
    assert jumps["rc"][-1] == pytest.approx(0.45830, abs=1e-4)  # eV, third atom crossing r_c
    assert jumps["rc_forces"][-1] == pytest.approx(0.09637, abs=1e-4)  # eV/Å, largest force change
    assert jumps["r3"][-1] == pytest.approx(-0.09607, abs=1e-4)  # eV, crossing r_3 (the last angles go)
    _, fi, _ = _dimer_plus(model64, r3 - 1e-7)
    _, fo, _ = _dimer_plus(model64, r3 + 1e-7)
    assert np.abs(fi - fo).max() == pytest.approx(0.1904, abs=1e-3)  # eV/Å at r_3
