"""Two ``matris`` processes on one machine: an MD run beside a training run, as users run them.

    python -m benchmarks.shared_machine --json benchmarks/results/shared_machine_cpu.json
    python -m benchmarks.shared_machine --smoke            # fewer steps, one policy pair (~2 min)
    python -m benchmarks.shared_machine --matris /path/to/venv/bin/matris   # the wheel's command

Both processes are the ``matris`` command (``--matris``, default the one beside this Python):

- the load: ``matris finetune --from matris-demo --config finetune`` on 96 rattled 32-atom Cu cells
  labelled by ASE's EMT, 2 per batch, run for as long as the measurement takes (its speed is read
  from its ``metrics.csv``, one row per step);
- the measured run: ``matris md`` of a rattled 8-atom diamond Si cell (NVT Langevin, 1 fs,
  ``--md-steps`` steps, the bundled model), its speed from the ``steps_per_s`` of its summary JSON.

Each policy (a set of environment variables given to both processes; "matris" gives none, so it is
what users get) is measured alone (MD only; the training alone for its own speed) and shared (MD
while the training runs, after it has taken ``--settle`` s to reach its steady state). The policies:

- ``libgomp default``: ``GOMP_SPINCOUNT=300000``, libgomp's own default when nothing is set (a
  thread that finishes its share of a parallel loop spins for ~0.1-20 ms before it sleeps);
  this is what ``matris`` ran with before it set a wait policy;
- ``matris``: no variables; the command's own defaults (docs/performance.md, "A shared machine");
- ``short spin``: ``GOMP_SPINCOUNT=10000`` (a thread spins 30 times less long before it sleeps);
- ``one thread``: ``OMP_NUM_THREADS=1`` for both.

The JSON records the commit, the command, the CPU (``lscpu`` model name, widest vector ISA), the core
count, the load average before each case, and every speed; ``shared / alone`` is the ratio the
issue asks about (1 would be no cost at all; two processes fairly sharing the cores give ~0.5).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICIES = {
    "libgomp default": {"GOMP_SPINCOUNT": "300000"},
    "matris": {},
    "short spin": {"GOMP_SPINCOUNT": "10000"},
    "one thread": {"OMP_NUM_THREADS": "1"},
}
# the variables a policy controls: removed from the inherited environment first
CONTROLLED = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "KMP_BLOCKTIME")


def make_inputs(folder: Path) -> dict:
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.io import write

    frames = []
    for k in range(96):
        a = bulk("Cu", "fcc", 3.6, cubic=True).repeat((2, 2, 2))
        a.rattle(0.05, seed=k)
        a.calc = EMT()
        a.get_potential_energy(), a.get_forces(), a.get_stress()
        frames.append(a)
    write(folder / "cu_emt.extxyz", frames)
    si = bulk("Si", "diamond", 5.43, cubic=True)
    si.rattle(0.02, seed=0)
    write(folder / "si8.extxyz", si)
    return {"train": folder / "cu_emt.extxyz", "md": folder / "si8.extxyz"}


def environment(policy: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    env.update(policy)
    return env


class Training:
    """``matris finetune`` in the background; its steps so far from its metrics.csv."""

    def __init__(self, matris: str, data: Path, folder: Path, env: dict):
        self.out = folder
        shutil.rmtree(folder, ignore_errors=True)
        cmd = [matris, "finetune", "--from", "matris-demo", "--config", "finetune", "--data.train", str(data),
               "--data.max_structures", "2", "--trainer.max_steps", "1000000", "--trainer.out_dir", str(folder),
               "--trainer.log_every_n_steps", "1", "--trainer.checkpoint_every_n_steps", "1000000",
               "--trainer.progress_bar", "false"]
        self.log = open(folder.with_suffix(".log"), "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=folder.parent)

    def steps(self) -> tuple[float, int]:
        """(time, the largest step logged so far)."""
        now = time.perf_counter()
        best = -1
        for path in self.out.glob("logs/csv/version_*/metrics.csv"):
            try:
                with open(path) as fh:
                    for row in csv.DictReader(fh):
                        if row.get("step"):
                            best = max(best, int(float(row["step"])))
            except (OSError, ValueError):
                continue
        if self.proc.poll() is not None:
            raise RuntimeError(f"the training stopped (exit {self.proc.returncode}); see {self.log.name}")
        return now, best

    def wait_started(self, settle: float, timeout: float = 600) -> None:
        t0 = time.perf_counter()
        while self.steps()[1] < 1:
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"the training took over {timeout} s to start; see {self.log.name}")
            time.sleep(0.5)
        time.sleep(settle)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def run_md(matris: str, structure: Path, folder: Path, steps: int, env: dict) -> dict:
    traj = folder / "md.extxyz"
    for p in folder.glob("md*"):
        p.unlink()
    cmd = [matris, "md", str(structure), "--steps", str(steps), "--loginterval", str(steps), "--trajectory",
           str(traj), "--overwrite", "--quiet", "--seed", "0"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=folder)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"matris md failed ({out.returncode}):\n{out.stderr[-2000:]}")
    summary = json.loads((folder / "md.json").read_text())
    return {"steps_per_s": summary["steps_per_s"], "wall_s": wall}


def train_alone(matris: str, data: Path, folder: Path, env: dict, settle: float, seconds: float) -> float:
    job = Training(matris, data, folder, env)
    try:
        job.wait_started(settle)
        t0, s0 = job.steps()
        time.sleep(seconds)
        t1, s1 = job.steps()
    finally:
        job.stop()
    return (s1 - s0) / (t1 - t0)


def heavy_call(matris: str, checkpoint: Path, folder: Path, env: dict, repeat: int) -> float:
    """Seconds of one E+F+S call of the published architecture on Si64 (``matris bench``'s median)."""
    out = folder / "bench.json"
    cmd = [matris, "bench", "--model", str(checkpoint), "--sizes", "64", "--repeat", str(repeat), "--md-steps", "0",
           "--compare", "--json", str(out), "--quiet"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=folder)
    if done.returncode != 0:
        raise RuntimeError(f"matris bench failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return float(json.loads(out.read_text())["rows"][0]["efs_s"])


def measure(args) -> dict:
    import torch

    from benchmarks.common import cpu_description, lscpu_model, provenance
    from matris import MatRIS, MatRISConfig

    matris = args.matris or str(Path(sys.executable).with_name("matris"))
    policies = {k: POLICIES[k] for k in (["libgomp default", "matris"] if args.smoke else args.policies)}
    work = Path(tempfile.mkdtemp(prefix="matris-shared-"))
    inputs = make_inputs(work)
    torch.manual_seed(0)
    checkpoint = MatRIS(MatRISConfig.published_10m()).save(work / "published-10m-random.pth.tar")
    meta = provenance(model_name="matris-demo (md, training: fine-tuned on Cu EMT); published 10M architecture, "
                                 "random weights, seed 0 (the Si64 call)")
    meta.update(lscpu_model=lscpu_model(), cpu=cpu_description(), cores=os.cpu_count(), md_steps=args.md_steps,
                settle_s=args.settle, train_seconds=args.train_seconds, rounds=args.rounds,
                matris_command=Path(matris).name, policies=policies)
    samples = {name: {"md_alone": [], "md_shared": [], "train_alone": [], "train_shared": [], "si64_efs_s": [],
                      "loadavg_before": []} for name in policies}
    try:
        for name, policy in policies.items():  # warm the file caches and the kernels' build
            run_md(matris, inputs["md"], work, 10, environment(policy))
        for r in range(args.rounds):  # interleaved: a slow spell of the machine hits every policy alike
            for name, policy in policies.items():
                env, got = environment(policy), samples[name]
                got["loadavg_before"].append(os.getloadavg()[0])
                got["md_alone"].append(run_md(matris, inputs["md"], work, args.md_steps, env)["steps_per_s"])
                got["si64_efs_s"].append(heavy_call(matris, checkpoint, work, env, args.repeat))
                got["train_alone"].append(train_alone(matris, inputs["train"], work / "train", env, args.settle,
                                                      args.train_seconds))
                job = Training(matris, inputs["train"], work / "train", env)
                try:
                    job.wait_started(args.settle)
                    t0, s0 = job.steps()
                    got["md_shared"].append(run_md(matris, inputs["md"], work, args.md_steps, env)["steps_per_s"])
                    t1, s1 = job.steps()
                finally:
                    job.stop()
                got["train_shared"].append((s1 - s0) / (t1 - t0))
                print(f"round {r + 1}: " + line(summary(name, got)), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"meta": meta, "rows": [summary(name, got) for name, got in samples.items()]}


def summary(name: str, got: dict) -> dict:
    row = {"policy": name, "env": POLICIES[name], "samples": got}
    for key in ("md_alone", "md_shared", "train_alone", "train_shared", "si64_efs_s"):
        row[key] = statistics.median(got[key])
    row["md_shared_over_alone"] = row["md_shared"] / row["md_alone"]
    row["train_shared_over_alone"] = row["train_shared"] / row["train_alone"]
    return row


HEADER = (f"{'policy':16s} {'md alone':>9s} {'md shared':>9s} {'ratio':>6s} {'train alone':>11s} "
          f"{'train shared':>12s} {'ratio':>6s} {'Si64 E+F+S s':>12s}   (steps/s; medians)")


def line(row: dict) -> str:
    return (f"{row['policy']:16s} {row['md_alone']:9.2f} {row['md_shared']:9.2f} {row['md_shared_over_alone']:6.2f} "
            f"{row['train_alone']:11.2f} {row['train_shared']:12.2f} {row['train_shared_over_alone']:6.2f} "
            f"{row['si64_efs_s']:12.3f}")


def markdown(result: dict) -> str:
    """The docs' table: one row per policy, medians of the interleaved rounds."""
    m = result["meta"]
    rows = ["| policy (both processes) | md alone, steps/s | md beside training | ratio | training alone, steps/s "
            "| training beside md | ratio | published Si64 E+F+S alone, s |", "|" + "---|" * 8]
    for r in result["rows"]:
        env = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "none set"
        rows.append(f"| {r['policy']} ({env}) | {r['md_alone']:.1f} | {r['md_shared']:.2f} "
                    f"| {r['md_shared_over_alone']:.2f} | {r['train_alone']:.2f} | {r['train_shared']:.2f} "
                    f"| {r['train_shared_over_alone']:.2f} | {r['si64_efs_s']:.2f} |")
    rows.append("")
    rows.append(f"**Machine:** {m.get('lscpu_model')} ({m['cpu']['isa']}), {m['cores']} cores. `matris md` of Si8 "
                f"({m['md_steps']} NVT steps, matris-demo) and `matris finetune` of matris-demo on 32-atom Cu cells "
                f"(2 per batch), medians of {m['rounds']} interleaved rounds; the Si64 call is `matris bench` on "
                "the published 10M architecture (random weights).")
    return "\n".join(rows)


def table(result: dict) -> str:
    return "\n".join([HEADER, *map(line, result["rows"])])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matris", help="the matris command to run (default: the one beside this Python)")
    p.add_argument("--md-steps", type=int, default=200)
    p.add_argument("--settle", type=float, default=10.0, help="s the training runs before the MD starts")
    p.add_argument("--train-seconds", type=float, default=20.0, help="s the training alone is timed")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--repeat", type=int, default=3, help="timed Si64 calls per round (matris bench --repeat)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--smoke", action="store_true", help="60 MD steps, two policies")
    args = p.parse_args(argv)
    if args.smoke:
        args.md_steps, args.settle, args.train_seconds, args.rounds, args.repeat = 60, 5.0, 10.0, 1, 1
    print(HEADER, flush=True)
    result = measure(args)
    print("\n" + table(result))
    if args.json:
        from benchmarks.common import write_json

        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
