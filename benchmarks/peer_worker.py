"""One model of ``benchmarks/peers.py`` in a process of its own, in that model's environment.

    PYTHON -I benchmarks/peer_worker.py --module mace_mpa --dtype float32 --threads 2   # requests on stdin

It loads the builder module ``benchmarks/peer_models/<module>.py`` (its ``build(dtype, device,
**options)`` gives an ASE calculator and an info dict; docs/developing/peer-models.md), says hello
(the model's name, parameters, build time, and the resident memory after building), and answers
the requests of the worker protocol (``benchmarks/common.py``: one JSON line each way):

- ``{"cmd": "efs", "structure": S, "seed": k}``: one energy + forces + stress call of the
  calculator on structure ``S`` (``numbers``, ``positions`` Å, ``cell`` Å, ``pbc``) rattled anew by
  0.01 Å with ``seed`` (a new geometry: the calculator cannot answer from its cache, and its
  neighbour list is rebuilt), as ``calc.calculate(atoms, ["energy", "forces", "stress"])``;
- ``{"cmd": "md", "structure": S, "key": K}``: one ASE Velocity-Verlet step (1 fs, 300 K
  Maxwell-Boltzmann velocities drawn once per structure) of a dynamics object kept per key, so that
  every timed step does one force call, as an MD script's steps do (each step starts from the
  forces the last one returned, as ``dyn.run(n)`` does); the first request makes the object and
  runs one untimed step.

Each answer has ``seconds`` (the call's wall time), ``rss_gb`` (the process's resident memory after
the call) and ``peak_rss_gb`` (its peak so far). A fresh worker's hello and one ``efs`` answer give
the fresh-process peak memory of a structure.

It runs under the peer's Python, where this checkout's ``benchmarks`` and ``matris`` are not
importable: it imports the standard library, numpy, ase and the model's own package, and loads
``common.py`` and the builder module by their file locations. ``-I`` (isolated mode) keeps this
folder off ``sys.path``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _common():
    """``benchmarks/common.py`` by its location (the checkout is not importable here)."""
    spec = importlib.util.spec_from_file_location("benchmarks_common", HERE / "common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


common = _common()


class Model:
    """The built calculator of one builder module and the requests it answers."""

    def __init__(self, module: str, dtype: str, device: str, options: dict):
        self.module = common.load_module(f"peer_model_{module}", HERE / "peer_models" / f"{module}.py")
        (self.calc, self.info), self.build_seconds = common.timed(self.module.build, dtype=dtype, device=device,
                                                                  **options)
        self.dtype = dtype
        self.dynamics: dict[str, tuple] = {}

    def hello(self) -> dict:
        mod = self.module
        return {"name": mod.NAME, "package": getattr(mod, "PACKAGE", None), "dtype": self.dtype,
                "params": self.info.get("params"), "published_params": getattr(mod, "PUBLISHED_PARAMS", None),
                "weights": self.info.get("weights"), "note": self.info.get("note", ""),
                "leaderboard_model": getattr(mod, "LEADERBOARD_MODEL", None), "python": sys.version.split()[0],
                "build_seconds": self.build_seconds}

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
        import numpy as np
        from ase.calculators.calculator import all_changes

        atoms = self.atoms(structure, seed)
        _, seconds = common.timed(self.calc.calculate, atoms, ["energy", "forces", "stress"], all_changes)
        res = self.calc.results
        # some calculators keep the energy as a one-element array (CHGNet, the official MatRIS)
        return {"seconds": seconds, "energy": float(np.asarray(res["energy"]).reshape(-1)[0]),
                "max_force": float(np.abs(res["forces"]).max()),
                "stress0": float(np.asarray(res["stress"]).reshape(-1)[0])}

    def md(self, structure: dict, key: str = "default") -> dict:
        if key not in self.dynamics:
            import numpy as np
            from ase import units
            from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
            from ase.md.verlet import VelocityVerlet

            atoms = self.atoms(structure, 12345)
            atoms.calc = self.calc
            MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
            dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
            self.dynamics[key] = (dyn, dyn.step())  # the first step also computes the starting forces
        dyn, forces = self.dynamics[key]
        # the step starts from the forces the last one ended with, as in `dyn.run(n)`: one force call
        # per step (the calculator is shared with the efs requests, so its cache cannot be relied on)
        forces, seconds = common.timed(dyn.step, forces)
        self.dynamics[key] = (dyn, forces)
        return {"seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--module", required=True, help="a builder module of benchmarks/peer_models/")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--options", default="{}", help="JSON keyword arguments of the module's build()")
    args = p.parse_args(argv)
    common.set_threads(args.threads)
    model: list[Model] = []

    def start() -> dict:
        model.append(Model(args.module, args.dtype, args.device, json.loads(args.options)))
        return model[0].hello()

    return common.serve(start, {"efs": lambda **r: model[0].efs(**r), "md": lambda **r: model[0].md(**r)})


if __name__ == "__main__":
    sys.exit(main())
