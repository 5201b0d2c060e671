"""κ from ``matris discovery kappa`` against Matbench Discovery's own κ code, on the same cells and
model: κ̄ per material from both and κ_SRME/SRD of ours with the benchmark's as the reference.

    python -m benchmarks.kappa_vs_benchmark --benchmark PATH/TO/matbench-discovery
    python -m benchmarks.kappa_vs_benchmark --benchmark PATH --json benchmarks/results/kappa_vs_benchmark.json

PATH is a checkout of janosh/matbench-discovery (not a dependency; the comparison was made at
commit 2c7f9fc42d018711dc2f5df573d225ea6d2d17b2). The benchmark's side runs its
``matbench_discovery.phonons.pipeline.calculate_kappa_for_structure`` with the standard adapter
and the settings of its MatRIS model file (``models/matris/matris-10m-oam.yml``,
``hyperparams.evaluation.kappa``), the model evaluated through :class:`matris.MatRISCalculator`;
our side runs :func:`matris.discovery.kappa.thermal_conductivity` with its defaults. The κ_SRME
between the two is the benchmark's own ``calc_kappa_metrics_from_dfs`` (its
``metrics/phonons.py``; the module's data-file imports are stubbed, nothing is downloaded) and
ours (:func:`matris.discovery.kappa_metrics.kappa_metrics`).

Both sides start from the same in-memory ``Atoms`` (no file round trip of the positions, which
alone moves MgO's κ by ~0.7 %), use the same model object in float64, and the script reports
the largest difference between the two relaxed cells and positions, so that any κ difference
left is the pipelines', not the inputs'. It needs the benchmark's phono3py (3.30.0, with
``MS-SMM19``) and its imports (pymatviz, filelock, tqdm, pyyaml, moyopy).

The cells: diamond Si, rocksalt MgO and NaCl (ASE's primitive cells), supercells 2×2×2 for FC2
and FC3, q-mesh 7×7×7 (small, to run in minutes on two cores), the bundled demonstration model.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

from benchmarks.common import load_module

CASES = {"Si": ("diamond", 5.43), "MgO": ("rocksalt", 4.21), "NaCl": ("rocksalt", 5.64)}


def load_benchmark(path: Path):
    """The benchmark's κ pipeline and metric modules from the checkout at ``path`` (its package
    ``matbench_discovery``, imported from there, not from an installed one)."""
    # metrics/phonons.py imports matbench_discovery.data, which loads the WBM summary at import
    # time (a download); the two helpers it takes from there only write model files
    stub = types.ModuleType("matbench_discovery.data")
    stub.file_ref_name = stub.make_file_ref = lambda *a, **k: None
    sys.modules["matbench_discovery.data"] = stub
    load_module("matbench_discovery", path / "matbench_discovery")
    import yaml
    from matbench_discovery.metrics import phonons as metrics
    from matbench_discovery.phonons import pipeline
    from matbench_discovery.phonons.adapters.standard import StandardKappaAdapter
    yml = yaml.safe_load((path / "models/matris/matris-10m-oam.yml").read_text())
    settings = pipeline.KappaSettings.from_mapping(yml["hyperparams"]["evaluation"]["kappa"])
    return pipeline, metrics, StandardKappaAdapter(), settings


def cells(names, supercell: int, mesh: int) -> dict:
    from ase.build import bulk

    out = {}
    for name in names:
        kind, a = CASES[name]
        atoms = bulk(name, kind, a=a)
        atoms.info.update(material_id=name, fc2_supercell=[supercell] * 3, fc3_supercell=[supercell] * 3,
                          q_point_mesh=[mesh] * 3)
        out[name] = atoms
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benchmark", required=True, type=Path, help="a checkout of janosh/matbench-discovery")
    p.add_argument("--materials", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--mesh", type=int, default=7)
    p.add_argument("--supercell", type=int, default=2)
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--batch-size", type=int, default=1,
                   help="our displaced supercells per model call (default 1: forces bitwise equal to the "
                        "benchmark's one-by-one calculator calls; 8 moves MgO's κ by 0.3 %% through 2e-16 eV/Å sums)")
    p.add_argument("--json", default=None)
    p.add_argument("--arrays", default=None, help="an .npz for both sides' κ, diagonal mode κ and weights")
    args = p.parse_args(argv)

    import numpy as np
    import pandas as pd

    from matris import MatRIS
    from matris.calculator import MatRISCalculator
    from matris.discovery.kappa import KappaProtocol, thermal_conductivity
    from matris.discovery.kappa_metrics import KappaRecord, kappa_metrics

    pipeline, bench_metrics, adapter, settings = load_benchmark(args.benchmark.resolve())
    protocol = KappaProtocol(batch_size=args.batch_size)
    model = MatRIS.load("matris-demo", dtype=args.dtype)
    rows, ours, theirs, pred_rows, true_rows = [], {}, {}, [], []
    for name, atoms in cells(args.materials, args.supercell, args.mesh).items():
        t0 = time.perf_counter()
        b = pipeline.calculate_kappa_for_structure(atoms=atoms, calculator=MatRISCalculator(model),
                                                   settings=settings, adapter=adapter).result
        t_bench = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = thermal_conductivity(atoms, model, [args.supercell] * 3, [args.supercell] * 3, (args.mesh,) * 3,
                                 protocol)
        t_ours = time.perf_counter() - t0
        # the benchmark's relaxed cell, again from the same input, for the position check
        relaxed_b = adapter.relax(atoms.copy(), MatRISCalculator(model), settings, log_file=None).atoms
        from matris.discovery.kappa import relax_with_symmetry
        relaxed_o, _ = relax_with_symmetry(atoms, MatRISCalculator(model), protocol)
        d_pos = float(np.abs(relaxed_b.positions - relaxed_o.positions).max())
        d_cell = float(np.abs(relaxed_b.cell[:] - relaxed_o.cell[:]).max())

        k_b = np.asarray(b["kappa_tot_rta"], dtype=float)  # [T, 3, 3] (the benchmark's schema)
        kbar_b = float(np.trace(k_b[0]) / 3) if k_b.ndim == 3 else float("nan")
        mode_b = np.asarray(b["mode_kappa_tot_rta"], dtype=float)  # [T, q, b, 3, 3]
        mode_b_diag = np.einsum("...ii->...i", mode_b)
        theirs[name] = KappaRecord(kappa=np.concatenate([np.einsum("tii->ti", k_b), np.zeros((len(k_b), 3))], axis=1),
                                   mode_kappa=mode_b_diag, weights=np.asarray(b["mode_weights"], dtype=float))
        ours[name] = r.record
        true_rows.append({"material_id": name, "kappa_tot_rta": b["kappa_tot_rta"],
                          "kappa_tot_avg": bench_metrics.calculate_kappa_avg(b["kappa_tot_rta"]),
                          "mode_kappa_tot_rta": b["mode_kappa_tot_rta"], "mode_weights": b["mode_weights"]})
        pred_rows.append({"material_id": name, "kappa_tot_rta": np.asarray(r.record.kappa),
                          "mode_kappa_tot_rta": np.asarray(r.record.mode_kappa), "mode_weights": r.record.weights,
                          "has_imag_ph_modes": r.record.has_imaginary, "init_spg_num": r.record.spg_initial,
                          "final_spg_num": r.record.spg_final})
        rows.append({"material": name, "kappa_benchmark": kbar_b, "kappa_ours": r.kappa_average,
                     "relax_steps_benchmark": int(b["n_steps"]), "relax_steps_ours": r.relax_steps,
                     "spg_benchmark": [int(b["init_spg_num"]), int(b["final_spg_num"])],
                     "spg_ours": [r.record.spg_initial, r.record.spg_final], "method_ours": r.method,
                     "max_abs_d_positions_A": d_pos, "max_abs_d_cell_A": d_cell,
                     "seconds": {"benchmark": round(t_bench, 2), "ours": round(t_ours, 2)}})
        print(f"{name}: κ̄ benchmark {kbar_b:.6f}, ours {r.kappa_average:.6f} W/m/K; relaxation steps "
              f"{b['n_steps']}/{r.relax_steps}; |Δ positions| ≤ {d_pos:.1e} Å, |Δ cell| ≤ {d_cell:.1e} Å", flush=True)

    df_pred = pd.DataFrame(pred_rows).set_index("material_id")
    df_true = pd.DataFrame(true_rows).set_index("material_id")
    df = bench_metrics.calc_kappa_metrics_from_dfs(df_pred, df_true)
    m_ours = kappa_metrics(ours, theirs)
    for row in rows:
        row["SRME_benchmark_code"] = float(df.loc[row["material"], "srme"])
        row["SRD_benchmark_code"] = float(df.loc[row["material"], "srd"])
        row["SRME_ours"] = m_ours["per_material"][row["material"]]["SRME"]
    print("\n| material | κ̄ benchmark (W/m/K) | κ̄ ours | relative difference | SRME (benchmark's code) | SRME (ours) |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        rel = (row["kappa_ours"] - row["kappa_benchmark"]) / row["kappa_benchmark"]
        print(f"| {row['material']} | {row['kappa_benchmark']:.4f} | {row['kappa_ours']:.4f} | {rel:+.2e} | "
              f"{row['SRME_benchmark_code']:.2e} | {row['SRME_ours']:.2e} |")
    srme_b, srme_o = float(df["srme"].mean()), m_ours["kappa_SRME"]
    print(f"\nκ_SRME (ours vs the benchmark's κ): {srme_b:.2e} (the benchmark's metric code), {srme_o:.2e} (ours)")
    if args.arrays:
        np.savez(args.arrays, **{f"{side}_{name}_{key}": np.asarray(getattr(rec, key), dtype=float)
                                 for side, recs in (("benchmark", theirs), ("ours", ours))
                                 for name, rec in recs.items() for key in ("kappa", "mode_kappa", "weights")})
    if args.json:
        import phono3py

        from benchmarks.common import provenance, write_json

        meta = provenance(argv, model_name=f"matris-demo (bundled demonstration model), {args.dtype}")
        write_json(args.json, {"meta": meta, "benchmark_commit": "2c7f9fc42d018711dc2f5df573d225ea6d2d17b2",
                               "phono3py": phono3py.__version__, "mesh": args.mesh,
                               "batch_size": args.batch_size,
                               "supercells": f"{args.supercell}x{args.supercell}x{args.supercell}",
                               "rows": rows, "kappa_SRME_benchmark_code": srme_b, "kappa_SRME_ours": srme_o})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
