"""pair_style matris in LAMMPS: speed on 1, 2 and 4 MPI ranks, and NVE energy conservation.

    python benchmarks/lammps.py --json benchmarks/results/lammps_cpu.json
    python benchmarks/lammps.py --sizes 1000 4096 --ranks 1 2 --steps 3
    python benchmarks/lammps.py --device cuda --sizes 1000 8000 20384   # on a GPU machine
    python benchmarks/lammps.py --nve-only --json out.json

Speed: diamond Si supercells (cubic 8-atom cells repeated, rattled by velocities at 300 K),
``--steps`` velocity-Verlet steps of 1 fs after one step of warm-up, the bundled model
(``matris export lammps matris-demo``) in float32, LAMMPS's own loop time. Rank 0's model
uses all cores (``threads``); the other ranks sleep while it runs. Reported per run:
steps/s, ns/day, and LAMMPS's ghost atoms per local atom (which the model does not use: rank 0
evaluates the whole periodic system, so more ranks divide LAMMPS's work, not the model's).

NVE (``--nve``, on by default): the set-up of ``benchmarks/nve.py`` (64-atom Si, a = 5.43 Å,
300 K, 0.5 fs, 1 ps, float64) run in LAMMPS with ``fix nve``; the total-energy drift is the
slope of a straight-line fit, in meV/atom/ps, next to the ASE run's of
``benchmarks/results/nve_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent


def cells_for(n_atoms: int) -> tuple[int, int, int]:
    """Repetitions (nx, ny, nz) of the 8-atom cubic cell for exactly ``n_atoms`` atoms, as cubic as possible."""
    cells = n_atoms // 8
    if cells * 8 != n_atoms:
        raise SystemExit(f"--sizes: {n_atoms} is not a multiple of 8")
    best = None
    for nx in range(1, cells + 1):
        for ny in range(nx, cells // nx + 1):
            if cells % (nx * ny) == 0:
                nz = cells // (nx * ny)
                if nz >= ny:
                    score = nz - nx
                    if best is None or score < best[0]:
                        best = (score, (nx, ny, nz))
    return best[1]


def run_lmp(script: str, ranks: int, workdir: Path, env: dict) -> str:
    (workdir / "in.lmp").write_text(script)
    cmd = [str(BIN / "lmp"), "-in", "in.lmp", "-log", "log.lammps"]
    if ranks > 1:
        cmd = [str(BIN / "mpirun"), "-np", str(ranks)] + cmd
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"lmp failed ({ranks} ranks):\n{(proc.stdout + proc.stderr)[-2000:]}")
    return (workdir / "log.lammps").read_text()


def speed_script(model: Path, reps, steps: int, device: str, dtype: str, threads: int) -> str:
    nx, ny, nz = reps
    return f"""units metal
atom_style atomic
lattice diamond 5.43
region box block 0 {nx} 0 {ny} 0 {nz}
create_box 1 box
create_atoms 1 box
mass 1 28.0855
pair_style matris {model} device {device} dtype {dtype} threads {threads}
pair_coeff * * Si
velocity all create 300 4928459 loop geom
fix nve all nve
timestep 0.001
thermo {steps}
run 1
run {steps}
"""


def speed(model, sizes, ranks_list, steps, device, dtype, threads, env) -> list[dict]:
    rows = []
    for n in sizes:
        for ranks in ranks_list:
            with tempfile.TemporaryDirectory() as tmp:
                log = run_lmp(speed_script(model, cells_for(n), steps, device, dtype, threads), ranks, Path(tmp), env)
            loops = re.findall(r"Loop time of ([\d.eE+-]+) on (\d+) procs for (\d+) steps with (\d+) atoms", log)
            seconds, _, nsteps, atoms = loops[-1]
            ghost = re.findall(r"Nghost:\s+([\d.eE+-]+) ave", log)[-1]
            local = re.findall(r"Nlocal:\s+([\d.eE+-]+) ave", log)[-1]
            sps = int(nsteps) / float(seconds)
            row = dict(atoms=int(atoms), ranks=ranks, steps=int(nsteps), seconds=float(seconds), steps_per_s=sps,
                       ns_per_day=sps * 1.0 * 86400 * 1e-6, ghost_per_local=float(ghost) / float(local))
            rows.append(row)
            print(f"{row['atoms']:7d} atoms  {ranks} ranks  {sps:8.3f} steps/s  {row['ns_per_day']:8.4f} ns/day  "
                  f"ghosts/local {row['ghost_per_local']:.2f}", flush=True)
    return rows


def nve(model, env, steps=2000, timestep_fs=0.5) -> dict:
    script = f"""units metal
atom_style atomic
lattice diamond 5.43
region box block 0 2 0 2 0 2
create_box 1 box
create_atoms 1 box
mass 1 28.0855
pair_style matris {model} device cpu dtype float64
pair_coeff * * Si
velocity all create 300 12345 loop geom
fix nve all nve
timestep {timestep_fs / 1000}
thermo 1
thermo_style custom step time temp pe etotal
thermo_modify format float %24.17g
run {steps}
"""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        log = run_lmp(script, 1, Path(tmp), env).splitlines()
    wall = time.perf_counter() - t0
    start = next(i for i, line in enumerate(log) if line.split()[:2] == ["Step", "Time"])
    data = np.array([[float(v) for v in line.split()] for line in log[start + 1:start + 2 + steps]])
    time_ps, temp, etot = data[:, 1], data[:, 2], data[:, 4]
    n_atoms = 64
    e = 1000 * etot / n_atoms  # meV/atom
    drift = float(np.polyfit(time_ps, e, 1)[0])
    out = dict(atoms=n_atoms, steps=steps, timestep_fs=timestep_fs, time_ps=float(time_ps[-1]), dtype="float64",
               initial_temperature_K=300.0, mean_temperature_K=float(temp.mean()), drift_meV_atom_ps=drift,
               span_meV_atom=float(e.max() - e.min()), max_step_meV_atom=float(np.abs(np.diff(e)).max()),
               wall_s=wall)
    ase = ROOT / "benchmarks" / "results" / "nve_cpu.json"
    if ase.is_file():
        ref = json.loads(ase.read_text())
        out["ase_drift_meV_atom_ps"] = ref["drift"]
        out["ase_span_meV_atom"] = ref["span"]
    print(f"NVE Si64 1 ps (LAMMPS): drift {drift:+.2e} meV/atom/ps, band {out['span_meV_atom']:.4f} meV/atom"
          + (f"; ASE run: drift {out['ase_drift_meV_atom_ps']:+.2e}, band {out['ase_span_meV_atom']:.4f}"
             if "ase_drift_meV_atom_ps" in out else ""), flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 4096, 8000, 20384])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=3, help="timed MD steps per run")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--no-nve", dest="nve", action="store_false", help="skip the 1 ps NVE run")
    p.add_argument("--nve-only", action="store_true")
    p.add_argument("--threads", type=int, default=None,
                   help="rank 0's model threads (pair_style ... threads N; default: all cores, since the other ranks "
                        "sleep while it evaluates)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from benchmarks.provenance import provenance
    from matris.bundled import DEMO_CHECKPOINT

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "demo.pth"
        env = dict(os.environ, MATRIS_OFFLINE="1")
        env.pop("LAMMPS_PLUGIN_PATH", None)
        subprocess.run([str(BIN / "matris"), "export", "lammps", "matris-demo", "-o", str(model)], check=True,
                       env=env, capture_output=True)
        subprocess.run([str(BIN / "matris"), "lammps", "build"], check=True, env=env, capture_output=True)
        result = {"meta": provenance(argv, "matris-demo", DEMO_CHECKPOINT), "device": args.device,
                  "dtype": args.dtype, "cpus": os.cpu_count()}
        if not args.nve_only:
            rows = []
            threads = args.threads or os.cpu_count() or 1
            for ranks in args.ranks:
                rows += speed(model, args.sizes, [ranks], args.steps, args.device, args.dtype, threads,
                              dict(env, OMP_NUM_THREADS="1"))
            result["speed"] = sorted(rows, key=lambda r: (r["atoms"], r["ranks"]))
        if args.nve or args.nve_only:
            result["nve"] = nve(model, dict(env, OMP_NUM_THREADS=str(os.cpu_count() or 1)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
