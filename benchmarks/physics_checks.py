"""The NVT and relaxation figures of the docs' "Simulations" page, with the bundled model.

    python -m benchmarks.physics_checks --json benchmarks/results/physics_checks_cpu.json

The same set-ups as tests/test_simulate_physics.py (which bound them; this script records
the measured values with the commit and the model's sha256):

- NVT Langevin at 300 K: 8-atom cubic diamond Si (a = 5.43 Å, float32), 2 fs, friction
  0.05/fs, 400 steps, seed 1; the mean temperature over the last 300 steps.
- Relaxation: the same cell rattled by 0.05 Å (seed 1) and strained by 3 %, float64, FIRE +
  FrechetCellFilter (``matris.simulate.relax`` defaults, fmax 0.05 eV/Å): energy drop, steps,
  final fmax and residual stress × V/N.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def nvt(model) -> dict:
    from ase.build import bulk

    from matris.simulate import md

    r = md(bulk("Si", "diamond", a=5.43, cubic=True), ensemble="nvt", thermostat="langevin", temperature=300.0,
           timestep=2.0, steps=400, friction=0.05, loginterval=1, seed=1, model=model)
    temps = r.column("temperature")[100:]
    return {"atoms": 8, "target_K": 300.0, "steps": 400, "timestep_fs": 2.0, "friction_per_fs": 0.05,
            "mean_temperature_K": float(temps.mean()),
            "standard_error_K": float(temps.std() / np.sqrt(60))}  # ~60 independent samples (see the test)


def relaxation(model) -> dict:
    from ase.build import bulk
    from ase.units import GPa  # eV/Å³ per GPa

    from matris.simulate import relax

    atoms = bulk("Si", "diamond", a=5.43, cubic=True)
    atoms.rattle(0.05, seed=1)
    atoms.set_cell(atoms.cell * 1.03, scale_atoms=True)
    r = relax(atoms, dtype="float64", model=model)
    return {"atoms": 8, "converged": bool(r.converged), "steps": int(len(r.energies) - 1),
            "energy_drop_eV": float(r.energies[0] - r.energy), "fmax_eV_A": float(r.fmax),
            "stress_times_volume_per_atom_eV": float(np.abs(r.stress).max() * GPa
                                                     * r.atoms.get_volume() / len(atoms))}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="matris-demo", help="model name or checkpoint path (default: the bundled model)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from matris import MatRIS

    model = MatRIS.load(args.model)
    out = {"nvt_langevin_si8_300K": nvt(model), "relax_strained_si8": relaxation(model)}
    t, rx = out["nvt_langevin_si8_300K"], out["relax_strained_si8"]
    print(f"NVT Langevin, Si8, 300 K target: mean {t['mean_temperature_K']:.0f} ± {t['standard_error_K']:.0f} K")
    print(f"relaxation, strained Si8: energy −{rx['energy_drop_eV']:.3f} eV in {rx['steps']} steps, "
          f"fmax {rx['fmax_eV_A']:.3f} eV/Å, stress×V/N {rx['stress_times_volume_per_atom_eV']:.4f} eV")
    if args.json:
        from benchmarks.common import provenance, write_json
        from matris.pretrained.cache import resolve

        out["provenance"] = provenance(argv, model_name=args.model, model_path=resolve(args.model))
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
