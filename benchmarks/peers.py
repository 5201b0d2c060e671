"""Speed and memory of MatRIS-10M against the universal potentials users would pick instead.

    python -m benchmarks.peers --setup all --envs DIR     # one environment per model under DIR
    python -m benchmarks.peers --json benchmarks/results/peers_cpu.json   # $MATRIS_PEERS_ENVS set
    python -m benchmarks.peers --models ours chgnet mace --structures si64 --rounds 3
    python -m benchmarks.peers --smoke                     # Si8, ours only, one round (CI's check)
    python -m benchmarks.peers --markdown benchmarks/results/peers_cpu.json   # the docs' table

Every model runs through its own ASE calculator, as a user's script calls it, in a process of its
own (``benchmarks/peer_worker.py``, the worker protocol of ``benchmarks/common.py``) started from
its own environment (``--envs DIR`` or ``$MATRIS_PEERS_ENVS``: ``DIR/<env>/bin/python``), because
the peers' pins conflict (MACE needs e3nn 0.4.4,
SevenNet a newer one; the official MatRIS declares Python >= 3.12; GRACE is TensorFlow). Each
environment is made by ``--setup`` from its builder module's ``REQUIREMENTS``
(``benchmarks/peer_models/<module>.py``: what the model is, where its weights come from, its
published hyperparameters and parameter count); ours is the wheel built from this checkout.

Models: each at its published size. Published weights where the package ships them (CHGNet 0.3.0);
elsewhere the published architecture with random weights built by the peer's own code (the weights
download at run time, which this machine cannot do; speed and memory do not depend on their values).
The parameter count of every built model is printed beside the published one.

Per model and structure (rattled diamond Si of 64, 216 and 512 atoms and a cubic SrTiO3 perovskite
of 135 atoms, float32):

- **E+F+S**: one ``calc.calculate(atoms, ["energy", "forces", "stress"])`` on a freshly rattled
  geometry (neighbour list included);
- **MD step**: one ASE Velocity-Verlet step (one force call);
- **peak memory**: a fresh process builds the model and makes one E+F+S call; ``peak_rss_gb`` is its
  peak resident memory, ``base_rss_gb`` the resident memory after building (interpreter, libraries,
  model), ``per_atom_kb`` = (peak − base) / atoms. A process that passes ``--max-rss-gb`` is stopped
  and its row says so; the timing rounds skip it.

Timing: the models of a structure run side by side in interleaved rounds (every round one E+F+S
and one MD step of each model, the order rotated per round), after one untimed call each; the table
gives medians over rounds and the spread (min–max). Ratios are of medians from the same rounds.
The JSON records the CPU model, its widest vector instruction set, and this machine's measured
float32 GEMM rate (PyTorch ``mm``, 2 threads) beside the ratios, and the profile of our Si64 call
(op families' self time, the GEMM floor: ``benchmarks/cpu_speed.py``'s measurements). Adding a
model: docs/developing/peer-models.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import (
    HERE,
    ROOT,
    Worker,
    WorkerError,
    env_python,
    envs_folder,
    gemm_rate,
    provenance,
    summarize,
    worker_env,
    write_json,
)

# key → (builder module, environment, build options)
MODELS = {
    "ours": ("ours", "ours", {}),
    "ours-compile": ("ours", "ours", {"compile": True}),
    "official": ("official", "official", {"mode": "torch"}),
    "chgnet": ("chgnet_030", "chgnet", {}),
    "mace": ("mace_mpa", "mace", {}),
    "mattersim": ("mattersim_v1", "mattersim", {}),
    "sevenn": ("sevennet", "sevenn", {}),
    "orb": ("orb", "orb", {}),
    "esen": ("esen", "fairchem", {}),
    "grace": ("grace", "grace", {}),
}
STRUCTURES = ("si64", "si216", "si512", "srtio3_135")


# ----------------------------------------------------------------------------- structures
def structure(key: str) -> dict:
    """A structure request: ``si<N>`` (the rattled diamond-Si cells of :mod:`matris.bench`) or
    ``srtio3_<N>`` (cubic SrTiO3, a = 3.905 Å, N/5 cells, rattled by 0.02 Å)."""
    import numpy as np

    if key.startswith("si"):
        from matris.bench.structures import standard_structure

        atoms = standard_structure("si", int(key[2:])).atoms
    elif key.startswith("srtio3_"):
        n = round((int(key.split("_")[1]) // 5) ** (1 / 3))
        atoms = _perovskite(n)
        rng = np.random.default_rng([0, len(atoms)])
        atoms.positions += rng.normal(scale=0.02, size=atoms.positions.shape)
    else:
        raise SystemExit(f"unknown structure {key!r}; use si<N> or srtio3_<N>")
    return {"key": key, "name": key, "numbers": [int(z) for z in atoms.numbers],
            "positions": atoms.positions.tolist(), "cell": atoms.cell.array.tolist(),
            "pbc": [bool(p) for p in atoms.pbc], "n_atoms": len(atoms),
            "formula": atoms.get_chemical_formula()}


def _perovskite(n: int):
    from ase import Atoms

    a = 3.905
    cell = Atoms("SrTiO3", scaled_positions=[(0, 0, 0), (0.5, 0.5, 0.5), (0.5, 0.5, 0), (0.5, 0, 0.5), (0, 0.5, 0.5)],
                 cell=[a, a, a], pbc=True)
    return cell.repeat((n, n, n))


# ----------------------------------------------------------------------------- environments
def module_meta(module: str) -> dict:
    """The builder module's declarations (read without importing it: its package is not ours)."""
    import ast

    tree = ast.parse((HERE / "peer_models" / f"{module}.py").read_text())
    meta = {"doc": ast.get_docstring(tree) or ""}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                meta[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return meta


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` that runs: pyenv's installs first (its shims fail unless that
    version is selected), then ``python<version>`` on PATH."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [str(p) for p in sorted(pyenv.glob(f"{version}*/bin/python"))]
    candidates += [c for c in [shutil.which(f"python{version}")] if c]
    for candidate in candidates:
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


def setup(envs: Path, names: list[str]) -> None:
    """Make the environments of ``names`` (or every one) from their modules' ``REQUIREMENTS``."""
    wanted = {MODELS[k][1]: MODELS[k][0] for k in MODELS if not names or "all" in names or MODELS[k][1] in names
              or k in names}
    for env, module in wanted.items():
        meta = module_meta(module)
        version = meta.get("PYTHON", "3.11")
        base = find_python(version)
        if base is None:
            print(f"[{env}] no Python {version} here; skipped")
            continue
        target = envs / env
        print(f"[{env}] {base} -m venv {target}")
        subprocess.run([str(base), "-m", "venv", str(target)], check=True)
        pip = [str(env_python(envs, env)), "-m", "pip", "install"]
        for req in meta.get("REQUIREMENTS", []):
            if "{wheel}" in req:
                req = req.replace("{wheel}", str(build_wheel()))
                # the checkout's wheel keeps its version between commits: reinstall it (its dependencies
                # stay), or pip keeps the previous commit's code
                subprocess.run(pip + ["--force-reinstall", "--no-deps", req.split()[0].split("[")[0]], check=True)
            print(f"[{env}] pip install {req}")
            subprocess.run(pip + req.split(), check=True)


def build_wheel() -> Path:
    """The wheel of this checkout (what users install), built into a temporary folder."""
    out = Path(tempfile.mkdtemp(prefix="matris-wheel-"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(ROOT)], check=True)
    return next(out.glob("matris_mlip-*.whl"))


# ----------------------------------------------------------------------------- workers
def start_worker(envs: Path, key: str, threads: int, dtype: str, log, timeout_s: float | None = None,
                 max_rss_gb: float | None = None) -> Worker:
    """A worker process of model ``key`` in its environment (``benchmarks/peer_worker.py``, isolated
    from this checkout); its hello reports the built model."""
    module, env, options = MODELS[key]
    python = env_python(envs, env)
    if not python.exists():
        raise WorkerError(f"its environment {python.parent.parent} is not set up "
                          f"(python -m benchmarks.peers --setup {env})")
    cmd = [python, "-I", HERE / "peer_worker.py", "--module", module, "--dtype", dtype, "--threads", threads,
           "--options", json.dumps(options)]
    return Worker(cmd, name=key, stderr=log, env=worker_env(TF_CPP_MIN_LOG_LEVEL="2"), timeout_s=timeout_s,
                  max_rss_gb=max_rss_gb)


def oneshot(envs: Path, key: str, st: dict, threads: int, dtype: str, limit_gb: float, timeout: float,
            log) -> dict:
    """Peak memory of one E+F+S call of ``key`` on ``st`` in a fresh process: its hello (the model
    built; ``base_rss_gb`` its resident memory then) and one ``efs`` answer."""
    worker = start_worker(envs, key, threads, dtype, log, timeout_s=timeout, max_rss_gb=limit_gb)
    try:
        one = worker.request("efs", structure=st, seed=0)
    finally:
        worker.close()
    return {**worker.hello, **one, "base_rss_gb": worker.hello["rss_gb"]}


# ----------------------------------------------------------------------------- measurements
def our_profile(threads: int) -> dict:
    """Where our Si64 E+F+S call's time goes: op families' self time and the GEMM floor."""
    import torch

    from benchmarks.cpu_speed import gemm_floor, op_shares
    from matris import MatRIS, MatRISCalculator, MatRISConfig
    from matris.bench.structures import standard_structure

    torch.set_num_threads(threads)
    calc = MatRISCalculator(MatRIS(MatRISConfig.published_10m()), device="cpu", dtype="float32")
    atoms = standard_structure("si", 64).atoms
    calc.calculate(atoms, ["energy", "forces", "stress"])
    return {"ops": op_shares(calc, atoms), "gemm_floor": gemm_floor(calc, atoms, None)}


def scores() -> dict:
    """Matbench-Discovery combined scores by leaderboard model name (``benchmarks/results/peer_scores.json``)."""
    path = HERE / "results" / "peer_scores.json"
    if not path.exists():
        return {}
    return {r["model"]: r for r in json.loads(path.read_text())["rows"]}


def run(args) -> dict:
    envs = envs_folder(args.envs)
    log = open(args.log, "a") if args.log else subprocess.DEVNULL
    structures = [structure(k) for k in args.structures]
    result = {"meta": {**provenance(), "dtype": args.dtype, "threads": args.threads, "rounds": args.rounds,
                       "max_rss_gb": args.max_rss_gb, "gemm": gemm_rate(args.threads)},
              "structures": {s["key"]: {"n_atoms": s["n_atoms"], "formula": s["formula"]} for s in structures},
              "models": {}}
    board = scores()
    for key in args.models:
        module = MODELS[key][0]
        meta = module_meta(module)
        row = {"name": meta.get("NAME", key), "package": meta.get("PACKAGE"),
               "published_params": meta.get("PUBLISHED_PARAMS"), "leaderboard_model": meta.get("LEADERBOARD_MODEL"),
               "options": MODELS[key][2], "structures": {}}
        score = board.get(meta.get("LEADERBOARD_MODEL") or "")
        if score:
            row["score"] = {k: score.get(k) for k in ("CPS", "F1", "kappa_SRME", "RMSD")}
        result["models"][key] = row
        print(f"[{key}] memory: fresh processes", flush=True)
        for st in structures:
            try:
                one = oneshot(envs, key, st, args.threads, args.dtype, args.max_rss_gb, args.timeout, log)
            except WorkerError as exc:
                one = {"ok": False, "error": str(exc), "traceback": exc.traceback}
            entry = {}
            if one.get("ok"):
                for k in ("params", "weights", "note", "python", "build_seconds"):
                    row.setdefault(k, one.get(k))
                entry = {"peak_rss_gb": one["peak_rss_gb"], "base_rss_gb": one["base_rss_gb"],
                         "per_atom_kb": (one["peak_rss_gb"] - one["base_rss_gb"]) * 2**20 / st["n_atoms"],
                         "energy": one["energy"]}
                print(f"  {st['key']}: peak {one['peak_rss_gb']:.2f} GB (base {one['base_rss_gb']:.2f})", flush=True)
            else:
                entry = {"error": one.get("error")}
                print(f"  {st['key']}: {one.get('error')}", flush=True)
                if one.get("traceback") and log is not subprocess.DEVNULL:
                    log.write(one["traceback"])
            row["structures"][st["key"]] = entry
        if not any("error" not in e for e in row["structures"].values()):
            row["error"] = next(iter(row["structures"].values())).get("error")
    # timing: per structure, the models that fit, interleaved
    for st in structures:
        keys = [k for k in args.models if "error" not in result["models"][k]["structures"][st["key"]]]
        print(f"[{st['key']}] timing {', '.join(keys)}", flush=True)
        for group in _groups(keys, st["key"], result, args.max_rss_gb):
            _time_group(envs, group, st, args, result, log)
    return result


def _groups(keys: list[str], skey: str, result: dict, limit: float) -> list[list[str]]:
    """Models whose workers can be alive together: their fresh-process peaks sum under ``limit``."""
    groups, used = [], []
    for k in keys:
        peak = result["models"][k]["structures"][skey]["peak_rss_gb"]
        for g, u in zip(groups, used):
            if u + peak < limit:
                g.append(k)
                used[groups.index(g)] += peak
                break
        else:
            groups.append([k])
            used.append(peak)
    return groups


def _time_group(envs: Path, keys: list[str], st: dict, args, result: dict, log) -> None:
    workers = {}
    for k in keys:
        try:
            workers[k] = start_worker(envs, k, args.threads, args.dtype, log)
            workers[k].request("efs", structure=st, seed=10_000)  # untimed: first-call costs
            workers[k].request("md", structure=st, key=st["key"])
        except WorkerError as exc:
            result["models"][k]["structures"][st["key"]]["error"] = str(exc)
            workers.pop(k, None)
    efs = {k: [] for k in workers}
    md = {k: [] for k in workers}
    try:
        for r in range(args.rounds):
            order = list(workers)
            order = order[r % len(order):] + order[: r % len(order)]
            for k in order:
                efs[k].append(workers[k].request("efs", structure=st, seed=r)["seconds"])
                md[k].append(workers[k].request("md", structure=st, key=st["key"])["seconds"])
    except WorkerError as exc:
        print(f"  {exc}", flush=True)
    finally:
        for w in workers.values():
            w.close()
    for k in workers:
        entry = result["models"][k]["structures"][st["key"]]
        if efs[k]:
            entry["efs_seconds"], entry["md_seconds"] = summarize(efs[k]), summarize(md[k])
            print(f"  {k}: E+F+S {entry['efs_seconds']['median']:.3f} s, MD step "
                  f"{entry['md_seconds']['median']:.3f} s", flush=True)


# ----------------------------------------------------------------------------- report
def ratios(result: dict, base: str = "ours") -> dict:
    """``{structure: {model: ours/peer}}`` of median E+F+S times (below 1: ours is faster)."""
    out = {}
    for skey in result["structures"]:
        ours = result["models"].get(base, {}).get("structures", {}).get(skey, {}).get("efs_seconds")
        if not ours:
            continue
        out[skey] = {k: ours["median"] / row["structures"][skey]["efs_seconds"]["median"]
                     for k, row in result["models"].items()
                     if k != base and "efs_seconds" in row["structures"].get(skey, {})}
    return out


def markdown(path: str) -> str:
    """The docs' table from a result file."""
    result = json.loads(Path(path).read_text())
    skeys = list(result["structures"])
    head = ["model", "params (built / published)", "weights", "CPS"]
    head += [f"{k} E+F+S s" for k in skeys] + [f"{k} MD step s" for k in skeys[:1]]
    head += [f"{k} peak GB" for k in skeys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, row in result["models"].items():
        if "error" in row and not row.get("params"):
            lines.append(f"| {row['name']} | — | — | {_cps(row)} | " + " | ".join(
                ["not run: " + row["error"]] + [""] * (len(head) - 5)) + " |")
            continue
        cells = [row["name"], f"{_m(row.get('params'))} / {_m(row.get('published_params'))}", row.get("weights") or "",
                 _cps(row)]
        for k in skeys:
            cells.append(_time(row["structures"].get(k, {}), "efs_seconds"))
        cells.append(_time(row["structures"].get(skeys[0], {}), "md_seconds"))
        for k in skeys:
            e = row["structures"].get(k, {})
            cells.append(f"{e['peak_rss_gb']:.2f}" if "peak_rss_gb" in e else _why(e))
        lines.append("| " + " | ".join(cells) + " |")
    meta = result["meta"]
    lines.append("")
    lines.append(f"{meta['cpu']['model']} ({meta['cpu']['isa']}), {meta['threads']} threads, {meta['dtype']}; "
                 f"float32 GEMM rate {meta['gemm']['gflops_1024cubed']:.0f} GFLOP/s (1,024³), "
                 f"{meta['gemm']['gflops_4096x128x256']:.0f} GFLOP/s (4,096 × 128 → 256). Medians of "
                 f"{meta['rounds']} interleaved rounds (min–max in the JSON); commit {meta['commit'][:10]}.")
    return "\n".join(lines)


def _m(n) -> str:
    return f"{n / 1e6:.1f}M" if isinstance(n, (int, float)) else "?"


def _cps(row) -> str:
    s = row.get("score", {}).get("CPS")
    return f"{s:.3f}" if isinstance(s, (int, float)) else "—"


def _time(entry: dict, key: str) -> str:
    if key in entry:
        t = entry[key]
        return f"{t['median']:.3g} ({t['min']:.3g}–{t['max']:.3g})"
    return _why(entry)


def _why(entry: dict) -> str:
    err = entry.get("error")
    if not err:
        return "—"
    return "over memory limit" if "resident" in err else "failed"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--models", nargs="+", choices=list(MODELS), help="default: all (--smoke: ours)")
    p.add_argument("--structures", nargs="+", default=list(STRUCTURES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--envs", default=None, metavar="DIR",
                   help="folder of the models' environments, DIR/<env>/bin/python (default: $MATRIS_PEERS_ENVS)")
    p.add_argument("--max-rss-gb", type=float, default=18.0, help="stop a worker past this resident memory")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a fresh-process memory run may take")
    p.add_argument("--log", help="append the workers' stderr here (default: discarded)")
    p.add_argument("--json", help="write the results here (temp file, then renamed)")
    p.add_argument("--no-profile", action="store_true", help="skip the profile of our Si64 call")
    p.add_argument("--setup", nargs="+", metavar="ENV", help="make these environments (or 'all') and exit")
    p.add_argument("--smoke", action="store_true", help="Si8, ours only, one round, no profile")
    p.add_argument("--markdown", metavar="JSON", help="print the docs' table of a result file and exit")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(args.markdown))
        return 0
    if args.setup:
        setup(envs_folder(args.envs), args.setup)
        return 0
    if args.smoke:
        args.models, args.structures, args.rounds, args.no_profile = args.models or ["ours"], ["si8"], 1, True
    args.models = args.models or list(MODELS)
    result = run(args)
    if not args.no_profile:
        result["profile_si64"] = our_profile(args.threads)
    result["ratios_ours_over_peer"] = ratios(result)
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
