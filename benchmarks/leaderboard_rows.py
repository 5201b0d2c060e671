"""Regenerate ``matris/assets/leaderboard.json`` (the reference rows of ``matris discovery report``)
from a checkout of janosh/matbench-discovery: the ten active models with the highest combined
performance score, and every MatRIS model, with their parameter counts.

    python -m benchmarks.leaderboard_rows --benchmark PATH/TO/matbench-discovery
    python -m benchmarks.leaderboard_rows --benchmark PATH --out matris/assets/leaderboard.json

The metrics are those the leaderboard's CPS reads (site/src/lib/models.svelte.ts
``update_models_cps``): ``metrics.discovery.unique_prototypes.F1``,
``metrics.geo_opt["symprec=1e-2"].rmsd`` and ``metrics.phonons.kappa_103.κ_SRME`` of each
``models/**/*.yml``; the score is :func:`matris.discovery.kappa_metrics.combined_score` (the
site's ``calculate_cps``: None where a metric is missing or invalid). The checkout's commit is
written into the file's ``source``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.common import write_json


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def rows(checkout: Path, top: int = 10) -> list[dict]:
    import yaml

    from matris.discovery.kappa_metrics import combined_score

    out = []
    for path in sorted((checkout / "models").glob("**/*.yml")):
        meta = yaml.safe_load(path.read_text())
        if not isinstance(meta, dict) or "model_name" not in meta:
            continue
        m = meta.get("metrics") or {}
        f1 = _get(m, "discovery", "unique_prototypes", "F1")
        rmsd = _get(m, "geo_opt", "symprec=1e-2", "rmsd")
        kappa = _get(m, "phonons", "kappa_103", "κ_SRME")
        row = {"model": meta["model_name"], "F1": num(f1), "kappa_SRME": num(kappa), "RMSD": num(rmsd),
               "params": meta.get("model_params"), "lifecycle": meta.get("lifecycle", "active"),
               "file": str(path.relative_to(checkout))}
        row["CPS_published"] = combined_score(row["F1"], row["kappa_SRME"], row["RMSD"])
        out.append(row)
    active = [r for r in out if r["lifecycle"] == "active" and r["CPS_published"] is not None]
    best = sorted(active, key=lambda r: -r["CPS_published"])[:top]
    matris = [r for r in out if r["model"].lower().startswith("matris") and r not in best]
    chosen = best + sorted(matris, key=lambda r: -(r["CPS_published"] or -1))
    ranked = sorted(active, key=lambda x: -x["CPS_published"])
    ranks = {id(r): k + 1 for k, r in enumerate(ranked)}
    for r in chosen:
        r["rank_by_CPS"] = ranks.get(id(r))
    for r in chosen:
        del r["CPS_published"]
    return chosen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benchmark", required=True, type=Path, help="a checkout of janosh/matbench-discovery")
    p.add_argument("--commit", default=None, help="the checkout's commit (default: git rev-parse HEAD there)")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    args = p.parse_args(argv)
    commit = args.commit or subprocess.run(["git", "-C", str(args.benchmark), "rev-parse", "HEAD"],
                                           capture_output=True, text=True, check=True).stdout.strip()
    data = {"source": f"Matbench Discovery model files models/**/*.yml in janosh/matbench-discovery at commit "
                      f"{commit}: the {args.top} active models with the highest combined performance score and all "
                      "MatRIS models (F1 of the unique prototypes, metrics.phonons.kappa_103.κ_SRME, "
                      "metrics.geo_opt.symprec=1e-2.rmsd, model_params)",
            "commit": commit, "rows": rows(args.benchmark, args.top)}
    if args.out:
        write_json(args.out, data, ensure_ascii=False)
        print(f"wrote {args.out} ({len(data['rows'])} rows)")
    else:
        print(json.dumps(data, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
