"""``matris md``: molecular dynamics of one structure, resumable."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .common import (
    add_majority_argument,
    add_model_arguments,
    check_inputs,
    load_model,
    read_one,
    structure_stem,
    write_json,
    write_structure,
)

HELP = "molecular dynamics (NVE, NVT Langevin/Nosé–Hoover/Bussi, NPT), resumable"
DESCRIPTION = """\
Run MD of one structure (frame --index of FILE, default the last) with live progress
(steps/s, ns/day, T, E) on stderr. Every --loginterval steps a frame goes to the trajectory
(.extxyz or .traj) and the restart file TRAJECTORY.restart.json is rewritten. After an
interruption, run the same command again: it continues from the restart file (or the last
frame) up to --steps in total. A run already at --steps is reported as finished (with the
speed it had) and not run again. --overwrite starts afresh, replacing the trajectory and the
restart file (only those).

At the end it writes the final structure (TRAJECTORY stem + .final.extxyz) and a summary
JSON (--json, default TRAJECTORY stem + .json).

  matris md POSCAR --ensemble nvt -T 300 --steps 10000 --trajectory md.extxyz
  matris md Si.cif --ensemble nve --timestep 0.5 --dtype float64
  matris md relaxed.extxyz --ensemble npt -T 600 --pressure 1.0 --trajectory npt.traj
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="structure file (any ASE-readable format)")
    add_model_arguments(p)
    p.add_argument("--index", default="-1", help="frame of FILE to start from (default: the last, -1)")
    add_majority_argument(p)
    p.add_argument("--ensemble", default="nvt", choices=["nve", "nvt", "npt"], help="default: nvt")
    p.add_argument("--thermostat", default="langevin", choices=["langevin", "nose-hoover", "bussi"],
                   help="NVT thermostat (default: langevin)")
    p.add_argument("-T", "--temperature", type=float, default=300.0, help="K (default: 300)")
    p.add_argument("--pressure", type=float, default=0.0,
                   help="NPT pressure, GPa (default: 0; only with --ensemble npt)")
    p.add_argument("--timestep", type=float, default=1.0, help="fs (default: 1)")
    p.add_argument("--steps", type=int, default=1000, help="total steps of the run (default: 1000)")
    p.add_argument("--friction", type=float, default=0.01, help="Langevin friction, 1/fs (default: 0.01)")
    p.add_argument("--tdamp", type=float, default=100.0, help="thermostat time, fs (default: 100)")
    p.add_argument("--pdamp", type=float, default=1000.0, help="barostat time, fs (default: 1000)")
    p.add_argument("--init-temperature", type=float, default=None, help="K of the initial velocities (default: -T)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--trajectory", default=None, help="trajectory file (default: FILE stem + .md.extxyz)")
    p.add_argument("--loginterval", type=int, default=10, help="steps between frames (default: 10)")
    p.add_argument("--restart", default=None, help="restart file (default: TRAJECTORY.restart.json)")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh, replacing the trajectory and restart file of an earlier run")
    p.add_argument("--no-resume", dest="overwrite", action="store_true", help=argparse.SUPPRESS)  # the older name
    p.add_argument("--json", dest="json_path", default=None, help="summary JSON (default: TRAJECTORY stem + .json)")
    p.add_argument("--quiet", action="store_true", help="no progress")


def run(args: argparse.Namespace) -> int:
    check_inputs([args.file], args.model)  # before any heavy import: a typo fails at once
    from ..simulate.dynamics import check_pressure, md

    check_pressure(args.pressure, args.ensemble)
    atoms = read_one(args.file, args.index, args.majority_species)
    traj = Path(args.trajectory or f"{atoms.info['name']}.md.extxyz")
    name = structure_stem(traj)
    stem = traj.with_name(name[: -len(".md")] if name.endswith(".md") and len(name) > 3 else name)
    result = md(atoms, ensemble=args.ensemble, temperature=args.temperature, pressure=args.pressure,
                timestep=args.timestep, steps=args.steps, thermostat=args.thermostat, friction=args.friction,
                tdamp=args.tdamp, pdamp=args.pdamp, trajectory=traj, loginterval=args.loginterval,
                restart=args.restart, overwrite=args.overwrite, init_temperature=args.init_temperature,
                seed=args.seed, model=load_model(args), progress=not args.quiet)
    final = write_structure(stem.with_name(stem.name + ".final.extxyz"), result.atoms)
    summary = {"file": args.file, "ensemble": args.ensemble, **result.to_dict(), "final_structure": str(final)}
    write_json(args.json_path or stem.with_name(stem.name + ".json"), summary)
    if result.resumed_from and not result.loaded:
        print(f"resumed from step {result.resumed_from}", file=sys.stderr)
    speed = ("speed not recorded" if math.isnan(result.steps_per_s) else
             f"{result.steps_per_s:.2f} steps/s, {result.ns_per_day:.4f} ns/day")
    print(f"{result.steps} steps ({result.time_ps:.3f} ps): mean T {summary['mean_temperature_K']:.1f} K, "
          f"{speed}{' (the earlier run: nothing was run now)' if result.loaded else ''}; trajectory {traj}",
          file=sys.stderr)
    return 0
