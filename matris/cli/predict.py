"""``matris predict``: energy, forces, stress and magnetic moments of structure files."""

from __future__ import annotations

import argparse
import sys

from ..atomic import write_json
from .common import (
    add_majority_argument,
    add_model_arguments,
    check_inputs,
    check_structures,
    load_model,
    read_input_structures,
)

HELP = "energy, forces, stress and magmoms of structures (default: a bundled example)"
DESCRIPTION = """\
Predict the energy (eV), forces (eV/Å), stress (GPa, positive = tensile) and magnetic
moments (μB) of every structure in the given files. Any format ASE reads works (CIF,
POSCAR, extxyz, ...); every frame of a multi-frame file is used.

Without files it evaluates a bundled example structure (8-atom Si) with the bundled demo
checkpoint, so a fresh install can be checked offline:

  matris predict
  matris predict POSCAR relaxed.cif --model path/to/model.pth.tar --dtype float64
  matris predict traj.extxyz --json results.json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", help="structure files (any ASE-readable format); default: bundled example")
    add_model_arguments(p)
    p.add_argument("--batch-size", type=int, default=16, help="structures per batch (default: 16)")
    p.add_argument("--index", default=":", help="ASE index of frames to read from each file (default: all ':')")
    add_majority_argument(p)
    p.add_argument("--json", dest="json_path", default=None, help="also write all results to this JSON file")
    p.add_argument("--quiet", action="store_true", help="print no table")


def run(args: argparse.Namespace) -> int:
    check_inputs(args.files, args.model)  # before any heavy import: a typo fails at once
    atoms = read_input_structures(args.files, args.index, args.majority_species)
    check_structures(atoms)
    import numpy as np

    model = load_model(args)
    preds = model.predict(atoms, batch_size=args.batch_size)
    if not args.quiet:
        print(f"{'structure':28s} {'atoms':>5s} {'E (eV)':>14s} {'E/atom (eV)':>12s} {'max|F| (eV/Å)':>14s} "
              f"{'P (GPa)':>9s} {'Σ|m| (μB)':>10s}")
        for a, p in zip(atoms, preds):
            fmax = float(np.linalg.norm(p.forces, axis=1).max())
            pressure = f"{-np.trace(p.stress) / 3:9.4f}" if p.stress is not None else f"{'-':>9s}"
            # models trained without magnetic moments (targets efs) have none to show
            magmoms = f"{float(np.abs(p.magmoms).sum()):10.4f}" if p.magmoms is not None else f"{'–':>10s}"
            print(f"{p.name[:28]:28s} {len(a):5d} {p.energy:14.6f} {p.energy_per_atom:12.6f} {fmax:14.6f} "
                  f"{pressure} {magmoms}")
    if args.json_path:
        path = write_json(args.json_path, [p.to_dict() for p in preds])
        from ..errors import counted

        print(f"wrote {counted(len(preds), 'result')} to {path}", file=sys.stderr)
    return 0
