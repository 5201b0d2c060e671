"""Streaming training readers: ASE-LMDB, MatPES and MPtrj JSON (plain and gzipped), extxyz by
byte offsets; record ranges, counts, dataset expansion, bad input and constant memory."""

import gzip
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ase.build import bulk

from matris.data.readers import (
    EV_PER_A3_TO_GPA,
    BadRecord,
    Sample,
    count_samples,
    expand_data_paths,
    iter_ase_lmdb,
    iter_matpes,
    iter_mptrj,
    iter_samples,
    read_mptrj,
    read_samples,
)
from matris.errors import MatRISInputError

N = 7  # structures per test file
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def labelled(k: int):
    """A small structure with exactly known labels (forces eV/Å, stress eV/Å³ Voigt, ASE sign)."""
    from ase.calculators.singlepoint import SinglePointCalculator

    atoms = bulk("Cu", "fcc", a=3.5 + 0.02 * k) * (1, 1, 1 + k % 2)
    atoms.rattle(0.05, seed=k)
    n = len(atoms)
    forces = np.arange(3 * n, dtype=float).reshape(n, 3) * 0.01 * (k + 1)
    stress = np.array([0.01, 0.02, 0.03, 0.004, 0.005, 0.006]) * (k + 1)
    atoms.calc = SinglePointCalculator(atoms, energy=-3.5 * n - 0.1 * k, forces=forces, stress=stress,
                                       magmoms=np.full(n, 0.1 * k))
    return atoms


@pytest.fixture(scope="module")
def frames():
    return [labelled(k) for k in range(N)]


def structure_dict(atoms):
    from pymatgen.io.ase import AseAtomsAdaptor

    return AseAtomsAdaptor.get_structure(atoms).as_dict()


def kbar_vasp(atoms):
    """The stress as VASP/MPtrj/MatPES store it: kBar, positive = compressive, Voigt (ASE order)."""
    return (-10 * atoms.get_stress() * EV_PER_A3_TO_GPA).tolist()


def matpes_records(frames):
    return [{"matpes_id": f"matpes-{k}", "structure": structure_dict(a), "energy": a.get_potential_energy(),
             "forces": a.get_forces().tolist(), "stress": kbar_vasp(a), "magmoms": [0.5] * len(a),
             "cohesive_energy_per_atom": -1.0, "provenance": {"original_mp_id": f"mp-{k // 2}"}}
            for k, a in enumerate(frames)]


def mptrj_data(frames):
    data = {}
    for k, a in enumerate(frames):
        data.setdefault(f"mp-{k // 3}", {})[f"mp-{k // 3}-{k}"] = {
            "structure": structure_dict(a), "corrected_total_energy": a.get_potential_energy(),
            "force": a.get_forces().tolist(), "stress": np.reshape(kbar_vasp(a), -1).tolist(), "magmom": None}
    return data


def write_json(path, data):
    text = json.dumps(data)
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def write_lmdb(path, frames, sid=True):
    import ase.db

    with ase.db.connect(str(path), type="aselmdb") as db:
        for k, a in enumerate(frames):
            db.write(a, **({"sid": f"omat-{k}"} if sid else {}), data={"note": k})
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory, frames):
    import ase.io

    d = tmp_path_factory.mktemp("formats")
    ase.io.write(d / "a.extxyz", frames)
    ase.io.write(d / "a.traj", frames)
    import ase.db

    with ase.db.connect(d / "a.db") as db:
        for a in frames:
            db.write(a)
    write_lmdb(d / "a.aselmdb", frames)
    write_json(d / "matpes.json", matpes_records(frames))
    write_json(d / "matpes.json.gz", matpes_records(frames))
    write_json(d / "mptrj.json", mptrj_data(frames))
    write_json(d / "mptrj.json.gz", mptrj_data(frames))
    return d


def assert_labels(s: Sample, a, stress_gpa_ase=None):
    np.testing.assert_allclose(s.system.positions, a.positions, atol=1e-6)
    assert s.energy == pytest.approx(a.get_potential_energy(), abs=1e-9)
    np.testing.assert_allclose(s.forces, a.get_forces(), atol=1e-9)
    expected = a.get_stress(voigt=False) * EV_PER_A3_TO_GPA if stress_gpa_ase is None else stress_gpa_ase
    np.testing.assert_allclose(s.stress, expected, atol=1e-9)


# ----------------------------------------------------------------------------- values and units


def test_ase_lmdb_labels_units_and_ids(files, frames, tmp_path):
    samples = list(iter_ase_lmdb(files / "a.aselmdb"))
    assert len(samples) == N
    for k, (s, a) in enumerate(zip(samples, frames)):
        assert_labels(s, a)  # eV/Å³ Voigt, ASE sign → GPa ×160.21766208, same sign
        np.testing.assert_allclose(s.magmoms, 0.1 * k)
        assert s.material_id == f"omat-{k}"  # 'sid'
    # no sid → "<stem>:<row id>"; .lmdb suffix dispatches too; a stress-free (OMol-like) row → None
    from ase.calculators.singlepoint import SinglePointCalculator

    mol = frames[0].copy()
    mol.calc = SinglePointCalculator(mol, energy=-1.5, forces=np.zeros((len(mol), 3)))
    write_lmdb(tmp_path / "b.lmdb", [frames[1], mol], sid=False)
    b = read_samples(tmp_path / "b.lmdb")
    assert [s.material_id for s in b] == ["b:1", "b:2"]
    assert b[1].stress is None and b[1].magmoms is None and b[1].energy == -1.5
    # label keys as for .db: key_value_pairs, then data
    c = list(iter_ase_lmdb(files / "a.aselmdb", energy_key="note", material_id_key="sid"))
    assert [s.energy for s in c] == list(range(N)) and c[2].material_id == "omat-2"


def test_matpes_stress_sign_and_units(files, frames):
    """MatPES stores VASP kBar (positive = compressive): GPa_ase = -0.1 × kBar, same as MPtrj."""
    for name in ("matpes.json", "matpes.json.gz"):
        samples = list(iter_matpes(files / name))
        assert len(samples) == N
        for k, (s, a) in enumerate(zip(samples, frames)):
            assert_labels(s, a)
            assert s.name == f"matpes-{k}" and s.material_id == f"mp-{k // 2}"
            np.testing.assert_array_equal(s.magmoms, 0.5)
    # a compressed cell has negative ASE stress
    from ase.calculators.emt import EMT

    a = bulk("Cu", "fcc", a=3.40, cubic=True)
    a.calc = EMT()
    rec = matpes_records([a])[0]
    assert all(v > 0 for v in rec["stress"][:3])
    (s,) = iter_matpes(write_json(files / "compressed.json", [rec]))
    assert np.all(np.diag(s.stress) < -1.0)
    np.testing.assert_allclose(s.stress, a.get_stress(voigt=False) * EV_PER_A3_TO_GPA, rtol=1e-10)
    (c,) = iter_matpes(files / "compressed.json", energy_key="cohesive_energy_per_atom")
    assert c.energy == pytest.approx(-1.0 * len(a))  # per atom × n → total


def test_mptrj_streamed_plain_and_gz(files, frames):
    for name in ("mptrj.json", "mptrj.json.gz"):
        samples = read_mptrj(files / name)
        assert [s.material_id for s in samples] == [f"mp-{k // 3}" for k in range(N)]
        for s, a in zip(samples, frames):
            assert_labels(s, a)
            assert s.magmoms is None
        assert [s.energy for s in read_samples(files / name)] == [s.energy for s in samples]
        assert [s.name for s in iter_mptrj(files / name, start=2, stop=5)] == [s.name for s in samples[2:5]]
    with pytest.raises(MatRISInputError, match="not in the MPtrj layout"):
        read_mptrj(files / "matpes.json")


# ----------------------------------------------------------------------------- ranges and counts

FORMATS = ["a.extxyz", "a.traj", "a.db", "a.aselmdb", "matpes.json", "matpes.json.gz", "mptrj.json",
           "mptrj.json.gz"]


def key(s: Sample):
    return (s.material_id, s.name, s.energy, s.system.positions.round(8).tobytes())


@pytest.mark.parametrize("name", FORMATS)
def test_ranges_equal_slices_of_a_full_read(files, name):
    full, count = iter_samples(files / name)
    full = list(full)
    assert len(full) == N
    expected_count = None if name.endswith((".json", ".json.gz")) else N
    if name.endswith(".traj"):
        assert count is None and count_samples(files / name) == N
    else:
        assert count == expected_count and count_samples(files / name) == expected_count
    for start, stop in [(0, 3), (2, 5), (3, None), (5, 100), (N, None), (N + 3, N + 5), (4, 4), (0, 1)]:
        part, c = iter_samples(files / name, start=start, stop=stop)
        part = list(part)
        assert [key(s) for s in part] == [key(s) for s in full[start:stop]], (start, stop)
        if c is not None:
            assert c == len(part)
    with pytest.raises(MatRISInputError, match="not a valid range"):
        iter_samples(files / name, start=3, stop=2)


@pytest.mark.parametrize("name", ["a.extxyz", "a.traj"])
def test_ase_index_option_then_range(files, name):
    """reader_options may carry an ASE index; start/stop then count among the frames it selects."""
    full = list(iter_samples(files / name)[0])
    for index, start, stop in [("1::2", 0, None), ("1::2", 1, 2), ("0:5", 3, 10), ("::-1", 0, 3)]:
        part = list(iter_samples(files / name, start=start, stop=stop, index=index)[0])
        picked = [full[i] for i in range(N)[slice(*[int(x) if x else None for x in index.split(":")])]]
        assert [s.energy for s in part] == [s.energy for s in picked[start:stop]], (index, start, stop)
        assert [s.material_id for s in part] == [f"a:{k}" for k in range(start, start + len(part))]
        assert count_samples(files / name, index=index) == len(picked)


def test_extxyz_range_reads_only_its_frames(files, monkeypatch):
    """A worker seeks to its frames: ASE parses only the bytes of frames [start, stop)."""
    import ase.io

    seen = []
    real = ase.io.iread

    def spy(f, *args, **kwargs):
        seen.append(f.getvalue())
        return real(f, *args, **kwargs)

    monkeypatch.setattr(ase.io, "iread", spy)
    part, count = iter_samples(files / "a.extxyz", start=4, stop=6)
    assert count == 2 and len(list(part)) == 2
    assert len(seen) == 1 and seen[0].count("Lattice=") == 2


def test_mixed_options_apply_by_format(files):
    """The trainer passes one option set for all formats; mptrj_energy_key marks it."""
    opts = {"mptrj_energy_key": "corrected_total_energy", "energy_key": None, "stress_unit": "eV/A3"}
    for name in FORMATS:
        samples, _ = iter_samples(files / name, **opts)
        assert len(list(samples)) == N
    with pytest.raises(MatRISInputError, match="do not apply"):
        iter_samples(files / "matpes.json", stress_unit="GPa")


# ----------------------------------------------------------------------------- directories and globs


def test_expand_data_paths(files, tmp_path):
    d = tmp_path / "set"
    (d / "sub").mkdir(parents=True)
    for name in ("b.extxyz", "a.aselmdb", "c.json.gz", "notes.txt", ".hidden.extxyz"):
        (d / name).write_text("x")
    (d / "sub" / "z.extxyz").write_text("x")
    assert [p.name for p in expand_data_paths(d)] == ["a.aselmdb", "b.extxyz", "c.json.gz"]
    assert [p.name for p in expand_data_paths(str(d / "*.extxyz"))] == ["b.extxyz"]
    assert [p.name for p in expand_data_paths(str(d / "**" / "*.extxyz"))] == ["b.extxyz", "z.extxyz"]
    both = expand_data_paths([d / "b.extxyz", str(d), files / "a.traj"])
    assert [p.name for p in both] == ["b.extxyz", "a.aselmdb", "c.json.gz", "a.traj"]  # order kept, no repeats
    with pytest.raises(MatRISInputError, match=r"pattern .*\*\.xyz.* matches no data file"):
        expand_data_paths(str(d / "*.xyz"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MatRISInputError, match="empty.* holds no data file"):
        expand_data_paths(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="nope.extxyz"):
        expand_data_paths(tmp_path / "nope.extxyz")


# ----------------------------------------------------------------------------- bad input


def test_corrupt_lmdb_names_the_file(tmp_path):
    bad = tmp_path / "broken.aselmdb"
    bad.write_bytes(b"this is not an lmdb file" * 100)
    with pytest.raises(MatRISInputError, match=r"broken\.aselmdb: cannot open it as an LMDB"):
        read_samples(bad)
    with pytest.raises(MatRISInputError, match=r"broken\.aselmdb"):
        count_samples(bad)


def test_lmdb_missing_energy_and_nan_forces(tmp_path, frames):
    from ase.calculators.singlepoint import SinglePointCalculator

    no_energy = frames[1].copy()
    no_energy.calc = SinglePointCalculator(no_energy, forces=frames[1].get_forces())
    nan_forces = frames[3].copy()  # two atoms
    f = frames[3].get_forces().copy()
    f[1, 2] = np.nan
    nan_forces.calc = SinglePointCalculator(nan_forces, energy=-1.0, forces=f)
    path = write_lmdb(tmp_path / "bad.aselmdb", [frames[0], no_energy, nan_forces, frames[3]])
    with pytest.raises(MatRISInputError, match=r"bad\.aselmdb record 1 \(row id 2, omat-1\): .*no energy"):
        read_samples(path)
    with pytest.raises(MatRISInputError, match=r"bad\.aselmdb record 2 \(row id 3, omat-2\): the forces of atom 1"):
        read_samples(path, start=2)
    out = read_samples(path, on_error="skip")
    assert [type(r) for r in out] == [Sample, BadRecord, BadRecord, Sample]
    assert out[1].index == 1 and "no energy" in out[1].message and "bad.aselmdb" in out[1].message
    assert out[2].index == 2 and "finite" in out[2].message


def test_extxyz_nan_forces_and_truncation(tmp_path, frames):
    import ase.io

    bad = [f.copy() for f in frames[:3]]
    from ase.calculators.singlepoint import SinglePointCalculator

    forces = frames[1].get_forces().copy()
    forces[0, 0] = np.inf
    for b, f in zip(bad, frames):
        b.calc = SinglePointCalculator(b, energy=f.get_potential_energy(), forces=f.get_forces())
    bad[1].calc.results["forces"] = forces
    path = tmp_path / "bad.extxyz"
    ase.io.write(path, bad)
    with pytest.raises(MatRISInputError, match=r"bad\.extxyz frame 1 .*forces of atom 0.*finite"):
        read_samples(path)
    # cut the file inside its last frame: frames 0, 1 complete, frame 2 broken
    text = path.read_text().splitlines(keepends=True)
    path.write_text("".join(text[:-1]))
    assert count_samples(path) == 3
    out = read_samples(path, on_error="skip")
    assert [type(r) for r in out] == [Sample, BadRecord, BadRecord]
    assert out[2].index == 2 and "truncated" in out[2].message
    with pytest.raises(MatRISInputError, match=r"frame 2 \(counting from 0\) of .*bad\.extxyz.*truncated"):
        read_samples(path, start=2)
    assert len(read_samples(path, stop=1)) == 1  # the range before the break reads fine


@pytest.mark.parametrize("name", ["matpes.json", "matpes.json.gz", "mptrj.json", "mptrj.json.gz"])
def test_truncated_json_stream(files, tmp_path, name):
    raw = (gzip.decompress if name.endswith(".gz") else bytes)((files / name).read_bytes())
    cut = raw[: int(len(raw) * 0.6)]
    path = tmp_path / name
    path.write_bytes(gzip.compress(cut) if name.endswith(".gz") else cut)
    full = list(iter_samples(files / name)[0])
    with pytest.raises(MatRISInputError, match=rf"{re.escape(name)} record \d+.*truncated or corrupt"):
        read_samples(path)
    out = read_samples(path, on_error="skip")
    assert isinstance(out[-1], BadRecord) and all(isinstance(s, Sample) for s in out[:-1])
    assert out[-1].index == len(out) - 1 and "truncated" in out[-1].message
    assert [key(s) for s in out[:-1]] == [key(s) for s in full[: len(out) - 1]]
    # a gzip file cut short (not a complete gzip member) is the same kind of error
    if name.endswith(".gz"):
        whole = (files / name).read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
        with pytest.raises(MatRISInputError, match=re.escape(name)):
            read_samples(path)


def test_matpes_bad_records(tmp_path, frames):
    recs = matpes_records(frames[:5])
    del recs[1]["energy"]
    recs[2]["structure"]["sites"][0]["species"][0]["element"] = "Xx"
    recs[3]["structure"]["sites"][0]["species"][0]["element"] = "Am"  # Z = 95: beyond the model
    recs[4]["forces"] = recs[4]["forces"][:-1]
    path = write_json(tmp_path / "bad.json.gz", recs)
    with pytest.raises(MatRISInputError, match=r"bad\.json\.gz record 1 \(matpes-1\): the record has no energy"):
        read_samples(path)
    with pytest.raises(MatRISInputError, match=r"record 2 \(matpes-2\): site 0 has unknown element 'Xx'"):
        read_samples(path, start=2)
    out = read_samples(path, on_error="skip")
    assert [type(r).__name__ for r in out] == ["Sample", "BadRecord", "BadRecord", "Sample", "BadRecord"]
    assert [r.index for r in out if isinstance(r, BadRecord)] == [1, 2, 4]
    assert "shape" in out[4].message
    with pytest.raises(MatRISInputError, match=r"Am \(Z=95\)"):  # the graph cache validates each structure
        out[3].system.validate(3)


def test_mptrj_missing_energy_is_unlabelled_but_key_typo_fails(tmp_path, frames):
    data = mptrj_data(frames[:3])
    del data["mp-0"]["mp-0-1"]["corrected_total_energy"]
    path = write_json(tmp_path / "m.json", data)
    samples = read_mptrj(path)
    assert math.isnan(samples[1].energy) and not math.isnan(samples[0].energy)
    with pytest.raises(MatRISInputError, match="energy_key='total_energy'"):
        read_mptrj(path, energy_key="total_energy")
    data["mp-0"]["mp-0-2"]["structure"]["sites"][0]["species"][0]["element"] = "Qq"
    write_json(path, data)
    with pytest.raises(MatRISInputError, match=r"m\.json record 2 \(mp-0/mp-0-2\): site 0 has unknown element"):
        read_mptrj(path)


def test_json_detection_reads_only_the_start(tmp_path):
    """'[' → MatPES, '{' → MPtrj (one frame probed); a broken tail is not seen by detection."""
    from matris.data.readers import _json_kind

    (tmp_path / "l.json").write_text("  \n [" + "{" * 10)
    (tmp_path / "d.json").write_text('{"mp-1": {"f": {"energy": 1, "structure": {}}}, "mp-2": {' + "[" * 10)
    (tmp_path / "x.json").write_text("hello")
    assert _json_kind(tmp_path / "l.json") == "matpes" and _json_kind(tmp_path / "d.json") == "mptrj"
    with pytest.raises(MatRISInputError, match=r"x\.json: not valid JSON"):
        read_samples(tmp_path / "x.json")


# ----------------------------------------------------------------------------- memory


MEMORY_SCRIPT = textwrap.dedent("""
    import resource, sys
    from matris.data.readers import iter_samples

    def status(field):  # kB, from /proc/self/status
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

    try:  # reset the high-water mark left by the imports (Linux >= 4.0), so VmHWM is the peak while streaming
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss0 = status("VmRSS")
    samples, _ = iter_samples(sys.argv[1])
    n = atoms = 0
    for s in samples:
        n += 1
        atoms += s.system.num_atoms
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(n, atoms, before, after, rss0, status("VmHWM"))
""")



def write_scaled_mptrj(path, frames, target_bytes):
    """An MPtrj JSON of about ``target_bytes``: one material's JSON text repeated under new keys."""
    material = json.dumps(mptrj_data(frames[:3])["mp-0"])
    n = max(1, target_bytes // (len(material) + 20))
    with open(path, "w") as f:
        f.write("{")
        f.writelines(f'{"," if m else ""}"mp-{m}": {material}' for m in range(n))
        f.write("}")
    return 3 * n


@pytest.mark.slow
def test_mptrj_streams_at_constant_memory(tmp_path, frames):
    path = tmp_path / "MPtrj_scaled.json"
    n_frames = write_scaled_mptrj(path, frames, 80 * 2**20)
    size_mb = path.stat().st_size / 2**20
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(path)], capture_output=True, text=True, check=False,
                         timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    n, _, before, after, rss0, hwm = map(int, out.stdout.split())  # KiB
    growth_mb = (after - before) / 1024  # ru_maxrss: peak of the process, imports included
    hwm_growth_mb = (hwm - rss0) / 1024  # peak while streaming, over the RSS after the imports
    print(f"\nMPtrj {size_mb:.0f} MB, {n} frames: ru_maxrss {before / 1024:.0f} -> {after / 1024:.0f} MiB "
          f"(+{growth_mb:.1f}); RSS after imports {rss0 / 1024:.0f} MiB, peak while streaming {hwm / 1024:.0f} MiB "
          f"(+{hwm_growth_mb:.1f})")
    assert n == n_frames
    assert growth_mb < min(100.0, size_mb / 4), (growth_mb, size_mb)
    assert hwm_growth_mb < min(100.0, size_mb / 4), (hwm_growth_mb, size_mb)
