"""The package as users install it: the distribution name and version, a torch-free ``import
matris``, the clash with the official ``matris`` distribution, the recipes found by name, one
line for a missing extra, and what the sdist and the wheel contain."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

import matris
from matris import _conflict, _version, recipes
from matris.errors import MatRISInputError, MissingExtraError
from matris.extras import install_hint, require

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Everything outside the core; a process that cannot import these still predicts, relaxes, runs MD
OPTIONAL = ["lightning", "pytorch_lightning", "lightning_fabric", "tensorboardX", "tensorboard", "matplotlib",
            "phonopy", "ijson", "ase_db_backends", "lmdb", "pymatgen", "monty", "pandas", "torch_sim",
            "vesin_torch", "yaml", "triton", "lammps", "spglib"]


def run_python(code: str, *, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)


def block_imports(names: list[str]) -> str:
    """Code that makes importing ``names`` fail as if they were not installed."""
    return f"import sys\nfor _n in {names!r}:\n    sys.modules[_n] = None\n"


# --------------------------------------------------------------------------- name and version
def test_version_has_one_source():
    assert matris.__version__ == _version.__version__
    assert PYPROJECT["project"]["name"] == _version.DISTRIBUTION == "matris-mlip"
    assert "version" in PYPROJECT["project"]["dynamic"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "matris._version.__version__"}


def test_install_hints_name_the_distribution():
    assert install_hint("train") == "pip install 'matris-mlip[train]'"
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra in ("train", "data", "phonons", "plot", "sim", "gpu", "lammps", "discovery", "docs", "test", "all"):
        assert extra in extras, extra


def test_core_is_light():
    core = " ".join(PYPROJECT["project"]["dependencies"])
    for heavy in ("lightning", "tensorboardX", "matplotlib", "phonopy", "ijson", "ase-db-backends", "pymatgen"):
        assert heavy not in core, heavy


def test_import_matris_does_not_import_torch():
    out = run_python("""
        import sys, matris
        assert "torch" not in sys.modules, "import matris imported torch"
        assert {"MatRIS", "MatRISCalculator", "GraphBatch"} <= set(dir(matris))
        print(matris.__version__)
    """, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _version.__version__


def test_lazy_names_resolve():
    from matris import MatRIS, MatRISCalculator
    from matris.calculator import MatRISCalculator as calculator_class
    from matris.model import MatRIS as model_class

    assert MatRIS is model_class and MatRISCalculator is calculator_class
    for name in matris.__all__:
        assert getattr(matris, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        matris.nonexistent  # noqa: B018


# --------------------------------------------------------------------------- the official matris
def fake_distribution(site: Path, name: str, version: str, author: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\nAuthor: {author}\n\n"
                                   "# the README\nAuthor: not a header\n")


def test_official_distribution_is_found(tmp_path):
    fake_distribution(tmp_path / "official", "matris", "1.0.0", "HPC-AI-Team")
    fake_distribution(tmp_path / "ours-old", "matris", "0.1.0", "matris developers")
    fake_distribution(tmp_path / "ours", "matris_mlip", "0.2.0", "matris developers")
    assert _conflict.official_distribution([str(tmp_path / "official")])[0] == "1.0.0"
    assert _conflict.official_distribution([str(tmp_path / "ours-old"), str(tmp_path / "ours"),
                                            str(tmp_path / "missing")]) is None


def test_official_distribution_stops_import_with_one_line(tmp_path):
    fake_distribution(tmp_path, "matris", "1.0.0", "HPC-AI-Team")
    out = run_python("import matris", env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}, cwd=tmp_path)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: the official MatRIS package 'matris' 1.0.0")
    assert last.endswith("pip uninstall -y matris matris-mlip && pip install matris-mlip")


def test_the_command_checks_for_the_official_package_too(tmp_path, monkeypatch, capsys):
    # the official package's __init__.py may have replaced ours (and its check): main() checks again
    from matris.cli import main

    fake_distribution(tmp_path, "matris", "1.0.0", "HPC-AI-Team")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["models"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("matris: error: the official MatRIS package 'matris' 1.0.0")


# --------------------------------------------------------------------------- recipes
def test_recipes_are_listed_with_descriptions():
    listed = dict(recipes.available())
    assert {"tiny", "matris-10m", "matris-10m-oam", "matris-10m-omat", "matris-4m-matpes", "finetune"} <= set(listed)
    assert all(description and "\n" not in description for description in listed.values())
    assert listed["tiny"].startswith("A tiny MatRIS")
    assert recipes.names() == sorted(listed)


def test_recipes_are_found_by_name_or_path(tmp_path, monkeypatch):
    tiny = recipes.find("tiny")
    assert tiny.is_file() and tiny.name == "tiny.yaml"
    assert recipes.find("tiny.yaml") == tiny and recipes.find("matris-10m-oam").name == "matris-10m-oam.yaml"
    monkeypatch.chdir(tmp_path)  # the documented path names the recipe outside the checkout too
    assert recipes.find("examples/configs/tiny.yaml") == tiny
    mine = tmp_path / "tiny"  # an existing file wins over the recipe of the same name
    mine.write_text("model: {}\n")
    assert recipes.find("tiny") == Path("tiny")


@pytest.mark.parametrize("name", ["no-such-recipe", "../configs/tiny", "a/b.yaml"])
def test_unknown_recipe_lists_the_recipes(name):
    with pytest.raises(MatRISInputError) as info:
        recipes.find(name)
    message = str(info.value)
    assert "\n" not in message and name in message and "tiny" in message and "matris-10m-oam" in message


def test_a_folder_is_not_a_recipe(tmp_path):
    with pytest.raises(MatRISInputError, match="is a folder"):
        recipes.find(tmp_path)


def test_train_config_reads_a_recipe_by_name():
    pytest.importorskip("yaml")
    from matris.train import TrainConfig

    config = TrainConfig.from_yaml("tiny")
    assert config.model.num_layers == 2
    assert all(Path(p).is_file() for p in config.data.train), config.data.train  # relative to the recipe file


# --------------------------------------------------------------------------- missing extras
def test_require_names_the_extra_in_one_line(monkeypatch):
    # both names: earlier tests of the suite may have imported lightning.pytorch already
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    with pytest.raises(MissingExtraError) as info:
        require("lightning.pytorch", "train", "training")
    assert str(info.value) == ("training needs the lightning package, which is not installed: "
                               "pip install 'matris-mlip[train]'")
    assert isinstance(info.value, ImportError) and isinstance(info.value, MatRISInputError)


def test_require_names_a_missing_dependency(monkeypatch):
    # the package is there but imports something that is not: still one line, still the extra
    def import_module(name):
        raise ModuleNotFoundError("No module named 'h5py'", name="h5py")

    monkeypatch.setattr("matris.extras.importlib", type(sys)("fake_importlib"), raising=True)
    monkeypatch.setattr("matris.extras.importlib.import_module", import_module, raising=False)
    with pytest.raises(MissingExtraError, match=r"whose dependency h5py is not installed: pip install "
                                                r"'matris-mlip\[sim\]'"):
        require("torch_sim", "sim", "batched simulation", package="torch-sim-atomistic")


@pytest.mark.parametrize("module, extra, call", [
    ("ijson", "data", "from matris.data.readers import _ijson; _ijson()"),
    ("ase_db_backends", "data", "from matris.data.readers import _connect_lmdb; from pathlib import Path; "
                                "_connect_lmdb(Path('x.aselmdb'))"),
    ("phonopy", "phonons", "from ase.build import bulk; from matris.simulate import phonons; phonons(bulk('Si'))"),
    ("lightning", "train", "import matris.train.run"),
    ("torch_sim", "sim", "import matris.simulate.batched"),
    ("yaml", "train", "from matris.train import TrainConfig; TrainConfig.from_yaml('tiny')"),
    ("matplotlib", "plot", "from matris.simulate.plots import _figure; _figure(1, (1, 1))"),
    ("pymatgen", "discovery", "from matris.discovery.energy import formation_energy_per_atom; "
                              "formation_energy_per_atom(-1.0, 'Si', {'Si': -1.0})"),
])
def test_missing_extra_is_one_line(module, extra, call):
    out = run_python(block_imports([module]) + call, cwd=ROOT)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("matris.errors.MissingExtraError: "), out.stderr[-2000:]
    assert last.endswith(f"pip install 'matris-mlip[{extra}]'")


@pytest.mark.slow
def test_core_runs_without_the_extras():  # 10-20 s: torch, the model and three simulations
    """The calculator, a relaxation and MD with none of the optional packages importable."""
    out = run_python(block_imports(OPTIONAL) + textwrap.dedent("""
        import warnings
        warnings.simplefilter("ignore")
        from ase.build import bulk
        from matris import MatRISCalculator
        from matris.simulate import md, relax
        atoms = bulk("Si", "diamond", a=5.43)
        atoms.rattle(0.05, seed=1)
        atoms.calc = MatRISCalculator()
        energy = atoms.get_potential_energy()
        result = relax(atoms, steps=2)
        md(bulk("Si", "diamond", a=5.43), steps=2, temperature=300)
        print("ok", energy, result.energy)
    """), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok")


# --------------------------------------------------------------------------- sdist and wheel
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sdist built from the tree, and the wheel built from the unpacked sdist (as
    ``python -m build`` does), with the environment's setuptools (no network)."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 (the test extra installs a newer one)")
    out_dir = tmp_path_factory.mktemp("dist")
    build = "from setuptools import build_meta as b; print(b.build_{}({!r}))"
    sdist = subprocess.run([sys.executable, "-c", build.format("sdist", str(out_dir))], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert sdist.returncode == 0, sdist.stderr[-3000:]
    sdist_path = out_dir / sdist.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist_path) as tar:
        # the "data" filter (no absolute paths or links out) where this Python has it
        tar.extractall(out_dir / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (source,) = (out_dir / "src").iterdir()
    wheel = subprocess.run([sys.executable, "-c", build.format("wheel", str(out_dir))], cwd=source,
                           capture_output=True, text=True, timeout=300)
    assert wheel.returncode == 0, wheel.stderr[-3000:]
    wheel_path = out_dir / wheel.stdout.strip().splitlines()[-1]
    return {"sdist": sdist_path, "wheel": wheel_path, "log": sdist.stdout + sdist.stderr + wheel.stdout + wheel.stderr,
            "dir": out_dir}


def test_build_has_no_packaging_warnings(built):
    for text in ("absent from the `packages`", "SetuptoolsDeprecationWarning", "License classifiers",
                 "project.license", "_DeprecatedConfig"):
        assert text not in built["log"], text


def test_wheel_contents(built):
    version = _version.__version__
    assert built["wheel"].name == f"matris_mlip-{version}-py3-none-any.whl"
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"matris_mlip-{version}.dist-info/METADATA").decode()
    for name in ["matris_mlip-{v}.dist-info/licenses/LICENSE", "matris/_version.py", "matris/recipes.py",
                 "matris/recipes_data/tiny.yaml", "matris/recipes_data/matris-10m-oam.yaml",
                 "matris/recipes_data/data/emt_train.extxyz", "matris/assets/matris-demo.pth.tar",
                 "matris/assets/matris-demo.md", "matris/lammps/src/pair_matris.cpp", "matris/kernels/__init__.py",
                 "matris/kernels/csrc/cpu/phi.cpp"]:
        assert name.format(v=version) in names, name
    assert not any(n.startswith(("tests/", "examples/", "docs/")) for n in names)
    for line in ["Name: matris-mlip", f"Version: {version}", "License-Expression: BSD-3-Clause",
                 "Project-URL: Repository, https://github.com/matris-mlip/matris-mlip"]:
        assert line in metadata, line
    assert "Requires-Dist: lightning" in metadata and 'extra == "train"' in metadata


# Where each source folder installs (pyproject.toml's package-dir): the whole tree of each must be in the wheel
INSTALLED_AS = {"matris": "matris", "kernels": "matris/kernels", "examples/configs": "matris/recipes_data"}


def package_sources() -> list[str]:
    """The files of the folders above, relative to the root: the ones git tracks in a checkout,
    every file (less bytecode) in an unpacked sdist, which has no git."""
    git = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--", *INSTALLED_AS], capture_output=True,
                         text=True) if (ROOT / ".git").exists() else None
    if git is not None and git.returncode == 0:
        # a file deleted in the working tree but not yet in git's index is not a source any more
        return [f for f in git.stdout.split("\0") if f and (ROOT / f).is_file()]
    return [str(f.relative_to(ROOT)) for folder in INSTALLED_AS for f in (ROOT / folder).rglob("*")
            if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".pyo")]


def test_wheel_has_every_module_and_data_file(built):
    """Every module and data file of matris/, kernels/ and examples/configs/ at its installed path:
    a subpackage or data pattern missing from pyproject.toml (matris.domain once was, and
    pair_style matris stopped with ModuleNotFoundError) fails here, not in a user's LAMMPS run."""
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = set(wheel.namelist())
    sources = package_sources()
    # the folders themselves must be found, or the comparison below proves nothing
    for folder, expected in [("matris/domain/", 3), ("kernels/csrc/cpu/", 5), ("examples/configs/data/", 2)]:
        assert sum(f.startswith(folder) for f in sources) >= expected, folder
    missing = []
    for source in sources:
        folder = max((f for f in INSTALLED_AS if source.startswith(f + "/")), key=len)
        installed = INSTALLED_AS[folder] + source[len(folder):]
        if installed not in names:
            missing.append(source if installed == source else f"{source} (as {installed})")
    assert not missing, ("not in the wheel; add the package to [tool.setuptools] packages or the pattern to "
                         f"[tool.setuptools.package-data] in pyproject.toml: {', '.join(sorted(missing))}")


def test_sdist_can_run_the_tests(built):
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for name in ["LICENSE", "pyproject.toml", "MANIFEST.in", "README.md", "mkdocs.yml", "tests/conftest.py",
                 "tests/test_packaging.py", "tests/fixtures/random-tiny.pth.tar", "examples/configs/tiny.yaml",
                 "examples/configs/data/emt_train.extxyz", "docs/index.md", "kernels/csrc/cpu/phi.cpp",
                 "benchmarks/cpu_speed.py", ".ci/run"]:
        assert name in names, name
    assert not any("__pycache__" in n for n in names)


def test_unpacked_wheel_finds_its_recipes_and_kernels(built, tmp_path):
    """The wheel's files, first on sys.path, from a folder outside the checkout."""
    site = tmp_path / "site"
    with zipfile.ZipFile(built["wheel"]) as wheel:
        wheel.extractall(site)
    out = run_python("""
        import matris, matris.recipes as r
        from matris.train import TrainConfig
        tiny = r.find("tiny")
        config = TrainConfig.from_yaml("tiny")
        import pathlib
        assert all(pathlib.Path(p).is_file() for p in config.data.train)
        import matris.kernels
        print(matris.__file__, tiny, matris.kernels.__file__, sep="\\n")
    """, env={"PYTHONPATH": str(site)}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split()
    assert all(line.startswith(str(site)) for line in lines), lines
