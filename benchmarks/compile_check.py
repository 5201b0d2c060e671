"""model.compile() with a real code generator: graphs compiled over MD-like steps, compile time,
and compiled-vs-eager agreement in float32 and float64.

    python -m benchmarks.compile_check                        # Inductor, both dtypes
    python -m benchmarks.compile_check --backend aot_eager --dtypes float64
    python -m benchmarks.compile_check --json benchmarks/results/compile_check_cpu.json

The model is the small SH fixture checkpoint (tests/fixtures/official-v0.9/small_sh_float64).
Each step is a rattled diamond-Si cell of 8 to 48 atoms (the numbers of atoms, bonds and
angles change every step), compiled with ``fullgraph=True`` and dynamic shapes, and compared
with the eager composed ops (``kernel_backend="torch"``): the error is the largest of the
energy, force and stress errors, each relative to that quantity's largest magnitude. The
test suite checks the same with the ``aot_eager`` backend (no code generation), which is what
decides recompilations and graph breaks; this script measures what Inductor adds.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from benchmarks.common import ROOT, provenance, write_json
from matris import GraphBatch, MatRIS
from matris.structures import to_system

FIXTURE = ROOT / "tests" / "fixtures" / "official-v0.9" / "small_sh_float64" / "checkpoint.pth.tar"


def load_fixture_model(dtype: torch.dtype) -> MatRIS:
    """The small SH fixture checkpoint in ``dtype``."""
    return MatRIS.from_checkpoint(FIXTURE).to(dtype)


def evaluate(model: MatRIS, systems):
    """The model's output for a list of AtomicSystems, in the model's dtype."""
    graph = GraphBatch.from_systems(list(systems), model.cutoff, model.three_body_cutoff, dtype=model.dtype)
    return model(graph)


def rattled_si(k: int, rng):
    """Cells of 8 to 48 atoms (as tests/test_compile.py's): every step changes the numbers of
    atoms, bonds and angles."""
    from ase.build import bulk

    atoms = bulk("Si", "diamond", a=5.43, cubic=True).repeat((1 + k % 3, 1 + (k // 3) % 2, 1))
    atoms.positions += rng.normal(scale=0.1, size=atoms.positions.shape)
    return to_system(atoms)


def run(dtype: torch.dtype, backend: str, steps: int) -> dict:
    import torch._dynamo

    torch._dynamo.reset()
    model = load_fixture_model(dtype).compile(fullgraph=True, backend=backend)
    eager = load_fixture_model(dtype)
    eager.options.kernels = "torch"
    torch._dynamo.utils.counters.clear()
    rng = np.random.default_rng(0)
    errors, times = [], []
    for k in range(steps):
        s = [rattled_si(k, rng)]
        t0 = time.perf_counter()
        got = evaluate(model, s)
        times.append(time.perf_counter() - t0)
        want = evaluate(eager, s)
        errors.append(max(((getattr(got, q) - getattr(want, q)).abs().max() / getattr(want, q).abs().max()).item()
                          for q in ("energy", "forces", "stress")))
    return {"dtype": str(dtype).removeprefix("torch."), "backend": backend, "steps": steps,
            "first_call_s": times[0], "later_calls_median_s": float(np.median(times[1:])),
            "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(torch._dynamo.utils.counters["graph_break"].values())),
            "max_rel_error_vs_eager": max(errors)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--dtypes", nargs="*", default=["float32", "float64"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = []
    for name in args.dtypes:
        r = run(getattr(torch, name), args.backend, args.steps)
        rows.append(r)
        print(f"{r['dtype']:8s} {r['backend']:10s} first call {r['first_call_s']:.0f} s, "
              f"later {r['later_calls_median_s']:.3f} s; {r['graphs']} graph(s), "
              f"{r['graph_breaks']} graph breaks over {r['steps']} steps; "
              f"max relative error vs eager {r['max_rel_error_vs_eager']:.1e}")
    if args.json:
        write_json(args.json, {"meta": provenance(argv, model_name="small_sh_float64 fixture"), "rows": rows})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
