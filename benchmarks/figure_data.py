"""The data behind the documentation's physics figures: an equation of state, phonon bands and
an NVE energy trace, computed with the bundled model ``matris-demo`` on the CPU.

    python -m benchmarks.figure_data --json benchmarks/results/figures_demo_cpu.json

About two minutes on 2 CPU cores. The site draws its figures from the JSON when it is built
(``benchmarks/figures.py``, called by ``docs/hooks.py``), so a figure always shows what the
committed file holds. What is computed:

- **eos**: ``matris.simulate.equation_of_state`` of diamond Si, fcc Cu and rock-salt NaCl
  (conventional cells, 11 volumes ±6 %, positions relaxed), with the Birch–Murnaghan fit
  sampled on a fine grid;
- **phonons**: ``matris.simulate.phonons`` of diamond Si (primitive cell, supercell chosen by
  the default 10 Å rule), bands along ASE's high-symmetry path and the total DOS;
- **md**: NVE of 64-atom diamond Si from 300 K (0.5 fs steps) in float64 and in float32, the
  total and potential energy per atom at every step (``matris.simulate.md`` with a
  ``ConservationMonitor``).

``matris-demo`` is small and distilled from CHGNet: the figures show what the package's
functions produce and how to read them, not silicon's physics at DFT accuracy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _round(values, digits=6) -> list:
    return np.round(np.asarray(values, dtype=float), digits).tolist()


def eos_data(model) -> dict:
    from ase.build import bulk

    from matris.simulate import equation_of_state

    crystals = {
        "Si": bulk("Si", "diamond", a=5.43, cubic=True),
        "Cu": bulk("Cu", "fcc", a=3.61, cubic=True),
        "NaCl": bulk("NaCl", "rocksalt", a=5.64, cubic=True),
    }
    out = {}
    for name, atoms in crystals.items():
        e = equation_of_state(atoms, points=11, volume_range=0.06, model=model)
        fine = np.linspace(e.volumes.min(), e.volumes.max(), 121)
        out[name] = {"natoms": e.natoms, "volumes_A3": _round(e.volumes), "energies_eV": _round(e.energies),
                     "fit_volumes_A3": _round(fine), "fit_energies_eV": _round(e.fit_energies(fine)),
                     "v0_A3": float(e.v0), "e0_eV": float(e.e0), "bulk_modulus_GPa": float(e.bulk_modulus),
                     "lattice_constant_A": float(e.v0 ** (1 / 3))}
    return out


def phonon_data(model) -> dict:
    from ase.build import bulk

    from matris.simulate import phonons

    p = phonons(bulk("Si", "diamond", a=5.43), model=model, npoints=121, mesh=16)
    band = p.band
    return {"structure": "Si, diamond, primitive cell, a = 5.43 Å", "supercell": p.supercell,
            "distances": _round(band["distances"]), "frequencies_THz": _round(band["frequencies"], 4),
            "labels": list(band["labels"]), "label_positions": _round(band["label_positions"]),
            "dos_frequencies_THz": _round(p.dos["frequencies"], 4), "dos": _round(p.dos["total_dos"], 5),
            "min_frequency_THz": float(p.min_frequency)}


def md_data(model_path, steps: int, timestep: float) -> dict:
    import torch
    from ase.build import bulk

    from benchmarks.conservation import ConservationMonitor
    from matris import MatRIS
    from matris.simulate import md

    out = {"structure": "Si64, diamond, a = 5.43 Å", "initial_temperature_K": 300.0, "timestep_fs": timestep,
           "steps": steps, "runs": {}}
    for dtype in ("float64", "float32"):
        model = MatRIS.load(str(model_path), device="cpu", dtype=getattr(torch, dtype))
        monitor = ConservationMonitor(model.cutoff, model.three_body_cutoff)
        potential: list[float] = []

        def record(atoms, step, monitor=monitor, potential=potential):
            monitor(atoms, step)
            potential.append(atoms.get_potential_energy() / len(atoms))

        atoms = bulk("Si", "diamond", a=5.43, cubic=True).repeat(2)
        t0 = time.perf_counter()
        md(atoms, ensemble="nve", temperature=300.0, timestep=timestep, steps=steps, loginterval=steps,
           seed=0, model=model, callback=record)
        wall = time.perf_counter() - t0
        report = monitor.report(timestep)
        total = np.array(monitor.energy) * 1e3
        pot = np.array(potential) * 1e3
        out["runs"][dtype] = {
            "time_ps": _round(np.arange(len(total)) * timestep / 1000, 5),
            "total_meV_per_atom": _round(total - total[0], 5),
            "potential_meV_per_atom": _round(pot - total[0], 3),
            "drift_meV_per_atom_per_ps": report.drift, "span_meV_per_atom": report.span,
            "crossings": report.crossings, "steps_per_s": steps / wall,
        }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--md-steps", type=int, default=1000, help="NVE steps per precision (default 1000: 0.5 ps)")
    p.add_argument("--timestep", type=float, default=0.5, help="fs (default 0.5)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--only", nargs="*", choices=["eos", "phonons", "md"], default=None, help="compute only these")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    import torch

    from matris import MatRIS
    from matris.bundled import DEMO_CHECKPOINT

    if args.threads:
        torch.set_num_threads(args.threads)
    only = set(args.only or ("eos", "phonons", "md"))
    model = MatRIS.load(str(DEMO_CHECKPOINT), device="cpu", dtype=torch.float32)
    result: dict = {"model": "matris-demo", "device": "cpu", "threads": torch.get_num_threads()}
    seconds = {}
    if "eos" in only:
        t0 = time.perf_counter()
        result["eos"] = eos_data(model)
        seconds["eos"] = time.perf_counter() - t0
        for name, e in result["eos"].items():
            print(f"EOS {name}: V0/atom {e['v0_A3'] / e['natoms']:.3f} Å³, B {e['bulk_modulus_GPa']:.1f} GPa")
    if "phonons" in only:
        t0 = time.perf_counter()
        result["phonons"] = phonon_data(model)
        seconds["phonons"] = time.perf_counter() - t0
        print(f"phonons Si: supercell {result['phonons']['supercell']}, "
              f"lowest frequency {result['phonons']['min_frequency_THz']:.3f} THz")
    if "md" in only:
        t0 = time.perf_counter()
        result["md"] = md_data(DEMO_CHECKPOINT, args.md_steps, args.timestep)
        seconds["md"] = time.perf_counter() - t0
        for dtype, r in result["md"]["runs"].items():
            print(f"NVE Si64 {dtype}: drift {r['drift_meV_per_atom_per_ps']:+.4f} meV/atom/ps, "
                  f"span {r['span_meV_per_atom']:.4f} meV/atom, {r['steps_per_s']:.1f} steps/s")
    result["seconds"] = seconds
    if args.json:
        from benchmarks.common import provenance, write_json

        result["meta"] = provenance(argv, "matris-demo", DEMO_CHECKPOINT)
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
