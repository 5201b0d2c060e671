"""The official MatRIS 1.0.0 implementation in a process of its own, for side-by-side checks.

    python -m benchmarks.official --check --site SITE        # parity + timing self-check
    python -m benchmarks.official --check --threads 2 --repeat 3   # SITE from $MATRIS_OFFICIAL_SITE
    python -m benchmarks.official --check --site SITE --python OTHER/bin/python

From a benchmark::

    from benchmarks.official import OfficialWorker, save_official_checkpoint

    path = save_official_checkpoint(model, folder / "model.pth.tar")   # our MatRIS -> published layout
    with OfficialWorker(site=SITE) as official:                         # a persistent subprocess
        info = official.load(path, mode="torch", activation_checkpoint=False, dtype="float32", threads=2)
        result = official.evaluate(atoms)          # or extxyz=..., or positions/cell/numbers
        result["energy"], result["forces"], result["stress"], result["seconds"]

The official package (``pip download matris==1.0.0 --no-deps`` and unzip the wheel into a folder
SITE; ``site=``, ``--site SITE`` or ``$MATRIS_OFFICIAL_SITE`` say where) declares Python >= 3.12,
``nvalchemi-toolkit-ops`` and ``ninja``, but runs unchanged on Python 3.11 and torch 2.13 on CPU:
nothing in it needs 3.12 syntax, and ``nvalchemi-toolkit-ops`` (Warp neighbour lists) and ``ninja``
(``load_inline`` of its CUDA operators) are only reached on the CUDA ``mode="fast"`` path. Nothing
is installed or stubbed for it.

The worker is this module run as ``python -m benchmarks.official --worker`` from the checkout's
root with ``PYTHONPATH`` set to the official site only; once ``benchmarks.common`` is imported it
drops the checkout from ``sys.path`` and the editable-install finder of our package from
``sys.meta_path``, then checks that ``matris`` is the official one. Requests and replies follow the
worker protocol of ``benchmarks/common.py`` (one JSON line each way; everything the official code
prints goes to stderr; the prints while loading, e.g. ``MatRIS initialized with N parameters``,
come back as ``info["log"]``).

What matters when comparing speeds with the official code on CPU:

- ``mode``: ``"fast"`` (its default) and ``"torch"`` run the same eager PyTorch code on CPU: both
  the model (``fast = mode == "fast" and device.type == "cuda"``, model/model.py) and the graph
  converter (CUDA graph building only for ``mode="fast"`` on a CUDA device, graph/converter.py)
  fall back to it. ``torch.compile`` is used only on that CUDA fast path; nothing is compiled on
  CPU.
- ``activation_checkpoint`` (the calculator's default is ``True``): on CPU it wraps the whole
  forward pass in ``torch.utils.checkpoint`` (non-reentrant), so forces and stress recompute the
  forward pass; ``False`` is the fastest CPU setting.
- A calculator call includes ``AseAtomsAdaptor.get_structure`` and the graph converter (pymatgen's
  ``Structure.get_neighbor_list`` and NumPy); ``evaluate`` reports the converter's part apart as
  ``graph_seconds``.
- Memory: eager autograd keeps every intermediate; the worker's peak RSS (``peak_rss_gb``) for
  the rattled Si64 cell of the ``--check`` config is about 8 GB in float32 (12-15 GB once a float64
  call has run). ``keep_heap=True`` gives the worker the glibc setting our model can opt into, for
  a comparison under one allocator (on the 2-core development machine it changed the official
  Si64 call by under 1%).
- Geometry is float32: the converter stores fractional coordinates and the lattice as float32
  (graph/converter.py) and Cartesian positions are ``frac @ lattice`` in float32
  (model/processgraph.py). The official code has no float64 path; ``dtype="float64"`` here casts
  the model with ``Module.to`` and gives its graphs float64 fractional coordinates, lattice and
  images built from the same float64 inputs (a worker-side adapter; the official files are
  untouched), so that both implementations can be compared without float32 rounding.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import HERE, ROOT, Worker, WorkerError, serve, worker_env, write_json

SITE_VARIABLE = "MATRIS_OFFICIAL_SITE"
OfficialWorkerError = WorkerError  # the worker answered a request with an error, or died


def official_site(site: str | os.PathLike | None = None) -> Path:
    """The folder holding the unpacked official ``matris`` package: ``site`` (``--site SITE``), else
    ``$MATRIS_OFFICIAL_SITE``; neither, or a folder without it, is an error that says so."""
    site = site or os.environ.get(SITE_VARIABLE)
    if not site:
        raise SystemExit(f"where is the official MatRIS 1.0.0? pass --site SITE or set ${SITE_VARIABLE} (the "
                         "folder of its unpacked wheel: pip download matris==1.0.0 --no-deps, then unzip)")
    site = Path(site).resolve()
    if not (site / "matris" / "model" / "model.py").is_file():
        raise FileNotFoundError(f"no official matris package under {site}")
    return site


# ----------------------------------------------------------------------------- parent side
def save_official_checkpoint(model: Any, path: str | os.PathLike) -> Path:
    """Write our :class:`matris.MatRIS` ``model`` to ``path`` in the published layout
    (``{"config", "state_dict", "targets"}``, float32 CPU tensors), which the official
    ``MatRIS.load`` reads (it ignores ``targets``). Uses :meth:`matris.MatRIS.save`."""
    import torch

    return model.save(path, dtype=torch.float32)


def atoms_request(atoms: Any) -> dict[str, Any]:
    """An ``evaluate`` request for ASE ``atoms``: positions, cell, numbers and pbc as exact floats."""
    return {"positions": atoms.get_positions().tolist(), "cell": atoms.cell.array.tolist(),
            "numbers": [int(z) for z in atoms.numbers], "pbc": [bool(p) for p in atoms.pbc]}


class OfficialWorker(Worker):
    """A persistent subprocess running the official MatRIS code (see the module docstring).

    ``python``: the interpreter (it needs torch, ase and pymatgen); ``site``: the folder holding
    the official ``matris`` package (default ``$MATRIS_OFFICIAL_SITE``); ``stderr``: where the
    worker's stderr goes (default: ours). Use as a context manager, or call :meth:`close`;
    :meth:`request` sends any request, errors raise :class:`OfficialWorkerError`.
    """

    def __init__(self, python: str = sys.executable, site: str | os.PathLike | None = None,
                 stderr: Any = None):
        self.site = official_site(site)
        # from the checkout's root (benchmarks.common is imported from there), the site first after it
        super().__init__([python, "-m", "benchmarks.official", "--worker", "--site", self.site], name="official",
                         stderr=stderr, cwd=ROOT, env=worker_env(PYTHONPATH=str(self.site)))

    # -- requests
    def load(self, checkpoint: str | os.PathLike, mode: str = "torch", activation_checkpoint: bool = False,
             dtype: str = "float32", threads: int | None = None, keep_heap: bool | None = None,
             task: str = "efs") -> dict[str, Any]:
        """Build the official ``MatRISCalculator(checkpoint, task, device="cpu", mode,
        activation_checkpoint)``; ``dtype``: "float32" (the official one) or "float64" (see the module
        docstring); ``threads``: ``torch.set_num_threads``; ``keep_heap``: glibc keeps freed memory
        for reuse (``True``), the opt-in setting of ``matris.heap.keep_freed_memory``
        (``GLIBC_TUNABLES``), so that both can run under one allocator; ``False`` puts glibc's
        thresholds back; ``None`` leaves glibc's defaults (the official code as a user runs it). Returns ``params`` (the
        official count), ``log`` (what the official code printed), the settings and the versions."""
        return self.request("load", checkpoint=str(Path(checkpoint).resolve()), mode=mode,
                            activation_checkpoint=bool(activation_checkpoint), dtype=str(dtype).removeprefix("torch."),
                            threads=threads, keep_heap=keep_heap, task=task)

    def configure(self, mode: str | None = None, activation_checkpoint: bool | None = None,
                  dtype: str | None = None, threads: int | None = None,
                  keep_heap: bool | None = None) -> dict[str, Any]:
        """Change the loaded calculator's settings in place (``None``: leave as is)."""
        return self.request("configure", mode=mode, activation_checkpoint=activation_checkpoint,
                            dtype=None if dtype is None else str(dtype).removeprefix("torch."), threads=threads,
                            keep_heap=keep_heap)

    def evaluate(self, atoms: Any = None, *, extxyz: str | None = None, positions: Any = None, cell: Any = None,
                 numbers: Any = None, pbc: Any = True) -> dict[str, Any]:
        """Energy (eV), forces (eV/Å, ``[n, 3]``), stress (eV/Å³, Voigt ``[xx, yy, zz, yz, xz, xy]``)
        of one structure, given as ASE ``atoms``, an ``extxyz`` string (one frame; note extxyz
        stores positions to 1e-8 Å) or ``positions``/``cell``/``numbers``/``pbc``. ``seconds``: the
        wall time of the calculator call (graph building included); ``graph_seconds``: its
        graph converter part (pymatgen neighbour list and graph tensors); ``peak_rss_gb``: the
        worker's peak resident memory so far. Arrays come back as NumPy arrays."""
        import numpy as np

        if atoms is not None:
            req = atoms_request(atoms)
        elif extxyz is not None:
            req = {"extxyz": extxyz}
        else:
            req = {"positions": np.asarray(positions, dtype=float).tolist(),
                   "cell": np.asarray(cell, dtype=float).tolist(),
                   "numbers": [int(z) for z in numbers],
                   "pbc": np.broadcast_to(np.asarray(pbc, dtype=bool), 3).tolist()}
        out = self.request("evaluate", **req)
        out["forces"] = np.asarray(out["forces"], dtype=float)
        out["stress"] = np.asarray(out["stress"], dtype=float)
        return out


# ----------------------------------------------------------------------------- worker side
def _isolate_official(site: str) -> None:
    """Make ``import matris`` find only the official package under ``site``."""
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) not in (str(HERE), str(ROOT))]
    if site not in sys.path:
        raise ImportError(f"{site} is not on sys.path: start the worker with PYTHONPATH={site} (OfficialWorker does)")
    # our editable install maps matris (and matris.kernels) through a meta-path finder
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")
                        and "__editable__" not in getattr(f, "__name__", "")]
    import matris

    path = Path(matris.__file__).resolve()
    if Path(site).resolve() not in path.parents:
        raise ImportError(f"imported matris from {path}, not the official package under {site}")


class _Worker:
    """The official calculator and the request handlers (runs in the worker process)."""

    def __init__(self) -> None:
        self.calc = None
        self.graph_seconds = 0.0
        self.keep_heap = False

    def hello(self) -> dict[str, Any]:
        import ase
        import torch

        import matris

        return {"matris": matris.__version__, "matris_file": matris.__file__, "torch": torch.__version__,
                "ase": ase.__version__, "python": sys.version.split()[0], "threads": torch.get_num_threads()}

    def _wrap_converter(self) -> None:
        """Time graph building, and give graphs float64 geometry when the model is float64."""
        import torch

        model = self.calc.model
        converter = model.graph_converter
        original = converter.forward

        def forward(structure, *args, **kwargs):
            start = time.perf_counter()
            graph = original(structure, *args, **kwargs)
            dtype = next(model.parameters()).dtype
            if dtype != torch.float32:
                frac = kwargs.get("frac_coords")
                lattice = kwargs.get("lattice_matrix")
                graph.atom_frac_coord = torch.as_tensor(
                    structure.frac_coords if frac is None else frac, dtype=dtype).clone()
                graph.lattice = torch.as_tensor(
                    structure.lattice.matrix if lattice is None else lattice, dtype=dtype).clone()
                graph.neighbor_image = graph.neighbor_image.to(dtype)
            self.graph_seconds += time.perf_counter() - start
            return graph

        converter.forward = forward

    def _settings(self) -> dict[str, Any]:
        import torch

        return {"mode": self.calc.mode, "activation_checkpoint": self.calc.activation_checkpoint,
                "dtype": str(next(self.calc.model.parameters()).dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(), "keep_heap": self.keep_heap}

    def load(self, checkpoint: str, mode: str, activation_checkpoint: bool, dtype: str, threads: int | None,
             keep_heap: bool | None, task: str) -> dict[str, Any]:
        import contextlib
        import io

        from matris.applications import MatRISCalculator

        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            self.calc = MatRISCalculator(model=checkpoint, task=task, device="cpu", mode=mode,
                                         activation_checkpoint=activation_checkpoint)
        sys.stderr.write(log.getvalue())
        self._wrap_converter()
        settings = self.configure(dtype=dtype, threads=threads, keep_heap=keep_heap)
        return {"params": self.calc.model.get_params(), "log": log.getvalue(), **settings, **self.hello()}

    def configure(self, mode: str | None = None, activation_checkpoint: bool | None = None, dtype: str | None = None,
                  threads: int | None = None, keep_heap: bool | None = None) -> dict[str, Any]:
        import torch

        if self.calc is None:
            raise RuntimeError("no calculator: send 'load' first")
        if mode is not None:
            if mode not in ("fast", "torch"):
                raise ValueError(f"mode must be 'fast' or 'torch', got {mode!r}")
            self.calc.mode = mode
        if activation_checkpoint is not None:
            self.calc.activation_checkpoint = bool(activation_checkpoint)
        if dtype is not None:
            if dtype not in ("float32", "float64"):
                raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
            self.calc.model.to(getattr(torch, dtype))
        if threads:
            torch.set_num_threads(int(threads))
        if keep_heap is not None:
            self.keep_heap = _set_keep_heap(bool(keep_heap))
        self.calc.reset()
        return self._settings()

    def evaluate(self, extxyz: str | None = None, positions=None, cell=None, numbers=None,
                 pbc=True) -> dict[str, Any]:
        import io

        import numpy as np
        from ase import Atoms
        from ase.calculators.calculator import all_changes
        from ase.stress import full_3x3_to_voigt_6_stress

        if self.calc is None:
            raise RuntimeError("no calculator: send 'load' first")
        if extxyz is not None:
            from ase.io import read

            atoms = read(io.StringIO(extxyz), format="extxyz", index=0)
        else:
            atoms = Atoms(numbers=numbers, positions=positions, cell=cell, pbc=pbc)
        atoms.calc = None
        self.calc.reset()
        self.graph_seconds = 0.0
        start = time.perf_counter()
        self.calc.calculate(atoms, ["energy", "forces", "stress"], all_changes)
        seconds = time.perf_counter() - start
        results = self.calc.results
        stress = np.asarray(results["stress"], dtype=float)
        if stress.shape == (3, 3):
            stress = full_3x3_to_voigt_6_stress(stress)
        return {"energy": float(results["energy"]), "forces": np.asarray(results["forces"], dtype=float).tolist(),
                "stress": stress.tolist(), "seconds": seconds, "graph_seconds": self.graph_seconds,
                "natoms": len(atoms)}


def _set_keep_heap(keep: bool) -> bool:
    """glibc's malloc keeps freed memory (``M_MMAP_MAX = 0``, ``M_TRIM_THRESHOLD = 2 GiB - 1``) or
    goes back to its usual thresholds and trims, as ``matris.heap.set_keep`` does (copied:
    our package is not importable here). Returns whether keeping is on; False off glibc."""
    import ctypes
    import platform

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold, m_mmap_max = -1, -3, -4
    if keep:
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
    libc.mallopt(m_mmap_max, 65536)
    libc.mallopt(m_mmap_threshold, 32 << 20)
    libc.mallopt(m_trim_threshold, 64 << 20)
    libc.malloc_trim(0)
    return False


def worker_main(site: str) -> int:
    """Serve the official calculator's requests (``load``, ``configure``, ``evaluate``, ``hello``)
    by the worker protocol of ``benchmarks/common.py``; every answer carries ``peak_rss_gb``."""
    worker = _Worker()

    def start() -> dict[str, Any]:
        _isolate_official(site)
        return worker.hello()

    return serve(start, {"load": worker.load, "configure": worker.configure, "evaluate": worker.evaluate,
                         "hello": worker.hello})


# ----------------------------------------------------------------------------- self-check
def check(python: str, site: str, threads: int, repeat: int, keep_heap: bool = False) -> dict[str, Any]:
    """Our model and the official code on the same random weights: parity, then speed."""
    import tempfile

    import numpy as np
    import torch
    from ase.build import bulk
    from ase.calculators.calculator import all_changes
    from ase.units import GPa

    from matris import MatRIS, MatRISCalculator, MatRISConfig

    torch.set_num_threads(threads)
    if keep_heap:
        from matris import heap

        heap.set_keep(True)
    torch.manual_seed(0)
    config = MatRISConfig.published_10m()
    model = MatRIS(config).eval()
    atoms = bulk("Si", "diamond", a=5.43, cubic=True) * (2, 2, 2)
    atoms.rattle(stdev=0.05, seed=1)
    print(f"config: MatRISConfig.published_10m(); ours: {sum(p.numel() for p in model.parameters())} parameters")
    print(f"structure: rattled diamond Si{len(atoms)}; threads {threads}")

    def ours(calc):
        calc.reset()
        start = time.perf_counter()
        calc.calculate(atoms, ["energy", "forces", "stress"], all_changes)
        seconds = time.perf_counter() - start
        r = calc.results
        return {"energy": float(r["energy"]), "forces": np.asarray(r["forces"]), "stress": np.asarray(r["stress"]),
                "seconds": seconds}

    out: dict[str, Any] = {"config": config.to_dict(),
                           "natoms": len(atoms), "threads": threads, "parity": {}, "seconds": {}}
    with tempfile.TemporaryDirectory() as tmp, OfficialWorker(python=python, site=site) as official:
        path = save_official_checkpoint(model, Path(tmp) / "check.pth.tar")
        info = official.load(path, mode="torch", activation_checkpoint=False, dtype="float64", threads=threads)
        out["official"] = {k: info[k] for k in ("params", "log", "matris", "torch", "python")}
        print(f"official {info['matris']} ({info['matris_file']}) on Python {info['python']}, torch {info['torch']}")
        print("official load printed: " + " | ".join(info["log"].strip().splitlines()))

        print("\nparity (max |Δ|, ours - official):")
        for dtype in ("float64", "float32"):
            official.configure(dtype=dtype)
            a = ours(MatRISCalculator(model, dtype=dtype))
            b = official.evaluate(atoms)
            d = {"energy_eV": abs(a["energy"] - b["energy"]),
                 "energy_per_atom_eV": abs(a["energy"] - b["energy"]) / len(atoms),
                 "forces_eV_per_A": float(np.abs(a["forces"] - b["forces"]).max()),
                 "stress_eV_per_A3": float(np.abs(a["stress"] - b["stress"]).max()),
                 "stress_GPa": float(np.abs(a["stress"] - b["stress"]).max() / GPa),
                 "energy_ours_eV": a["energy"], "energy_official_eV": b["energy"],
                 "max_abs_force_eV_per_A": float(np.abs(b["forces"]).max()),
                 "max_abs_stress_GPa": float(np.abs(b["stress"]).max() / GPa)}
            out["parity"][dtype] = d
            print(f"  {dtype}: E {d['energy_eV']:.3e} eV ({d['energy_per_atom_eV']:.3e} eV/atom), "
                  f"F {d['forces_eV_per_A']:.3e} eV/Å, "
                  f"σ {d['stress_eV_per_A3']:.3e} eV/Å³ ({d['stress_GPa']:.3e} GPa)   "
                  f"[E {b['energy']:.6f} eV, max|F| {d['max_abs_force_eV_per_A']:.3f}, "
                  f"max|σ| {d['max_abs_stress_GPa']:.3f} GPa]")

        # the machine is shared and noisy: one call of each variant per round, medians over rounds
        print(f"\nfloat32 E+F+S call (s), {repeat} rounds of one call each after an untimed one; "
              f"glibc heap in both processes: {'kept (--keep-heap)' if keep_heap else 'as each ships'}:")
        official.configure(mode="torch", dtype="float32", keep_heap=keep_heap or None)
        calc = MatRISCalculator(model, dtype="float32")
        variants = {"ours (default CPU path)": lambda: ours(calc)}
        for ac in (False, True):
            def run(ac=ac):
                official.configure(activation_checkpoint=ac)
                return official.evaluate(atoms)
            variants[f"official mode=torch activation_checkpoint={ac}"] = run
        calls: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for name, fn in variants.items():
            fn()
        for _ in range(repeat):
            for name, fn in variants.items():
                calls[name].append(fn())
        for name, rs in calls.items():
            times = [r["seconds"] for r in rs]
            row = {"calls": times, "median": float(np.median(times)), "min": min(times)}
            if "graph_seconds" in rs[0]:
                row["graph_median"] = float(np.median([r["graph_seconds"] for r in rs]))
                row["peak_rss_gb"] = rs[-1]["peak_rss_gb"]
            out["seconds"][name] = row
            extra = (f"   graph {row['graph_median']:.3f}, worker peak RSS {row['peak_rss_gb']:.1f} GB"
                     if "graph_median" in row else "")
            print(f"  {name:48s} " + " ".join(f"{t:7.3f}" for t in times)
                  + f"   median {row['median']:.3f} min {row['min']:.3f}{extra}")
        out["keep_heap"] = bool(keep_heap)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="parity and timing of ours against the official code")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--site", default=None,
                   help="folder holding the official matris package (default: $MATRIS_OFFICIAL_SITE)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the official worker")
    p.add_argument("--threads", type=int, default=None, help="torch threads in both processes (default: torch's)")
    p.add_argument("--repeat", type=int, default=3, help="timed calls per variant")
    p.add_argument("--keep-heap", action="store_true",
                   help="glibc keeps freed memory in both processes (matris.heap.set_keep), not as each ships")
    p.add_argument("--json", default=None, help="write the check's numbers to this JSON file")
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(str(Path(args.site).resolve()))
    if args.check:
        import torch

        result = check(args.python, official_site(args.site), args.threads or torch.get_num_threads(), args.repeat,
                       args.keep_heap)
        if args.json:
            write_json(args.json, result)
    else:
        p.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
