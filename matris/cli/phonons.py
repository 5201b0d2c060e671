"""``matris phonons``: phonon band structure, DOS and thermal properties with phonopy."""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

from ..atomic import write_text
from .common import add_majority_argument, add_model_arguments, check_inputs, load_model, read_one, write_json

HELP = "phonons with phonopy: band structure + DOS plot, thermal properties"
DESCRIPTION = """\
Finite-displacement phonons of FILE (frame --index, default the last) with MatRIS forces.
Writes OUT/phonons.png (band structure along the high-symmetry path and DOS),
OUT/thermal.csv (T, free energy, entropy, heat capacity per mole of primitive cells),
OUT/phonons.json and OUT/phonopy_params.yaml (for phonopy itself). Relax the structure
first (or pass --relax). float32 is the default, as everywhere; --dtype float64 gives
cleaner force constants (fewer spurious imaginary modes near Γ). Needs phonopy
(pip install 'matris-mlip[phonons]').

  matris phonons relaxed/Si.relaxed.extxyz
  matris phonons POSCAR --relax --supercell 3 3 3 --mesh 30 --tmax 1500
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="structure file (any ASE-readable format)")
    add_model_arguments(p, dtype_note="; float64 gives cleaner force constants")
    p.add_argument("--index", default="-1", help="frame of FILE (default: the last, -1)")
    add_majority_argument(p)
    p.add_argument("--supercell", type=int, nargs="+", default=None,
                   help="repetitions, 1 or 3 integers (default: every cell vector ≥ 10 Å)")
    p.add_argument("--displacement", type=float, default=0.01, help="Å (default: 0.01)")
    p.add_argument("--mesh", type=int, nargs="+", default=[20], help="q mesh, 1 or 3 integers (default: 20)")
    p.add_argument("--tmin", type=float, default=0.0, help="K (default: 0)")
    p.add_argument("--tmax", type=float, default=1000.0, help="K (default: 1000)")
    p.add_argument("--tstep", type=float, default=10.0, help="K (default: 10)")
    p.add_argument("--relax", action="store_true", help="relax positions and cell first (fmax 0.005 eV/Å)")
    p.add_argument("--out-dir", default=None, help="output folder (default: phonons-<name>)")


def run(args: argparse.Namespace) -> int:
    check_inputs([args.file], args.model)  # before any heavy import: a typo fails at once
    from ..extras import require

    require("phonopy", "phonons", "matris phonons")
    from ..simulate import phonons, relax

    atoms = read_one(args.file, args.index, args.majority_species)
    model = load_model(args)
    if args.relax:
        atoms = relax(atoms, fmax=0.005, steps=1000, model=model).atoms
    out = Path(args.out_dir or f"phonons-{atoms.info['name']}")
    sc = args.supercell[0] if args.supercell and len(args.supercell) == 1 else args.supercell
    mesh = args.mesh[0] if len(args.mesh) == 1 else args.mesh
    r = phonons(atoms, supercell=sc, displacement=args.displacement, mesh=mesh, t_min=args.tmin, t_max=args.tmax,
                t_step=args.tstep, model=model, plot=out / "phonons.png", save=out / "phonopy_params.yaml")
    write_json(out / "phonons.json", r.to_dict())
    _write_csv(out / "thermal.csv", r.thermal)
    t = r.thermal
    k300 = int(abs(t["temperatures"] - 300).argmin())
    print(f"{r.name}: supercell {r.supercell}, frequencies {r.min_frequency:.3f} … "
          f"{float(r.band['frequencies'].max()):.3f} THz{' (IMAGINARY modes)' if r.has_imaginary else ''}; "
          f"at {t['temperatures'][k300]:.0f} K: F = {t['free_energy'][k300]:.3f} kJ/mol, "
          f"S = {t['entropy'][k300]:.3f} J/K/mol, Cv = {t['heat_capacity'][k300]:.3f} J/K/mol; wrote {out}/")
    return 0


def _write_csv(path: Path, thermal: dict) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["temperature_K", "free_energy_kJ_per_mol", "entropy_J_per_K_mol", "heat_capacity_J_per_K_mol"])
    for row in zip(thermal["temperatures"], thermal["free_energy"], thermal["entropy"], thermal["heat_capacity"]):
        w.writerow([f"{x:.6g}" for x in row])
    write_text(path, buf.getvalue())
