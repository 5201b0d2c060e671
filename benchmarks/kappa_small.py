"""The κ task's worked small case: lattice thermal conductivity of diamond Si and rocksalt MgO at
300 K with the bundled model, in float64 and float32, offline, timed per structure.

    python -m benchmarks.kappa_small                                   # table
    python -m benchmarks.kappa_small --json benchmarks/results/kappa_small_cpu.json

Protocol: :mod:`matris.discovery.kappa` (the benchmark's: symmetry-constrained relaxation,
0.03 Å displacements, Wigner RTA with isotopes); supercells 2×2×2 of the primitive cell for both
force-constant orders, q-mesh 11×11×11 (small, so that it runs in seconds: the benchmark's use
the PhononDB supercells and 19×19×19). The model is the bundled demonstration model, so the
numbers show the pipeline and its cost, not MatRIS's accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time

CASES = {"Si": ("diamond", 5.43), "MgO": ("rocksalt", 4.21)}


def run(case: str, dtype: str, mesh: int) -> dict:
    import numpy as np
    from ase.build import bulk

    from matris import MatRIS
    from matris.discovery.kappa import thermal_conductivity

    kind, a = CASES[case]
    model = MatRIS.load("matris-demo", dtype=dtype)
    t0 = time.perf_counter()
    r = thermal_conductivity(bulk(case, kind, a=a), model, [2, 2, 2], [2, 2, 2], (mesh,) * 3)
    total = time.perf_counter() - t0
    k = np.asarray(r.record.kappa)[0]
    return {"case": case, "dtype": dtype, "kappa_xx_yy_zz": k[:3].tolist(), "kappa_avg": float(k[:3].mean()),
            "imaginary_modes": bool(r.record.has_imaginary), "spg": [r.record.spg_initial, r.record.spg_final],
            "relax_steps": r.relax_steps, "displacements": r.n_displacements,
            "seconds": {**{k: round(v, 3) for k, v in r.seconds.items()}, "total": round(total, 3)}}


def table(rows: list[dict]) -> str:
    lines = ["| structure | dtype | κ (W/m/K) | relax steps | displaced cells | time (s) |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['dtype']} | {r['kappa_avg']:.3f} | {r['relax_steps']} | "
                     f"{r['displacements']} | {r['seconds']['total']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mesh", type=int, default=11)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = [run(case, dtype, args.mesh) for case in CASES for dtype in ("float64", "float32")]
    print(table(rows))
    diffs = {}
    for case in CASES:
        k64, k32 = (next(r["kappa_avg"] for r in rows if r["case"] == case and r["dtype"] == d)
                    for d in ("float64", "float32"))
        diffs[case] = (k32 - k64) / k64
        print(f"{case}: float32 − float64 = {100 * diffs[case]:+.4f} % of κ")
    if args.json:
        from benchmarks.common import provenance, write_json

        meta = provenance(argv, model_name="matris-demo (bundled demonstration model)")
        write_json(args.json, {"meta": meta, "mesh": args.mesh, "supercells": "2x2x2 primitive (fc2 and fc3)",
                               "rows": rows, "float32_relative_difference": diffs})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
