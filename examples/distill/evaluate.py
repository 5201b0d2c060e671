"""Check a distilled model against its teacher: held-out errors and MD stability.

    python examples/distill/evaluate.py runs/distill/best_model.pth.tar examples/distill/data/test.extxyz \
        --json runs/distill/evaluation.json

1. Held-out error against the CHGNet 0.3.0 labels of test.extxyz (structures of prototype
   families never seen in training): MAE of energy (meV/atom), force components (meV/Å) and
   stress components (GPa), overall, per prototype (rocksalt, fcc, random, ...) and per kind
   (volume scan, strained/rattled supercell, random cell, MD snapshot).
   Lattice constants of diamond Si, fcc Cu and rocksalt NiO, next to the teacher's
   (``--teacher-lattices data/summary.json``).
2. MD stability: 64-atom diamond Si, Langevin NVT at 300 K, 2 ps with a 2 fs step. Stable means
   no two atoms ever closer than 1.5 Å and the potential energy bounded (its spread over the run
   under 0.5 eV/atom, no NaN).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from ase.build import bulk
from ase.io import read
from ase.units import GPa

from lattices import lattice_constants
from matris import MatRIS
from matris.simulate import md


def _mae(errors: list) -> float:
    return float(np.mean(np.concatenate([np.ravel(e) for e in errors]))) if errors else float("nan")


def held_out_errors(model: MatRIS, frames) -> dict:
    """MAE against the labels: overall, and per prototype and per kind of structure (the
    ``prototype`` and ``kind`` info keys written by make_data.py)."""
    preds = model.predict(frames, batch_size=16)
    rows = []
    for p, a in zip(preds, frames):
        rows.append({
            "prototype": a.info.get("prototype", "?"), "kind": a.info.get("kind", "?"), "atoms": len(a),
            "de": abs(p.energy_per_atom - a.get_potential_energy() / len(a)),
            "df": np.abs(p.forces - a.get_forces()).ravel(),
            # labels: ASE stress (Voigt, eV/Å³); Prediction.stress: 3×3 GPa with the same sign
            "ds": np.abs(_voigt(p.stress) - a.get_stress() / GPa)})

    def summary(sel: list) -> dict:
        return {"structures": len(sel), "atoms": int(sum(r["atoms"] for r in sel)),
                "energy_mae_meV_atom": 1000 * _mae([r["de"] for r in sel]),
                "force_mae_meV_A": 1000 * _mae([r["df"] for r in sel]),
                "stress_mae_GPa": _mae([r["ds"] for r in sel])}

    out = summary(rows)
    for key in ("prototype", "kind"):
        out[f"by_{key}"] = {v: summary([r for r in rows if r[key] == v]) for v in sorted({r[key] for r in rows})}
    return out


def _voigt(s: np.ndarray) -> np.ndarray:
    s = np.asarray(s).reshape(3, 3)
    return np.array([s[0, 0], s[1, 1], s[2, 2], s[1, 2], s[0, 2], s[0, 1]])


def md_stability(model: MatRIS, picoseconds: float = 2.0, timestep: float = 2.0, seed: int = 0) -> dict:
    atoms = bulk("Si", "diamond", a=5.43, cubic=True).repeat(2)
    closest = []

    def watch(at, step):
        d = at.get_all_distances(mic=True)
        closest.append(float(d[np.triu_indices(len(at), 1)].min()))

    res = md(atoms, ensemble="nvt", temperature=300.0, timestep=timestep,
             steps=int(round(picoseconds * 1000 / timestep)), loginterval=10, seed=seed, model=model, callback=watch)
    epot = res.column("potential_energy") / len(atoms)
    temps = res.column("temperature")
    report = {"atoms": len(atoms), "time_ps": res.time_ps, "timestep_fs": timestep,
              "min_distance_A": min(closest), "epot_spread_eV_atom": float(epot.max() - epot.min()),
              "mean_temperature_K": float(temps[len(temps) // 2:].mean()), "steps_per_s": res.steps_per_s}
    report["stable"] = bool(np.all(np.isfinite(epot)) and report["min_distance_A"] > 1.5
                            and report["epot_spread_eV_atom"] < 0.5)
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="checkpoint path or model name")
    p.add_argument("test", type=Path, help="held-out labelled structures (extxyz)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--teacher-lattices", type=Path, default=None,
                   help="JSON of the teacher's lattice constants (data/summary.json from make_data.py)")
    p.add_argument("--no-md", action="store_true", help="skip the MD stability run")
    args = p.parse_args()
    model = MatRIS.load(args.model)
    out = {"model": str(args.model), "test": str(args.test), "held_out": held_out_errors(model, read(args.test, ":"))}
    lattices = lattice_constants(lambda frames: [p.energy for p in model.predict(frames)])
    teacher = (json.loads(args.teacher_lattices.read_text()).get("lattice_constants_A", {})
               if args.teacher_lattices else {})
    out["lattice_constants_A"] = {k: {"model": v, "teacher": teacher.get(k)} for k, v in lattices.items()}
    if not args.no_md:
        out["md_si64_nvt_300K"] = md_stability(model)
    print(json.dumps(out, indent=1))
    if args.json:
        from matris.atomic import write_json

        write_json(args.json, out)


if __name__ == "__main__":
    main()
