"""``matris eos``: equation of state of a crystal, with a plot."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_majority_argument, add_model_arguments, check_inputs, load_model, read_one, write_json

HELP = "equation of state: E(V) fit (Birch–Murnaghan), V0, B, plot"
DESCRIPTION = """\
Scale the cell of FILE (frame --index, default the last) isotropically to --points volumes
within ±--range of its volume, relax the atoms at each volume (unless --no-relax-positions),
fit E(V) and write OUT/eos.json (V0, E0, bulk modulus in GPa, all points) and OUT/eos.png.
Start from a relaxed structure (or pass --relax to relax the cell first).

  matris eos relaxed/Si.relaxed.extxyz
  matris eos POSCAR --relax --points 15 --range 0.08 --out-dir eos-Si
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="structure file (any ASE-readable format)")
    add_model_arguments(p)
    p.add_argument("--index", default="-1", help="frame of FILE (default: the last, -1)")
    add_majority_argument(p)
    p.add_argument("--points", type=int, default=11, help="volumes (default: 11)")
    p.add_argument("--range", dest="volume_range", type=float, default=0.06,
                   help="volume range as a fraction (default: 0.06 = ±6%%)")
    p.add_argument("--eos", default="birchmurnaghan", help="ASE EOS form (default: birchmurnaghan)")
    p.add_argument("--no-relax-positions", action="store_true", help="keep fractional positions fixed")
    p.add_argument("--relax", action="store_true", help="relax positions and cell before the scan")
    p.add_argument("--out-dir", default=None, help="output folder (default: eos-<name>)")


def run(args: argparse.Namespace) -> int:
    check_inputs([args.file], args.model)  # before any heavy import: a typo fails at once
    from ..simulate import equation_of_state, relax

    atoms = read_one(args.file, args.index, args.majority_species)
    model = load_model(args)
    if args.relax:
        atoms = relax(atoms, fmax=0.01, model=model).atoms
    out = Path(args.out_dir or f"eos-{atoms.info['name']}")
    r = equation_of_state(atoms, points=args.points, volume_range=args.volume_range, eos=args.eos,
                          relax_positions=not args.no_relax_positions, model=model, plot=out / "eos.png")
    write_json(out / "eos.json", r.to_dict())
    n = r.natoms
    print(f"{r.name}: V0 = {r.v0 / n:.4f} Å³/atom, E0 = {r.e0 / n:.6f} eV/atom, B = {r.bulk_modulus:.2f} GPa "
          f"({r.eos}); wrote {out / 'eos.json'} and {r.plot}")
    return 0
