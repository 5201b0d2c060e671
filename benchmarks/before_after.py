"""This commit against an earlier one, side by side in one run: the speed and memory a refactor
must not lose.

    python -m benchmarks.before_after --before 7b03c3c --json benchmarks/results/before_after.json

Both commits are checked out into temporary git worktrees and imported from there (an editable
install of this checkout is bypassed in their processes), so each runs its own code, C++ kernels
included (built once per source tree into the usual cache). Three measurements of the published
MatRIS-10M architecture (``MatRISConfig.published_10m()``, random weights, float32, CPU):

- ``si64``: one ASE calculator call (energy, forces, stress) on the rattled 64-atom Si cell of
  ``matris.bench``, the default kernels, as a user's MD step sees it. One process per commit stays
  up; the rounds alternate between them (one call each, the order swapped every round) after two
  untimed calls each. Medians over ``--rounds``.
- ``si216``: one E+F+S call on the 216-atom Si cell at the streamed memory level 3 (the angles
  streamed through the blocks by chunks, :mod:`matris.model.stream`), in a fresh process per commit
  and round after one untimed call: its seconds and its peak resident memory above the RSS just
  before it. Medians over ``--stream-rounds``.
- ``mgo64``: one training step (``benchmarks/train_memory.py``'s worker: energy, force and stress
  loss with ``create_graph``, backward, AdamW) on 64-atom MgO in the recompute mode ``rows``, in
  a fresh process per commit and round (the peak resident set size is the process's own), the
  commits alternating. Medians over ``--train-rounds``.

The table gives each commit's medians and after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, provenance, write_json

# imported first by every child (PYTHONPATH): drop an editable install's finder, so that matris and
# matris.kernels come from the worktree on sys.path
SHIM = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
"""

# a child that answers "call" with the seconds of one Si64 calculator call
SI64 = """import json, sys, time
import torch
from matris import MatRIS, MatRISCalculator, MatRISConfig
from matris.bench import standard_structure
torch.manual_seed(0)
calc = MatRISCalculator(MatRIS(MatRISConfig.published_10m()).eval(), device="cpu", dtype=torch.float32)
atoms = standard_structure("si", 64).atoms
def call():
    calc.reset()
    t = time.perf_counter()
    calc.calculate(atoms, ["energy", "forces", "stress"])
    return time.perf_counter() - t
call(); call()
print(json.dumps({"ready": __import__("matris").__file__}), flush=True)
for line in sys.stdin:
    print(json.dumps({"seconds": call()}), flush=True)
"""


# a child that prints one streamed (level 3) Si216 call's seconds and peak RSS above the RSS before it
SI216 = """import json, time
import torch
from matris import MatRIS, MatRISCalculator, MatRISConfig
from matris.bench import standard_structure
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
torch.manual_seed(0)
model = MatRIS(MatRISConfig.published_10m()).eval()
model.options.memory_level = 3
calc = MatRISCalculator(model, device="cpu", dtype=torch.float32)
atoms = standard_structure("si", 216).atoms
calc.calculate(atoms, ["energy", "forces", "stress"])
open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the current RSS
calc.reset()
before = status("VmRSS")
t = time.perf_counter()
calc.calculate(atoms, ["energy", "forces", "stress"])
print("ROW " + json.dumps({"seconds": time.perf_counter() - t, "peak_bytes": status("VmHWM") - before}))
"""


def worktree(rev: str, folder: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), rev], check=True,
                   capture_output=True)
    return folder


def child_env(tree: Path, shim: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(tree)])
    return env


def si64(trees: dict[str, Path], shim: Path, rounds: int) -> dict[str, list[float]]:
    procs = {name: subprocess.Popen([sys.executable, "-c", SI64], cwd=tree, env=child_env(tree, shim), text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for name, tree in trees.items()}
    for name, p in procs.items():
        where = json.loads(p.stdout.readline())["ready"]
        assert str(trees[name]) in where, f"{name} imported matris from {where}"
    times: dict[str, list[float]] = {name: [] for name in trees}
    order = list(trees)
    for k in range(rounds):
        for name in order if k % 2 == 0 else order[::-1]:
            procs[name].stdin.write("call\n")
            procs[name].stdin.flush()
            times[name].append(json.loads(procs[name].stdout.readline())["seconds"])
    for p in procs.values():
        p.stdin.close()
        p.wait()
    return times


def mgo64(trees: dict[str, Path], shim: Path, rounds: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {name: [] for name in trees}
    order = list(trees)
    for k in range(rounds):
        for name in order if k % 2 == 0 else order[::-1]:
            tree = trees[name]
            # as a module of that tree (its cwd); in older trees without __init__.py, a namespace package
            res = subprocess.run([sys.executable, "-m", "benchmarks.train_memory", "--worker", "mgo64", "rows",
                                  "--steps", "1", "--warmup", "1"], cwd=tree, env=child_env(tree, shim),
                                 capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(f"{name}: the training step failed:\n{res.stderr[-3000:]}")
            row = json.loads(next(line for line in res.stdout.splitlines() if line.startswith("ROW "))[4:])
            out[name].append({"step_seconds": row["step_seconds"], "peak_rss_bytes": row["peak_rss_bytes"]})
    return out


def si216(trees: dict[str, Path], shim: Path, rounds: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {name: [] for name in trees}
    order = list(trees)
    for k in range(rounds):
        for name in order if k % 2 == 0 else order[::-1]:
            res = subprocess.run([sys.executable, "-c", SI216], cwd=trees[name], env=child_env(trees[name], shim),
                                 capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(f"{name}: the streamed call failed:\n{res.stderr[-3000:]}")
            out[name].append(json.loads(next(line for line in res.stdout.splitlines() if line.startswith("ROW "))[4:]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    p.add_argument("--after", default="HEAD", help="the later commit (default HEAD)")
    p.add_argument("--rounds", type=int, default=7, help="Si64 calls per commit")
    p.add_argument("--stream-rounds", type=int, default=2, help="streamed Si216 calls (processes) per commit")
    p.add_argument("--train-rounds", type=int, default=2, help="MgO64 training steps (processes) per commit")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="matris-before-after-") as tmp:
        tmp = Path(tmp)
        shim = tmp / "shim"
        shim.mkdir()
        (shim / "sitecustomize.py").write_text(SHIM)
        trees = {"before": worktree(args.before, tmp / "before"), "after": worktree(args.after, tmp / "after")}
        revs = {name: subprocess.run(["git", "-C", str(t), "rev-parse", "HEAD"], capture_output=True, text=True,
                                     check=True).stdout.strip() for name, t in trees.items()}
        try:
            calls = si64(trees, shim, args.rounds)
            streamed = si216(trees, shim, args.stream_rounds) if args.stream_rounds else {}
            steps = mgo64(trees, shim, args.train_rounds) if args.train_rounds else {}
        finally:
            for t in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(t)], check=False)

    med = {name: statistics.median(v) for name, v in calls.items()}
    rows = [("Si64 E+F+S call (s)", med["before"], med["after"])]
    for key, label, scale in (("seconds", "Si216 E+F+S call, level 3 (s)", 1),
                              ("peak_bytes", "Si216 E+F+S call, level 3: peak (GB)", 1e-9)):
        if streamed:
            b, a = (statistics.median(r[key] for r in streamed[n]) * scale for n in ("before", "after"))
            rows.append((label, b, a))
    if steps:
        for key, label, scale in (("step_seconds", "MgO64 training step, rows (s)", 1),
                                  ("peak_rss_bytes", "MgO64 training step, rows: peak RSS (GB)", 1e-9)):
            b, a = (statistics.median(r[key] for r in steps[n]) * scale for n in ("before", "after"))
            rows.append((label, b, a))
    print(f"{'':44s} {'before':>10s} {'after':>10s} {'after/before':>12s}")
    for label, b, a in rows:
        print(f"{label:44s} {b:10.3f} {a:10.3f} {a / b:12.3f}")
    if args.json:
        meta = provenance(model_name="MatRIS published 10M architecture (MatRISConfig.published_10m()), random weights")
        write_json(args.json, {"meta": meta, "revisions": revs, "si64_seconds": calls, "si216_level3": streamed,
                               "mgo64": steps,
                               "table": [{"case": label, "before": b, "after": a, "ratio": a / b}
                                         for label, b, a in rows]})


if __name__ == "__main__":
    main()
