"""NVE energy conservation of diamond Si with the ASE path (``matris.simulate.md``).

    python -m benchmarks.nve                          # the issue's set-up: 64 atoms, float64, 0.5 fs, 1 ps
    python -m benchmarks.nve --json results/nve_cpu.json --threads 1

Too long for the test suite on a 2-core CPU (2,000 steps of E+F for 64 atoms), so it runs
here; tests/test_simulate_physics.py checks the same thing on 8 atoms for 0.1 ps. Reports the
total-energy drift (meV/atom/ps, linear fit), and the same drift with the energy changes of
the steps where a pair crossed r_c or r_3 removed (the published architecture's energy
steps, see benchmarks/conservation.py), with the number and size of those steps.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.conservation import ConservationMonitor
from matris import MatRIS
from matris.simulate import md


def run(repeat=2, lattice=5.43, temperature=300.0, timestep=0.5, steps=2000, dtype="float64", seed=0, device="cpu"):
    from ase.build import bulk

    atoms = bulk("Si", "diamond", a=lattice, cubic=True).repeat(repeat)
    model = MatRIS.load(device=device, dtype=getattr(torch, dtype))
    monitor = ConservationMonitor(model.cutoff, model.three_body_cutoff)
    t0 = time.perf_counter()
    result = md(atoms, ensemble="nve", temperature=temperature, timestep=timestep, steps=steps, loginterval=50,
                seed=seed, model=model, device=device, dtype=dtype, callback=monitor, progress=True)
    wall = time.perf_counter() - t0
    report = monitor.report(timestep)
    return {"atoms": len(atoms), "lattice_A": lattice, "initial_temperature_K": temperature, "timestep_fs": timestep,
            "dtype": dtype, "device": device, "mean_temperature_K": float(result.column("temperature").mean()),
            "wall_s": wall, "steps_per_s": steps / wall, "ns_per_day": result.ns_per_day, **report.to_dict()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=2, help="cubic 8-atom cell repeated N×N×N (default 2: 64 atoms)")
    p.add_argument("--lattice", type=float, default=5.43)
    p.add_argument("--temperature", type=float, default=300.0, help="initial Maxwell–Boltzmann temperature, K")
    p.add_argument("--timestep", type=float, default=0.5, help="fs")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    r = run(args.repeat, args.lattice, args.temperature, args.timestep, args.steps, args.dtype, device=args.device)
    print(f"Si{r['atoms']} a={r['lattice_A']} Å, {r['dtype']}, {r['timestep_fs']} fs × {r['steps']} steps "
          f"({r['time_ps']:.3f} ps), mean T {r['mean_temperature_K']:.0f} K, {r['steps_per_s']:.2f} steps/s")
    print(f"  total-energy drift      {r['drift']:+.4f} meV/atom/ps   (span {r['span']:.4f} meV/atom)")
    print(f"  drift without crossings {r['smooth_drift']:+.5f} meV/atom/ps   (largest other step "
          f"{r['max_smooth_step']:.2e} meV/atom)")
    print(f"  cutoff crossings        {r['crossings']} steps, sum {r['crossing_energy']:+.4f} meV/atom, "
          f"largest {r['max_crossing_jump']:.4f} meV/atom")
    if args.json:
        from benchmarks.common import provenance, write_json
        from matris.bundled import DEMO_CHECKPOINT

        r["meta"] = provenance(argv, "matris-demo", DEMO_CHECKPOINT)
        write_json(args.json, r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
