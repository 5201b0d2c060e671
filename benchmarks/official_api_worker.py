"""One side of ``benchmarks/official_api.py``: the official MatRIS public API, in one environment.

    PYTHON -I benchmarks/official_api_worker.py --threads 2     # JSON requests on stdin, one per line

This file is written only against the public API of the official MatRIS 1.0.0 package (its README
and tests): ``matris.applications.base.MatRISCalculator``, ``matris.applications.relax.StructOptimizer``,
``matris.applications.MolecularDynamics``, ``matris.applications.torchsim.MatRISTorchSimModel``,
``matris.model.MatRIS`` (``MatRIS.load``, ``model.graph_converter``, ``model([graphs], task, mode)``).
The same file runs unchanged in the official environment and in ours (``import matris`` is whichever
package that environment has); of this repository it loads only ``benchmarks/common.py`` (the
standard library only), by its file location, for the worker protocol: one JSON object a line each
way, everything else on stderr. ``-I`` (isolated mode) keeps this folder off ``sys.path`` (it holds
modules named like packages: ``tables.py`` would shadow PyTables, which torch-sim imports).

Requests:

- ``{"cmd": "hello"}``: versions and where ``matris`` was imported from;
- ``{"cmd": "make_checkpoint", "config": {...}, "seed": 0, "path": P, "reference_elements": 94}``:
  ``MatRIS(**config)`` with the constructor's random initialisation under ``torch.manual_seed(seed)``,
  plus a 94-element ``AtomRef`` (random, the ``nn.Linear`` initialisation) as the official
  ``MatRIS.from_dict`` rebuilds it for a published checkpoint, saved the official way
  (``torch.save({"config": model.config, "state_dict": model.state_dict()}, P)``). Official side only
  (``matris.model.reference_energy`` is the official module);
- ``{"cmd": "setup", "case": C, "mode": M, "checkpoint": P, ...}``: builds the case's object
  (calculator, optimizer, MD, TorchSim model, model) and runs it once untimed (warm-up);
- ``{"cmd": "run", "case": C, "mode": M, ...}``: one timed run; the answer carries the numbers
  (lists of floats, exact) and ``seconds``.

Structures arrive as ``{"numbers", "positions", "cell", "pbc"}`` (built by the parent, so both sides
get the same floats); MD requests carry the initial ``momenta``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path


def _common():
    """``benchmarks/common.py`` by its location (the checkout is not importable here)."""
    spec = importlib.util.spec_from_file_location("benchmarks_common", Path(__file__).with_name("common.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


common = _common()


def to_atoms(s: dict):
    from ase import Atoms

    atoms = Atoms(numbers=s["numbers"], positions=s["positions"], cell=s["cell"], pbc=s["pbc"])
    if s.get("momenta") is not None:
        atoms.set_momenta(s["momenta"], apply_constraint=False)
    return atoms


def tolist(x):
    import numpy as np

    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=float).tolist()


class Worker:
    def __init__(self, threads: int):
        self.threads = threads
        self.objects: dict = {}

    # ------------------------------------------------------------------ info
    def hello(self) -> dict:
        import ase
        import numpy
        import torch

        import matris

        try:
            from importlib.metadata import version

            torch_sim = version("torch-sim-atomistic")
        except Exception:  # noqa: BLE001 - optional
            torch_sim = None
        dist = None
        for name in ("matris", "matris-mlip"):
            try:
                from importlib.metadata import version

                dist = f"{name} {version(name)}"
                break
            except Exception:  # noqa: BLE001
                continue
        return {"matris": getattr(matris, "__version__", None), "matris_dist": dist, "matris_file": matris.__file__,
                "torch": torch.__version__, "ase": ase.__version__, "numpy": numpy.__version__,
                "torch_sim": torch_sim, "python": sys.version.split()[0], "threads": torch.get_num_threads(),
                "executable": sys.executable}

    def make_checkpoint(self, config: dict, seed: int, path: str, reference_elements: int | None = 94) -> dict:
        import torch

        from matris.model import MatRIS

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = MatRIS(**config)
            if reference_elements:
                from matris.model.reference_energy import AtomRef  # the official module (from_dict's class)

                model.reference_energy = AtomRef(is_intensive=model.config["is_intensive"],
                                                 max_num_elements=reference_elements)
        torch.save({"config": model.config, "state_dict": model.state_dict()}, path)
        return {"path": path, "params": sum(p.numel() for p in model.parameters())}

    # ------------------------------------------------------------------ cases
    def setup(self, case: str, mode: str, checkpoint: str, **req) -> dict:
        import contextlib
        import io

        log = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(log):
            if case == "calculator":
                from matris.applications.base import MatRISCalculator

                obj = MatRISCalculator(checkpoint, task="efsm", device="cpu", mode=mode, activation_checkpoint=False)
            elif case == "relax":
                from matris.applications.relax import StructOptimizer

                obj = StructOptimizer(checkpoint, task="efs", optimizer="FIRE", device="cpu", mode=mode)
            elif case == "md":
                from matris.applications import MolecularDynamics

                obj = MolecularDynamics(to_atoms(req["structure"]), model=checkpoint, ensemble="nvt", temperature=300,
                                        timestep=1, task="efs", device="cpu", mode=mode)
            elif case == "torchsim":
                from matris.applications.torchsim import MatRISTorchSimModel

                obj = MatRISTorchSimModel(checkpoint, target="efs", device="cpu", mode=mode)
            elif case == "model":
                from matris.model import MatRIS

                obj = MatRIS.load(model_name=checkpoint, device="cpu")
            else:
                raise ValueError(f"unknown case {case!r}")
        load_seconds = time.perf_counter() - t0
        sys.stderr.write(log.getvalue())
        self.objects[(case, mode)] = obj
        warm = self.run(case, mode, warmup=True, **req)
        return {"load_seconds": load_seconds, "log": log.getvalue(), "warmup_seconds": warm["seconds"],
                "params": self._params(obj)}

    @staticmethod
    def _params(obj) -> int | None:
        """Parameters of the case object's MatRIS model (calculator.model, optimizer.calculator.model,
        md.atoms.calc.model, torchsim.model, or the model itself)."""
        import torch

        for path in ("model", "calculator.model", "atoms.calc.model", ""):
            inner = obj
            for attr in filter(None, path.split(".")):
                inner = getattr(inner, attr, None)
            if isinstance(inner, torch.nn.Module):
                return sum(p.numel() for p in inner.parameters())
        return None

    def run(self, case: str, mode: str, warmup: bool = False, **req) -> dict:
        obj = self.objects[(case, mode)]
        return getattr(self, f"_run_{case}")(obj, warmup=warmup, **req)

    def _run_calculator(self, calc, structure: dict, warmup: bool = False, **_) -> dict:
        atoms = to_atoms(structure)
        calc.reset()  # the same geometry every round: compute, do not answer from the cache
        atoms.calc = calc
        t0 = time.perf_counter()
        energy = atoms.get_potential_energy()
        forces = atoms.get_forces()
        stress = atoms.get_stress()          # Voigt, eV/Å^3 (ASE)
        magmoms = atoms.get_magnetic_moments()
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "energy": float(energy), "forces": tolist(forces), "stress": tolist(stress),
                "magmoms": tolist(magmoms), "natoms": len(atoms)}

    def _run_relax(self, optimizer, structure: dict, steps: int, fmax: float = 0.05, warmup: bool = False,
                   **_) -> dict:
        atoms = to_atoms(structure)
        optimizer.calculator.reset()
        t0 = time.perf_counter()
        result = optimizer.relax(atoms, steps=1 if warmup else steps, fmax=fmax, relax_cell=True, verbose=False)
        seconds = time.perf_counter() - t0
        final, traj = result["final_structure"], result["trajectory"]
        return {"seconds": seconds, "frames": len(traj), "energies": [float(e) for e in traj.energies],
                "final_energy": float(traj.energies[-1]), "positions": tolist(final.cart_coords),
                "cell": tolist(final.lattice.matrix), "final_type": type(final).__name__}

    def _run_md(self, md, structure: dict, steps: int, warmup: bool = False, **_) -> dict:
        atoms = to_atoms(structure)
        md.set_atoms(atoms)
        md.atoms.calc.reset()
        energies = []
        md.dyn.attach(lambda: energies.append((float(md.atoms.get_potential_energy()),
                                                float(md.atoms.get_kinetic_energy()))), interval=1)
        n = 1 if warmup else steps
        t0 = time.perf_counter()
        md.run(n)
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "steps": n, "seconds_per_step": seconds / n,
                "potential_energies": [e for e, _ in energies], "kinetic_energies": [k for _, k in energies],
                "positions": tolist(md.atoms.get_positions()), "momenta": tolist(md.atoms.get_momenta()),
                "nsteps": int(md.dyn.nsteps)}

    def _run_torchsim(self, model, structures: list, warmup: bool = False, **_) -> dict:
        import torch
        import torch_sim as ts

        state = ts.io.atoms_to_state([to_atoms(s) for s in structures], device=model.device, dtype=torch.float32)
        t0 = time.perf_counter()
        out = model(state)
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "keys": sorted(out), "energy": tolist(out["energy"]),
                "forces": tolist(out["forces"]), "stress": tolist(out["stress"]),
                "natoms": [len(s["numbers"]) for s in structures]}

    def _run_model(self, model, structure: dict, warmup: bool = False, **_) -> dict:
        from pymatgen.core import Lattice, Structure

        s = structure
        struct = Structure(Lattice(s["cell"]), s["numbers"], s["positions"], coords_are_cartesian=True)
        t0 = time.perf_counter()
        graph = model.graph_converter(struct)
        t1 = time.perf_counter()
        out = model([graph, graph], task="efsm", mode="torch")
        t2 = time.perf_counter()
        return {"seconds": t2 - t0, "graph_seconds": t1 - t0, "forward_seconds": t2 - t1,
                "e": tolist(out["e"]), "f": [tolist(f) for f in out["f"]], "s": [tolist(x) for x in out["s"]],
                "m": [tolist(m) for m in out["m"]], "keys": sorted(out)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    common.set_threads(args.threads)
    worker = Worker(args.threads)
    return common.serve(worker.hello, {"hello": worker.hello, "make_checkpoint": worker.make_checkpoint,
                                       "setup": worker.setup, "run": worker.run})


if __name__ == "__main__":
    sys.exit(main())
