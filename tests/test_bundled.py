"""The bundled model (matris-demo): distilled from CHGNet 0.3.0, small, close to its teacher,
stable in MD. The held-out structures are CHGNet-labelled frames of prototype families that
were not in the training set (examples/distill/make_data.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.io import read
from ase.units import GPa

from matris import MatRIS
from matris.bundled import DEMO_CHECKPOINT, MODEL_CARD
from matris.pretrained import get_entry

HELD_OUT = Path(__file__).parent / "fixtures" / "chgnet_heldout.extxyz"
DISTILL = Path(__file__).parents[1] / "examples" / "distill"


@pytest.fixture(scope="module")
def model():
    return MatRIS.load()


def test_bundled_file_is_small_and_documented(model):
    assert DEMO_CHECKPOINT.stat().st_size < 5e6
    card = MODEL_CARD.read_text()
    for phrase in ("CHGNet 0.3.0", "matris-10m-oam", "examples/distill", "meV/atom"):
        assert phrase in card
    entry = get_entry("demo")
    assert entry.name == "matris-demo" and entry.bundled
    assert sum(p.numel() for p in model.parameters()) < 1.25e6  # float32 < 5 MB


def test_held_out_split_shares_no_prototype_family_with_training():
    """The split make_data.py wrote (examples/distill/split.json): test and train families are
    disjoint, the anchors are in training, no held-out family was in the previous model's
    training data, and every structure of the held-out fixture is from a held-out family."""
    import json

    split = json.loads((DISTILL / "split.json").read_text())
    test, train = set(split["test_families"]), set(split["train_families"])
    assert test and train and not test & train
    assert {"Si-diamond", "Cu-fcc", "NiO-rocksalt"} <= train
    previous = {ln.strip() for ln in (DISTILL / "previous_families.txt").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")}
    assert len(previous) > 500 and not test & previous
    frames = read(HELD_OUT, ":")
    assert {a.info["family"] for a in frames} <= test
    # MD snapshots and strained/substituted supercells carry their prototype's family (no "md-" families)
    assert not any(f.startswith("md-") for f in test | train)


def test_held_out_error_against_teacher(model):
    """64 structures of the held-out families (a seeded subset of make_data.py's test split)."""
    frames = read(HELD_OUT, ":")
    assert len(frames) >= 20
    preds = model.predict(frames, batch_size=16)
    de = np.mean([abs(p.energy_per_atom - a.get_potential_energy() / len(a)) for p, a in zip(preds, frames)])
    df = np.mean(np.concatenate([np.abs(p.forces - a.get_forces()).ravel() for p, a in zip(preds, frames)]))
    voigt = [0, 4, 8, 5, 2, 1]
    ds = np.mean(np.concatenate([np.abs(p.stress.reshape(-1)[voigt] - a.get_stress() / GPa)
                                 for p, a in zip(preds, frames)]))
    # measured on this subset: 0.181 eV/atom, 0.142 eV/Å, 2.25 GPa (the card: all 656 held-out structures)
    assert de < 0.22  # eV/atom (the previous bundled model: 0.40 on the whole split)
    assert df < 0.18  # eV/Å
    assert ds < 2.8  # GPa


def test_silicon_is_diamond_near_the_teacher_lattice(model):
    """CHGNet 0.3.0 puts diamond Si at a ≈ 5.47 Å; the student must have its minimum close."""
    scales = np.linspace(0.96, 1.04, 9)
    energies = []
    for s in scales:
        at = bulk("Si", "diamond", a=5.47 * s, cubic=True)
        energies.append(model.predict(at).energy_per_atom)
    a_min = 5.47 * scales[int(np.argmin(energies))]
    assert abs(a_min - 5.47) < 0.1
    # the EOS curvature is positive around the minimum (a real bulk modulus)
    assert energies[0] > min(energies) and energies[-1] > min(energies)


def test_lattice_constants_within_one_percent_of_the_teacher(model):
    """Si (diamond), Cu (fcc) and NiO (rocksalt): the model card's scan, against the teacher's
    values that make_data.py measured with the same fit (examples/distill/data_summary.json)."""
    import json
    import sys

    sys.path.insert(0, str(DISTILL))
    try:
        from lattices import lattice_constants
    finally:
        sys.path.remove(str(DISTILL))
    teacher = json.loads((DISTILL / "data_summary.json").read_text())["lattice_constants_A"]
    student = lattice_constants(lambda frames: [p.energy for p in model.predict(frames)])
    assert set(student) == set(teacher)
    for name, a in student.items():
        assert abs(a / teacher[name] - 1) < 0.01, (name, a, teacher[name])  # measured: ≤ 0.44 %


@pytest.mark.slow
@pytest.mark.benchmark  # 2 ps of MD, over a minute: pytest -m benchmark tests/test_bundled.py
def test_md_si64_nvt_300K_2ps_is_stable(model):
    """64-atom Si, Langevin NVT 300 K, 2 ps (1000 steps of 2 fs): no two atoms closer than 1.5 Å,
    potential energy bounded, temperature near its target."""
    from matris.simulate import md

    torch.manual_seed(0)
    atoms = bulk("Si", "diamond", a=5.43, cubic=True).repeat(2)
    closest = []

    def watch(at, step):
        if step % 5 == 0:
            d = at.get_all_distances(mic=True)
            closest.append(d[np.triu_indices(len(at), 1)].min())

    res = md(atoms, ensemble="nvt", temperature=300.0, timestep=2.0, steps=1000, loginterval=20, seed=1,
             model=model, callback=watch)
    epot = res.column("potential_energy") / len(atoms)
    assert res.time_ps == pytest.approx(2.0)
    assert np.all(np.isfinite(epot))
    assert min(closest) > 1.5
    assert epot.max() - epot.min() < 0.2  # eV/atom: a crystal at 300 K, not melting or collapsing
    assert 150 < res.column("temperature")[len(epot) // 2:].mean() < 450
