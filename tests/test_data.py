"""Training data: readers and units, the packed graph cache, collation and budget batching."""

import functools
import json
import os
import pickle
import threading
from dataclasses import fields

import numpy as np
import pytest
import torch

from matris import AtomicSystem, GraphBatch, MatRISInputError
from matris.data import (
    BudgetBatchSampler,
    GraphDataset,
    MultiPacked,
    PackedDataset,
    Sample,
    Targets,
    build_or_load,
    default_cache_dir,
    read_ase,
    read_ase_db,
    read_mptrj,
    read_samples,
)
from matris.data.readers import EV_PER_A3_TO_GPA

ase = pytest.importorskip("ase")
from ase.build import bulk  # noqa: E402
from ase.calculators.emt import EMT  # noqa: E402
from ase.calculators.singlepoint import SinglePointCalculator  # noqa: E402

ELEMENTS = ["Al", "Cu", "Ag", "Au", "Ni", "Pd", "Pt"]
CUTOFF, R3 = 5.0, 3.0


def emt_atoms(rng, repeat=None, strain=0.03, rattle=0.05):
    """A labelled fcc alloy (4–16 atoms): random substitutions, strained and rattled, EMT labels."""
    host = str(rng.choice(ELEMENTS))
    atoms = bulk(host, "fcc", cubic=True)
    reps = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1)]
    atoms = atoms.repeat(repeat or reps[rng.integers(len(reps))])
    symbols = atoms.get_chemical_symbols()
    for k in rng.choice(len(atoms), size=rng.integers(0, 3), replace=False):
        symbols[k] = str(rng.choice(ELEMENTS))
    atoms.set_chemical_symbols(symbols)
    eps = rng.normal(scale=strain, size=(3, 3))
    atoms.set_cell(atoms.cell[:] @ (np.eye(3) + (eps + eps.T) / 2), scale_atoms=True)
    atoms.rattle(rattle, seed=int(rng.integers(1 << 30)))
    return label(atoms)


def label(atoms):
    atoms.calc = EMT()
    results = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces(), "stress": atoms.get_stress()}
    atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms


@pytest.fixture(scope="module")
def frames():
    rng = np.random.default_rng(0)
    return [emt_atoms(rng) for _ in range(10)]


@pytest.fixture
def extxyz(tmp_path, frames):
    import ase.io

    path = tmp_path / "alloys.extxyz"
    ase.io.write(path, frames)
    return path


# ----------------------------------------------------------------------------- readers and units


def test_extxyz_labels_from_calculator_results(extxyz, frames):
    samples = read_ase(extxyz)
    assert len(samples) == len(frames)
    for k, (s, a) in enumerate(zip(samples, frames)):
        assert isinstance(s, Sample)
        np.testing.assert_allclose(s.system.positions, a.positions, atol=1e-7)
        np.testing.assert_array_equal(s.system.atomic_numbers, a.numbers)
        assert s.energy == pytest.approx(a.get_potential_energy(), abs=1e-8)
        np.testing.assert_allclose(s.forces, a.get_forces(), atol=1e-8)
        # ASE eV/Å³ → GPa, same sign
        np.testing.assert_allclose(s.stress, a.get_stress(voigt=False) * EV_PER_A3_TO_GPA, atol=1e-6)
        assert s.stress.shape == (3, 3) and s.magmoms is None
        assert s.material_id == f"alloys:{k}"


def test_extxyz_custom_keys_and_stress_units(tmp_path, frames):
    import ase.io

    out = []
    for k, a in enumerate(frames[:4]):
        b = a.copy()  # no calculator: labels live only under custom keys
        b.info["REF_energy"] = a.get_potential_energy() + 1.0
        b.arrays["REF_forces"] = 2 * a.get_forces()
        b.info["REF_stress"] = a.get_stress(voigt=False) * EV_PER_A3_TO_GPA * 10  # kbar, ASE sign, 3×3
        b.info["voigt_stress"] = a.get_stress() * EV_PER_A3_TO_GPA  # GPa, Voigt 6
        b.arrays["REF_magmoms"] = np.arange(len(b), dtype=float)
        b.info["mpid"] = f"mp-{k}"
        out.append(b)
    path = tmp_path / "custom.extxyz"
    ase.io.write(path, out)
    samples = read_ase(path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress",
                       magmoms_key="REF_magmoms", material_id_key="mpid", stress_unit="kbar")
    voigt = read_ase(path, stress_key="voigt_stress", stress_unit="GPa")
    for k, (s, v, a) in enumerate(zip(samples, voigt, frames)):
        assert s.energy == pytest.approx(a.get_potential_energy() + 1.0)
        np.testing.assert_allclose(s.forces, 2 * a.get_forces(), atol=1e-8)
        gpa = a.get_stress(voigt=False) * EV_PER_A3_TO_GPA
        np.testing.assert_allclose(s.stress, gpa, atol=1e-6)
        np.testing.assert_allclose(v.stress, gpa, atol=1e-6)
        np.testing.assert_array_equal(s.magmoms, np.arange(len(a)))
        assert s.material_id == f"mp-{k}"
        assert np.isnan(v.energy) and v.forces is None  # no calculator results in this file

    # a key that ASE's extxyz reader moved into the calculator results is found there
    plain = read_ase(tmp_path / "custom.extxyz", energy_key="REF_energy")
    assert plain[0].energy == pytest.approx(frames[0].get_potential_energy() + 1.0)
    with pytest.raises(MatRISInputError, match="REF_energi.*none of the 4"):
        read_ase(path, energy_key="REF_energi")
    with pytest.raises(MatRISInputError, match="stress_unit"):
        read_ase(path, stress_unit="Pa")


def test_energy_key_named_energy_lives_in_calc_results(tmp_path, frames):
    import ase.io

    b = frames[0].copy()
    b.info["energy"] = -3.5  # the extxyz reader moves this into a SinglePointCalculator
    ase.io.write(tmp_path / "e.extxyz", b)
    (s,) = read_ase(tmp_path / "e.extxyz", energy_key="energy")
    assert s.energy == -3.5


def test_stress_sign_ase_vs_mptrj(tmp_path):
    """A compressed cell has negative ASE stress (it pushes outwards) and positive VASP/MPtrj kBar."""
    from pymatgen.io.ase import AseAtomsAdaptor

    atoms = label(bulk("Cu", "fcc", a=3.40, cubic=True))  # EMT's equilibrium is ~3.59 Å
    gpa_ase = atoms.get_stress(voigt=False) * EV_PER_A3_TO_GPA
    assert np.all(np.diag(gpa_ase) < -1.0)
    kbar_vasp = -10.0 * gpa_ase
    assert np.all(np.diag(kbar_vasp) > 0)
    structure = AseAtomsAdaptor.get_structure(atoms)
    data = {"mp-30": {"mp-30-0-0": {
        "structure": structure.as_dict(), "corrected_total_energy": atoms.get_potential_energy(),
        "force": atoms.get_forces().tolist(), "stress": kbar_vasp.tolist(), "magmom": None}}}
    (tmp_path / "c.json").write_text(json.dumps(data))
    (s,) = read_mptrj(tmp_path / "c.json")
    np.testing.assert_allclose(s.stress, gpa_ase, rtol=1e-10)
    (e,) = read_ase(_write_xyz(tmp_path / "c.extxyz", atoms))
    np.testing.assert_allclose(e.stress, s.stress, rtol=1e-8)


def _write_xyz(path, atoms):
    import ase.io

    ase.io.write(path, atoms)
    return path


def test_ase_db(tmp_path, frames):
    import ase.db

    path = tmp_path / "alloys.db"
    with ase.db.connect(path) as db:
        for k, a in enumerate(frames[:5]):
            db.write(a, mpid=f"mp-{k}", natoms_tag=len(a))
    samples = read_ase_db(path)
    assert len(samples) == 5
    for k, (s, a) in enumerate(zip(samples, frames)):
        assert s.energy == pytest.approx(a.get_potential_energy())
        np.testing.assert_allclose(s.forces, a.get_forces(), atol=1e-10)
        np.testing.assert_allclose(s.stress, a.get_stress(voigt=False) * EV_PER_A3_TO_GPA, atol=1e-8)
        assert s.material_id == f"alloys:{k + 1}"  # row ids start at 1
    by_key = read_ase_db(path, selection="natoms_tag<5", material_id_key="mpid")
    assert [s.material_id for s in by_key] == [f"mp-{k}" for k, a in enumerate(frames[:5]) if len(a) < 5]
    assert len(read_samples(path)) == 5  # dispatch by suffix
    with pytest.raises(FileNotFoundError, match="missing.db"):
        read_ase_db(tmp_path / "missing.db")


def mptrj_dict(frames, magmom_every=2):
    from pymatgen.io.ase import AseAtomsAdaptor

    data = {}
    for k, a in enumerate(frames):
        n = len(a)
        e = a.get_potential_energy()
        data.setdefault(f"mp-{k // 2}", {})[f"mp-{k // 2}-{k % 2}-0"] = {
            "structure": AseAtomsAdaptor.get_structure(a).as_dict(),
            "uncorrected_total_energy": e,
            "corrected_total_energy": e - 0.5,
            "energy_per_atom": e / n,
            "ef_per_atom": -0.1,
            "force": a.get_forces().tolist(),
            "stress": (-10 * a.get_stress(voigt=False) * EV_PER_A3_TO_GPA).tolist(),
            "magmom": [0.5] * n if k % magmom_every == 0 else None,
            "bandgap": 0.0,
            "mp_id": f"mp-{k // 2}",
        }
    return data


def test_mptrj(tmp_path, frames):
    from pymatgen.core import Structure

    from matris.structures import to_system

    data = mptrj_dict(frames[:5])
    path = tmp_path / "MPtrj_small.json"
    path.write_text(json.dumps(data))
    samples = read_mptrj(path)
    assert [s.material_id for s in samples] == ["mp-0", "mp-0", "mp-1", "mp-1", "mp-2"]
    assert [s.name for s in samples] == ["mp-0-0-0", "mp-0-1-0", "mp-1-0-0", "mp-1-1-0", "mp-2-0-0"]
    frames_in_file = [f for m in data.values() for f in m.values()]
    for s, a, f in zip(samples, frames, frames_in_file):
        ref = to_system(Structure.from_dict(f["structure"]))  # the fast path agrees with pymatgen
        np.testing.assert_allclose(s.system.positions, ref.positions, atol=1e-12)
        np.testing.assert_allclose(s.system.cell, ref.cell, atol=1e-12)
        np.testing.assert_array_equal(s.system.atomic_numbers, ref.atomic_numbers)
        assert s.energy == pytest.approx(a.get_potential_energy() - 0.5)
        np.testing.assert_allclose(s.forces, a.get_forces())
        np.testing.assert_allclose(s.stress, a.get_stress(voigt=False) * EV_PER_A3_TO_GPA, atol=1e-9)
    assert samples[0].magmoms is not None and samples[1].magmoms is None
    unc = read_mptrj(path, energy_key="uncorrected_total_energy")
    per_atom = read_mptrj(path, energy_key="energy_per_atom")  # × n_atoms → total
    for u, p, a in zip(unc, per_atom, frames):
        assert u.energy == pytest.approx(a.get_potential_energy())
        assert p.energy == pytest.approx(a.get_potential_energy())
    assert [s.energy for s in read_samples(path)] == [s.energy for s in samples]  # dispatch
    with pytest.raises(MatRISInputError, match="energy_key='total_energy'"):
        read_mptrj(path, energy_key="total_energy")

    # missing magmom → NaN in the packed targets, and has_labels says so per label
    ds = PackedDataset.from_samples(samples, CUTOFF, R3, tmp_path / "packed")
    _, t = ds.collate([0, 1])
    n0 = len(frames[0])
    assert torch.all(t.magmoms[:n0] == 0.5) and torch.isnan(t.magmoms[n0:]).all()
    assert ds.has_labels == {"energy": True, "forces": True, "stress": True, "magmoms": True}


def test_read_samples_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.extxyz"):
        read_samples(tmp_path / "nope.extxyz")
    (tmp_path / "junk.xyz").write_text("this is not\nan xyz file\n")
    with pytest.raises(MatRISInputError, match="junk.xyz.*ASE cannot read"):
        read_samples(tmp_path / "junk.xyz")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(MatRISInputError, match="not valid JSON"):
        read_samples(tmp_path / "junk.json")
    with pytest.raises(FileNotFoundError, match="nope"):
        build_or_load(tmp_path / "nope.extxyz", CUTOFF, R3, cache_dir=tmp_path / "cache")


# ----------------------------------------------------------------------------- packed cache and collation


def assert_batches_equal(a: GraphBatch, b: GraphBatch):
    for f in fields(GraphBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype, f.name
        assert x.shape == y.shape, f.name
        assert torch.equal(x, y), f.name


@pytest.fixture
def packed(tmp_path, extxyz):
    return build_or_load(extxyz, CUTOFF, R3, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("dtype,store_angles", [(torch.float64, True), (torch.float32, True),
                                                 (torch.float64, False)])
def test_collate_equals_from_systems(tmp_path, packed, extxyz, frames, dtype, store_angles):
    samples = read_ase(extxyz)
    systems = [s.system for s in samples]  # as stored in the file (extxyz rounds positions)
    if not store_angles:  # angles rebuilt per batch from the stored bond lengths
        packed = PackedDataset.from_samples(samples, CUTOFF, R3, tmp_path / "no_angles", store_angles=False)
        assert not (packed.directory / "angle_target_edge.npy").exists()
        np.testing.assert_array_equal(packed.n_angles, packed.collate(range(len(frames)))[0].n_angles.numpy())
    for idx in ([0], [3, 1, 4, 1, 5, 9, 2, 6], list(range(len(frames)))):
        graph, targets = packed.collate(idx, dtype=dtype)
        ref = GraphBatch.from_systems([systems[i] for i in idx], CUTOFF, R3, dtype=dtype)
        assert ref.num_angles > 0
        assert_batches_equal(graph, ref)
        assert isinstance(targets, Targets)
        for name in ("energy", "forces", "stress", "magmoms"):
            assert getattr(targets, name).dtype == dtype
        e = torch.tensor([frames[i].get_potential_energy() for i in idx], dtype=dtype)
        f = torch.from_numpy(np.concatenate([frames[i].get_forces() for i in idx])).to(dtype)
        s = torch.from_numpy(np.stack([frames[i].get_stress(voigt=False) for i in idx]) * EV_PER_A3_TO_GPA).to(dtype)
        torch.testing.assert_close(targets.energy, e)
        torch.testing.assert_close(targets.forces, f)
        torch.testing.assert_close(targets.stress, s)
        assert targets.magmoms.shape == (graph.num_atoms,) and torch.isnan(targets.magmoms).all()
    assert packed.has_labels == {"energy": True, "forces": True, "stress": True, "magmoms": False}
    moved = targets.to("cpu", torch.float64)
    assert moved.energy.dtype == torch.float64


def test_packed_api(packed, frames):
    assert len(packed) == len(frames)
    np.testing.assert_array_equal(packed.n_atoms, [len(a) for a in frames])
    g = packed.collate(range(len(frames)))[0]
    np.testing.assert_array_equal(packed.n_bonds, g.n_bonds.numpy())
    np.testing.assert_array_equal(packed.n_angles, g.n_angles.numpy())
    assert packed.n_atoms.dtype == packed.n_bonds.dtype == packed.n_angles.dtype == np.int64
    assert packed.material_ids == [f"alloys:{k}" for k in range(len(frames))]
    assert (packed.cutoff, packed.three_body_cutoff) == (CUTOFF, R3)
    np.testing.assert_allclose(packed.energies, [a.get_potential_energy() for a in frames])
    np.testing.assert_array_equal(packed.atomic_numbers_of(3), frames[3].numbers)
    comp = packed.composition_matrix()
    assert comp.shape == (len(frames), 94) and comp.dtype == np.float64
    for k, a in enumerate(frames):
        expected = np.zeros(94)
        np.add.at(expected, a.numbers - 1, 1.0)
        np.testing.assert_array_equal(comp[k], expected)
    assert comp.sum() == sum(len(a) for a in frames)
    # memory-mapped, not loaded: the arrays are np.memmap views of the .npy files
    shard = packed.datasets[0]  # a cache entry of one shard (fewer structures than the shard size)
    assert isinstance(shard._arr("positions"), np.memmap)
    assert isinstance(shard._arr("angle_target_edge"), np.memmap)
    assert isinstance(shard._arr("atom_ptr"), np.memmap)
    assert sorted(p.name for p in shard.directory.glob("*.npy"))[:3] == ["angle_ptr.npy", "angle_source_edge.npy",
                                                                         "angle_target_edge.npy"]
    s = packed.system(2)
    np.testing.assert_allclose(s.positions, frames[2].positions, atol=1e-7)
    with pytest.raises(IndexError):
        packed.collate([len(frames)])


def test_cache_reused_and_rebuilt(tmp_path, extxyz, frames):
    import ase.io

    cache = tmp_path / "cache"
    first = build_or_load(extxyz, CUTOFF, R3, cache_dir=cache)
    build_id = first.meta["build_id"]
    assert first.meta["source"]["sha256"] and first.meta["source"]["size"] == extxyz.stat().st_size
    again = build_or_load(extxyz, CUTOFF, R3, cache_dir=cache)
    assert again.directory == first.directory and again.meta["build_id"] == build_id  # reused

    # touched but unchanged: the sha256 matches, no rebuild
    st = extxyz.stat()
    os.utime(extxyz, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert build_or_load(extxyz, CUTOFF, R3, cache_dir=cache).meta["build_id"] == build_id

    # a different cutoff is a different entry
    other = build_or_load(extxyz, CUTOFF + 0.5, R3, cache_dir=cache)
    assert other.directory != first.directory and other.cutoff == CUTOFF + 0.5
    assert other.n_bonds.sum() > first.n_bonds.sum()

    # changed content: rebuilt in place, and the new data are served
    ase.io.write(extxyz, frames[:4])
    changed = build_or_load(extxyz, CUTOFF, R3, cache_dir=cache)
    assert changed.directory == first.directory and changed.meta["build_id"] != build_id
    assert len(changed) == 4
    # the old handle still reads its own (now unlinked) memory maps
    assert len(first.collate([7])[0].n_atoms) == 1
    with pytest.raises(MatRISInputError, match="rebuilt"):  # but a new process (worker) refuses the mix
        pickle.loads(pickle.dumps(first)).collate([0])
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name or ".old-" in p.name]

    # reader options are part of the entry too
    keyed = build_or_load(extxyz, CUTOFF, R3, cache_dir=cache, reader_options={"index": "0:2"})
    assert len(keyed) == 2 and keyed.directory != changed.directory


def test_concurrent_builders_share_one_entry(tmp_path, extxyz):
    results, errors = [], []

    def work():
        try:
            results.append(build_or_load(extxyz, CUTOFF, R3, cache_dir=tmp_path / "cache", progress=False))
        except Exception as e:  # noqa: BLE001  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({r.meta["build_id"] for r in results}) == 1  # built once, loaded by the others


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MATRIS_CACHE", str(tmp_path / "m"))
    assert default_cache_dir() == tmp_path / "m" / "graphs"
    monkeypatch.delenv("MATRIS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x" / "matris" / "graphs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == __import__("pathlib").Path.home() / ".cache" / "matris" / "graphs"


def test_bad_structure_names_file_and_index(tmp_path, frames):
    import ase.io

    bad = [a.copy() for a in frames[:4]]
    bad[2].positions[1] = bad[2].positions[0] + 0.01  # overlapping atoms
    path = tmp_path / "broken.extxyz"
    ase.io.write(path, bad)
    with pytest.raises(MatRISInputError, match=r"broken\.extxyz: structure 2 .*closer than.*skip_invalid"):
        build_or_load(path, CUTOFF, R3, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob(".*tmp*"))  # the failed build left nothing behind
    with pytest.warns(UserWarning, match="skipped 1 invalid"):
        ds = build_or_load(path, CUTOFF, R3, cache_dir=tmp_path / "cache", skip_invalid=True)
    assert len(ds) == 3 and ds.n_skipped == 1
    assert ds.material_ids == ["broken:0", "broken:1", "broken:3"]

    empty = Sample(AtomicSystem(np.zeros((0, 3)), np.eye(3) * 4, True, []), name="void")
    with pytest.raises(MatRISInputError, match="structure 0 .*empty"):
        PackedDataset.from_samples([empty], CUTOFF, R3, tmp_path / "e")
    wrong = Sample(AtomicSystem(np.zeros((1, 3)), np.eye(3) * 4, True, [29]), forces=np.zeros((2, 3)))
    with pytest.raises(MatRISInputError, match="forces has shape"):
        PackedDataset.from_samples([wrong], CUTOFF, R3, tmp_path / "w")
    with pytest.raises(MatRISInputError, match="three_body_cutoff"):
        build_or_load(path, 3.0, 4.0, cache_dir=tmp_path / "cache")


def test_multi_packed(tmp_path, extxyz, frames, packed):
    second_samples = read_ase(_write_many(tmp_path / "b.extxyz", frames[:3]))
    second = PackedDataset.from_samples(second_samples, CUTOFF, R3, tmp_path / "second")
    multi = MultiPacked([packed, second])
    assert len(multi) == len(frames) + 3
    assert multi.material_ids[-1] == "b:2"
    systems = [s.system for s in read_ase(extxyz) + second_samples]
    idx = [11, 0, 10, 5, 12, 3]
    graph, targets = multi.collate(idx, dtype=torch.float64)
    assert_batches_equal(graph, GraphBatch.from_systems([systems[i] for i in idx], CUTOFF, R3, dtype=torch.float64))
    allf = frames + frames[:3]
    torch.testing.assert_close(targets.energy, torch.tensor([allf[i].get_potential_energy() for i in idx],
                                                            dtype=torch.float64))
    np.testing.assert_array_equal(multi.n_atoms, np.concatenate([packed.n_atoms, second.n_atoms]))
    assert multi.composition_matrix().shape == (len(multi), 94)
    bad = PackedDataset.from_samples(read_ase(tmp_path / "b.extxyz"), CUTOFF + 1, R3, tmp_path / "third")
    with pytest.raises(MatRISInputError, match="different cutoffs"):
        MultiPacked([packed, bad])


def _write_many(path, atoms_list):
    import ase.io

    ase.io.write(path, atoms_list)
    return path


def test_pickle_and_dataloader_workers(packed):
    clone = pickle.loads(pickle.dumps(packed))
    assert len(pickle.dumps(packed)) < 5000  # the directory and meta only, never array data
    assert_batches_equal(clone.collate([1, 2])[0], packed.collate([1, 2])[0])

    ds = GraphDataset(packed, indices=[9, 8, 7, 6, 5, 4, 3, 2])
    assert ds[0] == 9 and len(ds) == 8
    np.testing.assert_array_equal(ds.n_atoms, packed.n_atoms[[9, 8, 7, 6, 5, 4, 3, 2]])

    def run(workers):
        sampler = ds.batch_sampler(max_atoms=20, seed=3)
        loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler,
                                             collate_fn=functools.partial(packed.collate, dtype=torch.float64),
                                             num_workers=workers)
        return list(loader)

    serial, parallel = run(0), run(2)
    assert len(serial) == len(parallel) > 1
    for (g0, t0), (g1, t1) in zip(serial, parallel):
        assert_batches_equal(g0, g1)
        for f in fields(Targets):
            assert torch.equal(getattr(t0, f.name), getattr(t1, f.name), ) or torch.allclose(
                getattr(t0, f.name), getattr(t1, f.name), equal_nan=True)
    assert sum(g.num_structures for g, _ in serial) == 8


# ----------------------------------------------------------------------------- budget batching


def sizes(n=200, seed=0):
    rng = np.random.default_rng(seed)
    atoms = rng.integers(1, 40, size=n)
    bonds = atoms * rng.integers(5, 30, size=n)
    angles = bonds * rng.integers(0, 12, size=n)
    return atoms, bonds, angles


def test_budget_sampler_respects_budgets_and_covers_epoch():
    a, b, g = sizes()
    sampler = BudgetBatchSampler(a, b, g, max_atoms=150, max_bonds=2500, max_angles=20000, max_structures=12)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        for batch in batches:
            assert a[batch].sum() <= 150 and b[batch].sum() <= 2500 and g[batch].sum() <= 20000
            assert len(batch) <= 12
        flat = np.concatenate(batches)
        assert sorted(flat.tolist()) == list(range(len(a)))  # every structure exactly once
    # greedy fill: adding the next batch's first structure would exceed a budget
    sampler.set_epoch(0)
    batches = list(sampler)
    for cur, nxt in zip(batches, batches[1:]):
        x = cur + nxt[:1]
        assert a[x].sum() > 150 or b[x].sum() > 2500 or g[x].sum() > 20000 or len(x) > 12


def test_budget_sampler_deterministic_and_epochs_differ():
    a, b, g = sizes()
    one = BudgetBatchSampler(a, b, g, max_atoms=200, seed=7)
    two = BudgetBatchSampler(a, b, g, max_atoms=200, seed=7)
    one.set_epoch(4)
    two.set_epoch(4)
    assert list(one) == list(two)
    two.set_epoch(5)
    assert list(one) != list(two)
    assert list(BudgetBatchSampler(a, b, g, max_atoms=200, seed=8)) != list(BudgetBatchSampler(a, b, g, max_atoms=200,
                                                                                                 seed=7))
    two.sampler.set_epoch(4)  # the hook Lightning uses (loader.batch_sampler.sampler.set_epoch)
    assert two.epoch == 4 and list(one) == list(two)
    ordered = list(BudgetBatchSampler(a, b, g, max_atoms=200, shuffle=False))
    assert np.concatenate(ordered).tolist() == list(range(len(a)))


@pytest.mark.parametrize("world_size", [2, 3])
def test_budget_sampler_ranks_disjoint_equal_counts(world_size):
    a, b, g = sizes(301)
    full = BudgetBatchSampler(a, b, g, max_atoms=120, seed=1)
    full.set_epoch(2)
    all_batches = [x.tolist() for x in full.all_batches(2)]
    per_rank = []
    for rank in range(world_size):
        s = BudgetBatchSampler(a, b, g, max_atoms=120, seed=1, rank=rank, world_size=world_size)
        s.set_epoch(2)
        per_rank.append(list(s))
        assert len(s) == len(all_batches) // world_size
    assert len({len(r) for r in per_rank}) == 1
    seen = [i for r in per_rank for batch in r for i in batch]
    assert len(seen) == len(set(seen))  # disjoint
    assert per_rank[1] == all_batches[1::world_size][: len(per_rank[1])]


def test_budget_sampler_oversize_error():
    a, b, g = sizes()
    a[[5, 17]] = [500, 700]
    with pytest.raises(MatRISInputError, match=r"2 structures exceed max_atoms=300 .*position 17.*700 atoms"
                                               r".*Raise the budget"):
        BudgetBatchSampler(a, b, g, max_atoms=300)
    with pytest.raises(MatRISInputError, match="at least one budget"):
        BudgetBatchSampler(a, b, g)


def test_budget_sampler_resume():
    a, b, g = sizes()
    sampler = BudgetBatchSampler(a, b, g, max_bonds=3000, seed=11, rank=1, world_size=2)
    sampler.set_epoch(3)
    expected = list(sampler)
    it = iter(sampler)
    seen = [next(it) for _ in range(4)]
    state = sampler.state_dict()
    assert state["epoch"] == 3 and state["batches_yielded"] == 4

    resumed = BudgetBatchSampler(a, b, g, max_bonds=3000, seed=11, rank=1, world_size=2)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # survives a checkpoint round trip
    resumed.set_epoch(3)  # what a trainer calls again at the start of the epoch: keeps the offset
    assert len(resumed) == len(expected) - 4
    rest = list(resumed)
    assert seen + rest == expected
    resumed.set_epoch(4)
    assert len(list(resumed)) == len(resumed)  # the next epoch starts from its beginning

    manual = BudgetBatchSampler(a, b, g, max_bonds=3000, seed=11, rank=1, world_size=2)
    manual.set_epoch(3)
    manual.skip(6)
    assert list(manual) == expected[6:]
    assert list(manual) == expected  # iterating again restarts the epoch
    with pytest.raises(MatRISInputError, match="world_size"):
        BudgetBatchSampler(a, b, g, max_bonds=3000, seed=11).load_state_dict(state)
