"""The accuracy beside the speed: Matbench Discovery's scores of the models `benchmarks/peers.py` times.

    python -m benchmarks.peer_scores MATBENCH_DISCOVERY_GIT [--commit REV] [--json benchmarks/results/peer_scores.json]

Reads each model's file (``models/**/<model>.yml``) of a clone of janosh/matbench-discovery at one
commit (``git show``: a bare clone will do) and writes, per model, the leaderboard's F1 on unique
prototypes, κ_SRME, the geometry-optimization RMSD at ``symprec=1e-2``, the combined performance
score computed from them as the leaderboard computes it
(:func:`matris.discovery.kappa_metrics.combined_score`), the parameter count, and the wall time of
the leaderboard's MD task where the file has one.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from benchmarks.common import ROOT, write_json

# the models of benchmarks/peers.py and their neighbours on the leaderboard
FILES = ["matris/matris-10m-oam", "matris/matris-10m-mp", "matris/matris-v050-mptrj", "chgnet/chgnet-0.3.0",
         "mace/mace-mpa-0", "mattersim/mattersim-v1-5m", "sevennet/sevennet-mf-ompa",
         "sevennet/sevennet-omni-i12", "orb/orb-v3", "esen/esen-30m-oam", "nequip/nequip-oam-xl-0.1",
         "grace/grace-1l-oam", "grace/grace-2l-oam"]


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def row(repo: str, commit: str, name: str) -> dict:
    import yaml

    from matris.discovery.kappa_metrics import combined_score

    path = f"models/{name}.yml"
    doc = yaml.safe_load(_git(repo, "show", f"{commit}:{path}"))
    metrics = doc.get("metrics") or {}

    def get(*keys):
        node = metrics
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return None
            node = node[k]
        return node

    f1 = get("discovery", "unique_prototypes", "F1")
    kappa = get("phonons", "kappa_103", "κ_SRME")
    rmsd = get("geo_opt", "symprec=1e-2", "rmsd")
    md = get("md") if isinstance(get("md"), dict) else {}
    return {"model": doc["model_name"], "file": path, "params": doc.get("model_params"),
            "lifecycle": doc.get("lifecycle"), "F1": f1, "kappa_SRME": kappa, "RMSD": rmsd,
            "CPS": combined_score(f1, kappa, rmsd), "md_seconds": md.get("run_time_sec"),
            "md_hardware": md.get("hardware"), "md_n_systems": md.get("n_systems")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("repo", help="a clone of janosh/matbench-discovery (its folder or git directory)")
    p.add_argument("--commit", default="HEAD")
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "peer_scores.json"))
    args = p.parse_args(argv)
    commit = _git(args.repo, "rev-parse", args.commit).strip()
    rows = [row(args.repo, commit, name) for name in FILES]
    result = {"meta": {"command": "python -m benchmarks.peer_scores MATBENCH_DISCOVERY_GIT --commit " + commit[:10],
                       "source": f"janosh/matbench-discovery@{commit}", "commit_of_source": commit,
                       "fields": "models/**/*.yml: model_name, model_params, metrics.discovery.unique_prototypes.F1, "
                                 "metrics.phonons.kappa_103.κ_SRME, metrics.geo_opt[\"symprec=1e-2\"].rmsd, "
                                 "metrics.md.run_time_sec / hardware / n_systems (the leaderboard's MD task)"},
              "rows": rows}
    write_json(args.json, result, ensure_ascii=False)
    for r in rows:
        cps = f"{r['CPS']:.3f}" if r["CPS"] is not None else "—"
        print(f"{r['model']:<22} CPS {cps}  F1 {r['F1']}  κ_SRME {r['kappa_SRME']}  RMSD {r['RMSD']}")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
