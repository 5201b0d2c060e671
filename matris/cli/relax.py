"""``matris relax``: relax structure files, one by one with ASE or together with torch-sim."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..rerun import notice
from .common import (
    add_majority_argument,
    add_model_arguments,
    check_inputs,
    check_structures,
    load_model,
    safe_name,
    write_json,
    write_structure,
)

HELP = "relax structures (FIRE + FrechetCellFilter, fmax 0.05 eV/Å by default)"
DESCRIPTION = """\
Relax every structure in the given files (any format ASE reads; every frame) with the
Matbench-Discovery protocol by default: FIRE on a FrechetCellFilter until every force and
cell force is below --fmax eV/Å, at most --steps steps.

For each structure it writes OUT/NAME.relaxed.extxyz (final structure with energy, forces,
stress) and OUT/NAME.relax.extxyz (every step; --trajectory-format traj for ASE .traj),
and adds a row to OUT/results.json after each structure. Rerunning the same command skips
the structures already in results.json (a long job resumes; when all are there, it says so
and relaxes nothing); --overwrite relaxes the given structures again, keeping the other rows.

--batch relaxes all structures together on one device with torch-sim (pip install
'matris-mlip[sim]'): much faster on a GPU. It writes no per-step trajectories.

  matris relax POSCAR
  matris relax structures.extxyz --out-dir relaxed --fmax 0.02 --dtype float64
  matris relax *.cif --batch --device cuda --max-atoms 20000
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", help="structure files (any ASE-readable format)")
    add_model_arguments(p)
    p.add_argument("--fmax", type=float, default=0.05, help="force threshold, eV/Å (default: 0.05)")
    p.add_argument("--steps", type=int, default=500, help="most optimizer steps (default: 500)")
    p.add_argument("--optimizer", default="FIRE", help="ASE optimizer (default: FIRE)")
    p.add_argument("--cell-filter", default="FrechetCellFilter", help="ASE cell filter (default: FrechetCellFilter)")
    p.add_argument("--fixed-cell", action="store_true", help="relax positions only")
    p.add_argument("--pressure", type=float, default=0.0,
                   help="external pressure, GPa (default: 0; needs a cell relaxation, so not with --fixed-cell)")
    p.add_argument("--batch", action="store_true", help="relax all structures together with torch-sim")
    p.add_argument("--max-atoms", type=int, default=None, help="--batch: most atoms on the device at once")
    p.add_argument("--index", default=":", help="ASE index of frames to read from each file (default: all ':')")
    add_majority_argument(p)
    p.add_argument("--out-dir", default="relaxed", help="output folder (default: relaxed)")
    p.add_argument("--trajectory-format", default="extxyz", choices=["extxyz", "traj", "none"],
                   help="per-step trajectory format, or none (default: extxyz)")
    p.add_argument("--overwrite", action="store_true",
                   help="relax the given structures again even if results.json holds them (other rows are kept)")
    p.add_argument("--force", dest="overwrite", action="store_true", help=argparse.SUPPRESS)  # the older name


def run(args: argparse.Namespace) -> int:
    from ..errors import MatRISInputError
    from .common import read_input_structures

    check_inputs(args.files, args.model)  # before any heavy import: a typo fails at once
    if args.batch and args.optimizer != "FIRE":
        raise MatRISInputError("--batch uses torch-sim's FIRE; drop --optimizer or drop --batch")
    from ..simulate.relaxation import check_pressure

    check_pressure(args.pressure, not args.fixed_cell, None if args.batch else args.cell_filter)
    out = Path(args.out_dir)
    results_path = out / "results.json"
    # with --overwrite the rows of other structures stay: only the given ones are redone
    done = {r["key"]: r for r in json.loads(results_path.read_text())} if results_path.exists() else {}
    atoms = read_input_structures(args.files, args.index, args.majority_species)
    check_structures(atoms)
    keys, seen = [], set()
    for k, a in enumerate(atoms):
        key = safe_name(str(a.info.get("name", k)))
        key = key if key not in seen else f"{key}-{k}"
        seen.add(key)
        keys.append(key)
    todo = [(key, a) for key, a in zip(keys, atoms) if args.overwrite or key not in done]
    if not todo:
        notice(f"relax: all {len(atoms)} of {len(atoms)} structures already relaxed in {results_path}: nothing "
               "relaxed now; --overwrite relaxes them again, or give another --out-dir")
        return 0
    if len(todo) < len(atoms):
        notice(f"relax: resuming: {len(atoms) - len(todo)} of {len(atoms)} structures already relaxed in "
               f"{results_path} are skipped, {len(todo)} to go (--overwrite relaxes them all again)")
    model = load_model(args)
    _header()
    t0 = time.perf_counter()
    if args.batch and todo:
        try:
            from ..simulate import relax_batch
        except ImportError as exc:
            raise MatRISInputError(f"--batch: {exc}") from None

        results = relax_batch([a for _, a in todo], fmax=args.fmax, steps=args.steps, relax_cell=not args.fixed_cell,
                              pressure=args.pressure, model=model, max_atoms=args.max_atoms)
        for (key, a), r in zip(todo, results):
            done[key] = _finish(out, key, a, r, None)
        write_json(results_path, list(done.values()))
    else:
        from ..simulate import relax

        for key, a in todo:
            traj = None if args.trajectory_format == "none" else out / f"{key}.relax.{args.trajectory_format}"
            r = relax(a, fmax=args.fmax, steps=args.steps, optimizer=args.optimizer, cell_filter=args.cell_filter,
                      relax_cell=not args.fixed_cell, pressure=args.pressure, model=model, trajectory=traj)
            done[key] = _finish(out, key, a, r, traj)
            write_json(results_path, list(done.values()))  # after every structure: a rerun resumes here
    elapsed = time.perf_counter() - t0
    if todo:
        print(f"relaxed {len(todo)} structures in {elapsed:.1f} s ({len(todo) / elapsed:.3f} structures/s); "
              f"results in {results_path}", file=sys.stderr)
    return 0


def _header():
    print(f"{'structure':28s} {'atoms':>5s} {'steps':>5s} {'conv':>4s} {'E/atom (eV)':>12s} {'fmax (eV/Å)':>11s} "
          f"{'ΔV (%)':>7s}")


def _finish(out: Path, key: str, start, r, traj) -> dict:
    final = out / f"{key}.relaxed.extxyz"
    write_structure(final, r.atoms)
    row = {"key": key, **r.to_dict(), "structure_file": str(final), "trajectory": None if traj is None else str(traj)}
    dv = 100 * (r.atoms.get_volume() / start.get_volume() - 1) if start.pbc.all() else float("nan")
    steps = "-" if r.steps is None else str(r.steps)
    label = str(start.info.get("name", key))  # the label predict prints too; files use the safe key
    print(f"{label[:28]:28s} {len(r.atoms):5d} {steps:>5s} {'yes' if r.converged else 'NO':>4s} "
          f"{r.energy_per_atom:12.6f} {r.fmax:11.4f} {dv:7.2f}", flush=True)
    return row
