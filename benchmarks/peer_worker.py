"""One model of ``benchmarks/peers.py`` in a process of its own, in that model's environment.

    PYTHON peer_worker.py --module mace --dtype float32 --threads 2      # requests on stdin

It imports the builder module ``benchmarks/peer_models/<module>.py`` (its ``build(dtype, device,
**options)`` gives an ASE calculator), and answers one JSON request per line on stdin with one JSON
line on stdout (everything else goes to stderr):

- ``{"cmd": "efs", "structure": S, "seed": k}``: one energy + forces + stress call of the
  calculator on structure ``S`` (``numbers``, ``positions`` Å, ``cell`` Å, ``pbc``) rattled anew by
  0.01 Å with ``seed`` (a new geometry: the calculator cannot answer from its cache, and its
  neighbour list is rebuilt), as ``calc.calculate(atoms, ["energy", "forces", "stress"])``;
- ``{"cmd": "md", "structure": S}``: one ASE Velocity-Verlet step (1 fs, 300 K Maxwell-Boltzmann
  velocities drawn once per structure) of a dynamics object kept per structure, so that every timed
  step does one force call, as an MD script's steps do (each step starts from the forces the last
  one returned, as ``dyn.run(n)`` does); the first request makes the object and runs one untimed step.

Each answer has ``seconds`` (the call's wall time), ``rss_gb`` (the process's resident memory after
the call) and ``peak_rss_gb`` (its peak so far, ``ru_maxrss``). ``--oneshot NAME`` with
``--structure FILE`` (a JSON structure) instead builds the model, runs one ``efs`` call and prints
one line with the memory before and after: the fresh-process peak of that structure.

Only the standard library, numpy, ase and the model's own package are imported here: the worker
runs in each peer's environment, where our package is not installed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def set_threads(threads: int) -> None:
    """The same thread count for every framework a peer may use (the variables before any import)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ[var] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:  # a TensorFlow model
        pass


class Worker:
    def __init__(self, module: str, dtype: str, device: str, options: dict):
        sys.path.insert(0, str(HERE / "peer_models"))
        self.module = importlib.import_module(module)
        start = time.perf_counter()
        self.calc, self.info = self.module.build(dtype=dtype, device=device, **options)
        self.build_seconds = time.perf_counter() - start
        self.dynamics: dict[str, object] = {}

    @staticmethod
    def atoms(structure: dict, seed: int | None):
        import numpy as np
        from ase import Atoms

        atoms = Atoms(numbers=structure["numbers"], positions=structure["positions"], cell=structure["cell"],
                      pbc=structure["pbc"])
        if seed is not None:
            rng = np.random.default_rng(seed)
            atoms.positions += rng.normal(scale=0.01, size=atoms.positions.shape)
        return atoms

    def efs(self, structure: dict, seed: int = 0) -> dict:
        from ase.calculators.calculator import all_changes

        atoms = self.atoms(structure, seed)
        start = time.perf_counter()
        self.calc.calculate(atoms, ["energy", "forces", "stress"], all_changes)
        seconds = time.perf_counter() - start
        import numpy as np

        res = self.calc.results
        # some calculators keep the energy as a one-element array (CHGNet, the official MatRIS)
        return {"seconds": seconds, "energy": float(np.asarray(res["energy"]).reshape(-1)[0]),
                "max_force": float(np.abs(res["forces"]).max()),
                "stress0": float(np.asarray(res["stress"]).reshape(-1)[0])}

    def md(self, structure: dict, key: str) -> dict:
        if key not in self.dynamics:
            from ase import units
            from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
            from ase.md.verlet import VelocityVerlet

            atoms = self.atoms(structure, 12345)
            atoms.calc = self.calc
            import numpy as np

            MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
            dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
            self.dynamics[key] = (dyn, dyn.step())  # the first step also computes the starting forces
        dyn, forces = self.dynamics[key]
        # the step starts from the forces the last one ended with, as in `dyn.run(n)`: one force call
        # per step (the calculator is shared with the efs requests, so its cache cannot be relied on)
        start = time.perf_counter()
        forces = dyn.step(forces)
        seconds = time.perf_counter() - start
        self.dynamics[key] = (dyn, forces)
        return {"seconds": seconds}


def hello(worker: Worker, dtype: str) -> dict:
    mod = worker.module
    return {"ok": True, "name": mod.NAME, "package": getattr(mod, "PACKAGE", None), "dtype": dtype,
            "params": worker.info.get("params"), "published_params": getattr(mod, "PUBLISHED_PARAMS", None),
            "weights": worker.info.get("weights"), "note": worker.info.get("note", ""),
            "leaderboard_model": getattr(mod, "LEADERBOARD_MODEL", None), "python": sys.version.split()[0],
            "build_seconds": worker.build_seconds, "rss_gb": rss_gb(), "peak_rss_gb": peak_rss_gb()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--module", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--options", default="{}", help="JSON keyword arguments of the module's build()")
    p.add_argument("--oneshot", action="store_true", help="build, one efs call of --structure, print, exit")
    p.add_argument("--structure", help="with --oneshot: a JSON file of one structure")
    args = p.parse_args(argv)
    set_threads(args.threads)
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever the models print stays off the protocol's channel

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        worker = Worker(args.module, args.dtype, args.device, json.loads(args.options))
    except Exception as exc:  # noqa: BLE001 - the parent records the reason in the row
        reply({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return 1
    info = hello(worker, args.dtype)
    if args.oneshot:
        structure = json.loads(Path(args.structure).read_text())
        base = rss_gb()
        try:
            result = worker.efs(structure, seed=0)
        except Exception as exc:  # noqa: BLE001
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
            return 1
        reply({**info, **result, "base_rss_gb": base, "rss_gb": rss_gb(), "peak_rss_gb": peak_rss_gb()})
        return 0
    reply(info)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["cmd"] == "efs":
                result = worker.efs(req["structure"], req.get("seed", 0))
            elif req["cmd"] == "md":
                result = worker.md(req["structure"], req.get("key", "default"))
            else:
                raise ValueError(f"unknown request {req['cmd']!r}")
            reply({"ok": True, **result, "rss_gb": rss_gb(), "peak_rss_gb": peak_rss_gb()})
        except Exception as exc:  # noqa: BLE001
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
