"""Batched relaxation with torch-sim against the one-by-one ASE loop: structures/s.

    python -m benchmarks.simulate                                  # CPU, 16 × Si8, float32
    python -m benchmarks.simulate --device cuda --structures 256 --repeat 2 --json sim.json

Both paths relax the same structures with the same protocol (FIRE, Fréchet cell filter,
fmax 0.05 eV/Å, at most 500 steps): ``matris.simulate.relax`` one structure after another
through the ASE calculator, and ``matris.simulate.relax_batch`` with all of them in one
torch-sim batch (converged ones leave it). Structures: diamond Si (cubic 8-atom cell
repeated --repeat times per side), lattice constants spread by ±2% and rattled by 0.05 Å,
relaxed with the bundled demo model. Timing excludes model loading; each path gets a short
warm-up first. The table also gives the largest difference of the final energies.
Needs ase and torch-sim-atomistic (pip install 'matris-mlip[sim]').
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import synchronize
from matris import MatRIS


def structures(n: int, repeat: int = 1, seed: int = 0):
    from ase.build import bulk

    out = []
    for k in range(n):
        atoms = bulk("Si", "diamond", a=5.43 * (1 + 0.01 * (k % 5 - 2)), cubic=True).repeat(repeat)
        atoms.rattle(0.05, seed=seed + k)
        out.append(atoms)
    return out


def run(n=16, repeat=1, device="cpu", dtype="float32", fmax=0.05, steps=500, max_atoms=None, ase=True):
    from matris.simulate import relax, relax_batch

    model = MatRIS.load(device=device, dtype=getattr(torch, dtype))
    items = structures(n, repeat)
    rows = {}
    relax_batch(structures(2, repeat, seed=100), model=model, steps=3)  # warm-up
    synchronize(device)
    t0 = time.perf_counter()
    batched = relax_batch(items, fmax=fmax, steps=steps, model=model, max_atoms=max_atoms)
    synchronize(device)
    tb = time.perf_counter() - t0
    rows["torch-sim batch"] = {"s": tb, "structures_per_s": n / tb, "converged": sum(r.converged for r in batched),
                               "mean_steps": None}
    if ase:
        relax(structures(1, repeat, seed=100)[0], model=model, steps=3)  # warm-up
        t0 = time.perf_counter()
        single = [relax(s, fmax=fmax, steps=steps, model=model) for s in items]
        synchronize(device)
        ta = time.perf_counter() - t0
        rows["ASE one by one"] = {"s": ta, "structures_per_s": n / ta, "converged": sum(r.converged for r in single),
                                  "mean_steps": float(np.mean([r.steps for r in single]))}
        diff = max(abs(a.energy_per_atom - b.energy_per_atom) for a, b in zip(single, batched))
    else:
        diff = None
    return {"device": str(device), "name": torch.cuda.get_device_name() if "cuda" in str(device) else "cpu",
            "threads": torch.get_num_threads(), "dtype": dtype, "structures": n, "atoms_each": 8 * repeat ** 3,
            "fmax": fmax, "max_atoms": max_atoms, "rows": rows,
            "speedup": rows["ASE one by one"]["s"] / tb if ase else None,
            "max_energy_difference_meV_per_atom": None if diff is None else 1e3 * diff}


def print_table(r):
    print(f"{r['structures']} × Si{r['atoms_each']} ({r['dtype']}, {r['device']}, {r['name']}, "
          f"{r['threads']} threads), fmax {r['fmax']} eV/Å")
    print(f"{'method':18s} {'time (s)':>9s} {'structures/s':>13s} {'converged':>10s} {'mean steps':>11s}")
    for name, row in r["rows"].items():
        steps = "-" if row["mean_steps"] is None else f"{row['mean_steps']:.1f}"
        print(f"{name:18s} {row['s']:9.2f} {row['structures_per_s']:13.3f} "
              f"{row['converged']:>6d}/{r['structures']:<3d} {steps:>11s}")
    if r["speedup"] is not None:
        print(f"batched / one-by-one: {r['speedup']:.2f}×; largest final-energy difference "
              f"{r['max_energy_difference_meV_per_atom']:.3f} meV/atom")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--structures", type=int, default=16)
    p.add_argument("--repeat", type=int, default=1, help="Si8 cell repeated N×N×N (default 1)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--fmax", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--max-atoms", type=int, default=None, help="batch budget in atoms (default: all at once)")
    p.add_argument("--no-ase", action="store_true", help="skip the one-by-one ASE loop")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    r = run(args.structures, args.repeat, args.device, args.dtype, args.fmax, args.steps, args.max_atoms,
            ase=not args.no_ase)
    print_table(r)
    if args.json:
        from benchmarks.common import provenance, write_json
        from matris.bundled import DEMO_CHECKPOINT

        r["meta"] = provenance(argv, "matris-demo", DEMO_CHECKPOINT)
        write_json(args.json, r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
