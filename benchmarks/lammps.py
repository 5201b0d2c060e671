"""pair_style matris in LAMMPS: how the model's work divides among MPI ranks, and NVE energy conservation.

    python -m benchmarks.lammps --json benchmarks/results/lammps_cpu.json
    python -m benchmarks.lammps --sizes 2000 --ranks 1 2 --steps 3 --no-nve
    python -m benchmarks.lammps --device cuda --sizes 8000 64000 --ranks 1 2 4   # on a GPU node
    python -m benchmarks.lammps --nve-only --json out.json

Scaling (``mode domain``, :mod:`matris.domain`): diamond Si supercells (cubic 8-atom cells
repeated, velocities at 300 K), the bundled model (``matris export lammps matris-demo``) in
float32, one model thread per rank (``threads 1``), ``--steps`` velocity-Verlet steps of 1 fs
after one step of warm-up. Strong scaling: the same cell (``--sizes``) on each rank count; weak:
``--per-rank`` atoms per rank. Per run and rank: the pair time per step (LAMMPS's ``Pair`` row:
min, avg and max over the ranks), the peak resident memory and the working memory (peak minus
the process after loading the model: torch itself is the same on every rank), the atoms, ghost
atoms and slots (short bonds per atom, the padding of the line-graph exchanges), and the bytes
each rank's exchanges moved per step (ghost rows × row width × 8, periodic images on the same
rank included) next to the design's prediction, :func:`predicted_bytes`. A 1-rank ``mode gather``
run (the whole cell without exchanges, as the ASE calculator evaluates it) is the reference for
the cost of the exchanges.

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

from benchmarks.common import ROOT

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


def speed_script(model: Path, reps, steps: int, device: str, dtype: str, threads: int, mode: str,
                 stats: Path | None = None) -> str:
    nx, ny, nz = reps
    keywords = f" stats {stats}" if stats else ""
    return f"""units metal
atom_style atomic
lattice diamond 5.43
region box block 0 {nx} 0 {ny} 0 {nz}
create_box 1 box
create_atoms 1 box
mass 1 28.0855
pair_style matris {model} device {device} dtype {dtype} threads {threads} mode {mode}{keywords}
pair_coeff * * Si
velocity all create 300 4928459 loop geom
fix nve all nve
timestep 0.001
thermo {steps}
run 1
run {steps}
"""


def predicted_bytes(n_ghost: int, n_slots: int, d_n: int, d_t: int, blocks: int) -> int:
    """Bytes one rank's exchanges move in one evaluation (:mod:`matris.domain`), per ghost atom
    row: the owners' positions (3 doubles) and bond names (4 per slot) once; per block, forward
    and in the force pass back: the line-graph attention's aggregates and log-sum-exps (4·d_t per
    slot), the ghosts' atom features (d_n), the line-graph Refine's sums (d_t per slot) and the atom
    features again (d_n; not after the last block)."""
    s = max(n_slots, 1)
    per_row = 3 + 4 * s + 2 * (blocks * (5 * d_t * s + 2 * d_n) - d_n)
    return 8 * n_ghost * per_row


def run_case(model, atoms, ranks, steps, device, dtype, mode, env, config) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "stats"
        log = run_lmp(speed_script(model, cells_for(atoms), steps, device, dtype, 1, mode, stats=prefix), ranks,
                      Path(tmp), env)
        stats = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("stats.*.json"))]
    loops = re.findall(r"Loop time of ([\d.eE+-]+) on (\d+) procs for (\d+) steps with (\d+) atoms", log)
    seconds, _, nsteps, n = loops[-1]
    pair = re.findall(r"Pair\s+\|\s+([\d.eE+-]+)\s+\|\s+([\d.eE+-]+)\s+\|\s+([\d.eE+-]+)", log)[-1]
    nsteps = int(nsteps)
    row = dict(atoms=int(n), ranks=ranks, mode=mode, steps=nsteps, loop_s=float(seconds),
               pair_s_per_step={k: float(v) / nsteps for k, v in zip(("min", "avg", "max"), pair)})
    if mode == "domain":
        per_rank = []
        for st in stats:
            per_rank.append(dict(
                atoms=st["n_local"], ghosts=st["n_ghost"], slots=st["n_slots"], bonds=st["bonds"], angles=st["angles"],
                peak_rss_bytes=st["peak_rss_bytes"], working_bytes=st["peak_rss_bytes"] - st["rss_after_load_bytes"],
                bytes_per_step=st["bytes"], exchange_s_per_step=st["exchange_seconds"],
                model_s_per_step=st["last_seconds"],
                predicted_bytes_per_step=predicted_bytes(st["n_ghost"], st["n_slots"], config["d_n"], config["d_t"],
                                                         config["blocks"])))
        row["per_rank"] = per_rank
    mib = 2**20
    lines = [f"{row['atoms']:6d} atoms  {ranks} rank(s)  {mode:6s}  pair {row['pair_s_per_step']['max']:.3f} s/step "
             "(max over ranks)"]
    lines += [f"    rank: {r['atoms']} atoms {r['ghosts']} ghosts  working memory {r['working_bytes'] / mib:.0f} MiB  "
              f"exchanges {r['exchange_s_per_step']:.3f} s of {r['model_s_per_step']:.3f} s  "
              f"exchanged {r['bytes_per_step'] / mib:.1f} MiB/step "
              f"(predicted {r['predicted_bytes_per_step'] / mib:.1f})"
              for r in row.get("per_rank", [])]
    print("\n".join(lines), flush=True)
    return row


def scaling(model, sizes, per_rank, ranks_list, steps, device, dtype, env, config) -> dict:
    """Strong (``sizes`` on every rank count) and weak (``per_rank`` atoms per rank) scaling, and
    the 1-rank ``mode gather`` reference of each strong size; the ratios against 1 rank."""
    runs: dict[tuple, dict] = {}

    def case(atoms, ranks, mode="domain"):
        key = (atoms, ranks, mode)
        if key not in runs:
            runs[key] = run_case(model, atoms, ranks, steps, device, dtype, mode, env, config)
        return runs[key]

    strong, weak = [], []
    for n in sizes:
        base, whole = case(n, 1), case(n, 1, "gather")
        for r in ranks_list:
            row = case(n, r)
            worst_time = row["pair_s_per_step"]["max"] / base["pair_s_per_step"]["max"]
            worst_mem = max(x["working_bytes"] for x in row["per_rank"]) / base["per_rank"][0]["working_bytes"]
            strong.append(dict(atoms=n, ranks=r, pair_time_vs_1_rank=worst_time, working_memory_vs_1_rank=worst_mem,
                               pair_time_vs_gather=row["pair_s_per_step"]["max"] / whole["pair_s_per_step"]["max"]))
    if per_rank:
        base = case(per_rank, 1)
        for r in ranks_list:
            row = case(per_rank * r, r)
            weak.append(dict(atoms_per_rank=per_rank, ranks=r,
                             efficiency=base["pair_s_per_step"]["max"] / row["pair_s_per_step"]["max"]))
    return {"runs": sorted(runs.values(), key=lambda r: (r["atoms"], r["ranks"], r["mode"])), "strong": strong,
            "weak": weak}


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
    p.add_argument("--sizes", type=int, nargs="+", default=[2000], help="strong scaling: atoms of the cell")
    p.add_argument("--per-rank", type=int, default=1000, help="weak scaling: atoms per rank (0: none)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=3, help="timed MD steps per run")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--no-nve", dest="nve", action="store_false", help="skip the 1 ps NVE run")
    p.add_argument("--nve-only", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from benchmarks.common import provenance, write_json
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
            from matris import MatRIS

            demo = MatRIS.load("matris-demo")
            config = dict(d_n=demo.config.node_feat_dim, d_t=demo.config.three_body_feat_dim,
                          blocks=len(demo.interaction_block))
            result["scaling"] = scaling(model, args.sizes, args.per_rank, args.ranks, args.steps, args.device,
                                        args.dtype, dict(env, OMP_NUM_THREADS="1"), config)
        if args.nve or args.nve_only:
            result["nve"] = nve(model, dict(env, OMP_NUM_THREADS=str(os.cpu_count() or 1)))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
