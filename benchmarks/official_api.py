"""The official MatRIS 1.0.0 package against ours, through each official public entry point.

    python -m benchmarks.official_api --envs DIR --json benchmarks/results/official_api_cpu.json
    python -m benchmarks.official_api --smoke          # small model, Si8, one round (~1-2 min); $MATRIS_PEERS_ENVS
    python -m benchmarks.official_api --official-python OFFICIAL/bin/python --ours-python OURS/bin/python \\
        --rounds 3 --relax-steps 5 --md-steps 5

Each side runs the same worker (``benchmarks/official_api_worker.py``, written only against the
official public API) in its own environment and process, through the worker protocol of
``benchmarks/common.py`` (the one ``benchmarks/peers.py`` runs its models with): the official
package from ``--official-python`` (default: the ``official`` environment of ``benchmarks/peers.py``,
``DIR/official/bin/python`` under ``--envs DIR`` or ``$MATRIS_PEERS_ENVS``: PyPI ``matris==1.0.0``)
and ours from ``--ours-python`` (default ``DIR/ours/bin/python``: the wheel of this checkout installed
in a fresh venv, ``pip install "matris_mlip-*.whl[sim,discovery]"``; rebuild it with
``--force-reinstall --no-deps`` after a change, the version number does not move;
``python -m benchmarks.peers --setup official ours`` makes both). Both load the same
checkpoint file, made by the official worker with the official constructor (random weights, fixed
seed, a 94-element reference energy as the official ``MatRIS.from_dict`` rebuilds it) and saved the
official way, ``torch.save({"config": model.config, "state_dict": model.state_dict()}, path)``.

Cases (each in ``mode="torch"`` and ``mode="fast"`` unless said otherwise; float32, device "cpu"):

1. ``calculator``: ``MatRISCalculator(path, task="efsm", device="cpu", mode, activation_checkpoint=False)``,
   energy, forces, stress and magnetic moments of a rattled diamond Si64 (and Si216 with ``--si216``);
2. ``relax``: ``StructOptimizer(path, task="efs", optimizer="FIRE", device="cpu", mode).relax(atoms,
   steps=N, fmax=F, relax_cell=True, verbose=False)`` of a rattled, strained Si64. ``F`` is
   ``--relax-fmax``, default 1e-5 eV/Å: the random weights give forces of about 1e-3 eV/Å, so the
   usual 0.05 would stop before the first step; with 1e-5 every one of the N steps is taken;
3. ``md``: ``MolecularDynamics(atoms, model=path, ensemble="nvt", temperature=300, timestep=1,
   task="efs", device="cpu", mode)`` (default thermostat: NVT Berendsen), fixed initial momenta
   (300 K Maxwell-Boltzmann drawn here with a fixed seed, ``starting_temperature=None``), N steps;
   each round starts afresh through ``md.set_atoms``;
4. ``torchsim``: ``MatRISTorchSimModel(path, target="efs", device="cpu", mode)`` on a batch of Si64,
   rocksalt MgO (8 atoms) and cubic SrTiO3 (5 atoms), all rattled;
5. ``model``: ``MatRIS.load(model_name=path, device="cpu")``, ``model.graph_converter(structure)``,
   ``model([graph, graph], task="efsm", mode="torch")`` on a rattled Si32 (pymatgen Structure).

Every object is built once per side and mode, run once untimed (warm-up), then timed in
``--rounds`` interleaved rounds (each round runs every case on both sides, the side that goes first
alternating). Differences are official minus ours over all rounds (both sides get identical inputs
each round): max |ΔE| per atom (eV/atom), max |ΔF| (eV/Å), max |Δσ| (GPa), max |Δm| (μB); relax:
final energy, positions, cell and the number of frames; MD: final positions, the per-step potential
energy. Speed: ``official / ours`` of the median seconds (calculator, torchsim, model: one call; relax:
the whole ``relax``; MD: seconds per step), threads fixed (``--threads``, default 2).

The JSON records the commit of this checkout, the command, the CPU (``lscpu`` model name and the
widest vector ISA), this machine's float32 GEMM rate, the threads, both sides' versions and where
``matris`` came from, the checkpoint's SHA-256, peak RSS, and all numbers. Our side not being ready
(the wheel fails to install or import, or a case raises) is recorded as that case's error text; the
official side still runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import HERE, ROOT, Worker, env_python, envs_folder, summarize, write_json

# The published MatRIS-10M architecture, in the official constructor's keywords.
from benchmarks.peer_models.official import CONFIG as CONFIG_10M

WORKER = HERE / "official_api_worker.py"
GPA = 160.21766208  # eV/Å^3 -> GPa

CONFIG_SMALL = {**CONFIG_10M, "num_layers": 2, "node_feat_dim": 32, "edge_feat_dim": 32,
                "three_body_feat_dim": 32, "mlp_hidden_dims": [32, 32]}
CASES = ("calculator", "relax", "md", "torchsim", "model")


# ----------------------------------------------------------------------------- structures
def _rattled(atoms, seed: int, scale: float = 0.05):
    import numpy as np

    rng = np.random.default_rng(seed)
    atoms = atoms.copy()
    atoms.positions += rng.normal(scale=scale, size=atoms.positions.shape)
    return atoms


def _request(atoms, momenta=None) -> dict:
    out = {"numbers": [int(z) for z in atoms.numbers], "positions": atoms.positions.tolist(),
           "cell": atoms.cell.array.tolist(), "pbc": [bool(p) for p in atoms.pbc]}
    if momenta is not None:
        out["momenta"] = momenta.tolist()
    return out


def si(n: int):
    from ase.build import bulk

    reps = {8: (1, 1, 1), 16: (2, 1, 1), 32: (2, 2, 1), 64: (2, 2, 2), 216: (3, 3, 3)}[n]
    return bulk("Si", "diamond", a=5.43, cubic=True).repeat(reps)


def structures(smoke: bool, si216: bool) -> dict:
    """Every case's inputs (built here once, so both sides get the same floats)."""
    import numpy as np
    from ase import Atoms, units
    from ase.build import bulk

    n = 8 if smoke else 64
    base = _rattled(si(n), seed=1)
    calc = {f"si{n}": _request(base)}
    if si216 and not smoke:
        calc["si216"] = _request(_rattled(si(216), seed=2))
    strained = _rattled(si(n), seed=3)
    strain = np.array([[1.03, 0.01, 0.0], [0.0, 0.98, 0.0], [0.0, 0.0, 1.01]])
    strained.set_cell(strained.cell.array @ strain, scale_atoms=True)
    md_atoms = _rattled(si(n), seed=4, scale=0.02)
    rng = np.random.default_rng(5)
    masses = md_atoms.get_masses()[:, None]
    momenta = rng.normal(size=(len(md_atoms), 3)) * np.sqrt(masses * units.kB * 300)
    momenta -= momenta.sum(axis=0) / len(md_atoms)  # no centre-of-mass motion
    mgo = _rattled(bulk("MgO", "rocksalt", a=4.21, cubic=True), seed=6, scale=0.03)
    sto = _rattled(Atoms("SrTiO3", scaled_positions=[(0, 0, 0), (0.5, 0.5, 0.5), (0.5, 0.5, 0), (0.5, 0, 0.5),
                                                       (0, 0.5, 0.5)], cell=[3.905] * 3, pbc=True), seed=7, scale=0.03)
    batch = [_request(base), _request(mgo)] + ([] if smoke else [_request(sto)])
    model_atoms = _rattled(si(8 if smoke else 32), seed=8)
    return {"calculator": calc, "relax": _request(strained), "md": _request(md_atoms, momenta),
            "torchsim": batch, "model": _request(model_atoms)}


# ----------------------------------------------------------------------------- workers
def start_side(name: str, python: str, threads: int, log, max_rss_gb: float) -> Worker:
    """One environment's worker (persistent, isolated from this checkout), with a resident-memory guard."""
    return Worker([python, "-I", WORKER, "--threads", threads], name=name, stderr=log, max_rss_gb=max_rss_gb)


def error_text(exc: Exception) -> str:
    """What a result records of a failure: the worker's traceback where it sent one (its last line
    is the error), else the message."""
    return getattr(exc, "traceback", None) or str(exc)


def side_python(given: str | None, envs: str | None, env: str, option: str) -> str:
    """``given`` (``--official-python`` / ``--ours-python``), else ``DIR/<env>/bin/python`` of the
    peers' environments (``--envs DIR`` or ``$MATRIS_PEERS_ENVS``)."""
    if given:
        return given
    try:
        folder = envs_folder(envs)
    except SystemExit:
        raise SystemExit(f"which Python runs the {env} side? pass {option} PYTHON, or --envs DIR or set "
                         f"$MATRIS_PEERS_ENVS (DIR/{env}/bin/python; python -m benchmarks.peers --setup {env} "
                         "makes it)") from None
    return str(env_python(folder, env))


# ----------------------------------------------------------------------------- machine facts
# ----------------------------------------------------------------------------- comparisons
def _maxabs(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        return float("nan")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def compare(case: str, o: dict, u: dict) -> dict:
    """Official ``o`` against ours ``u`` for one run of ``case``."""
    import numpy as np

    if case == "calculator":
        n = o["natoms"]
        return {"dE_per_atom": abs(o["energy"] - u["energy"]) / n, "dF": _maxabs(o["forces"], u["forces"]),
                "dS_gpa": _maxabs(o["stress"], u["stress"]) * GPA, "dM": _maxabs(o["magmoms"], u["magmoms"])}
    if case == "relax":
        n = len(o["positions"])
        same = o["frames"] == u["frames"]
        return {"dE_final_per_atom": abs(o["final_energy"] - u["final_energy"]) / n,
                "dE_traj_per_atom": _maxabs(o["energies"], u["energies"]) / n if same else float("nan"),
                "dpos": _maxabs(o["positions"], u["positions"]), "dcell": _maxabs(o["cell"], u["cell"]),
                "frames_official": o["frames"], "frames_ours": u["frames"]}
    if case == "md":
        n = len(o["positions"])
        return {"dpos_final": _maxabs(o["positions"], u["positions"]),
                "dmomenta_final": _maxabs(o["momenta"], u["momenta"]),
                "dEpot_per_atom": _maxabs(o["potential_energies"], u["potential_energies"]) / n,
                "dEkin_per_atom": _maxabs(o["kinetic_energies"], u["kinetic_energies"]) / n,
                "steps_official": o["nsteps"], "steps_ours": u["nsteps"]}
    if case == "torchsim":
        counts = np.asarray(o["natoms"], dtype=float)
        de = np.abs(np.asarray(o["energy"]) - np.asarray(u["energy"])) / counts if len(o["energy"]) == len(
            u["energy"]) else [float("nan")]
        return {"dE_per_atom": float(np.max(de)), "dF": _maxabs(o["forces"], u["forces"]),
                "dS_gpa": _maxabs(o["stress"], u["stress"]) * GPA, "keys_equal": o["keys"] == u["keys"]}
    if case == "model":
        # e: eV/atom (intensive model); s: GPa (the model's own unit)
        return {"dE_per_atom": _maxabs(o["e"], u["e"]), "dF": _maxabs(o["f"], u["f"]),
                "dS_gpa": _maxabs(o["s"], u["s"]), "dM": _maxabs(o["m"], u["m"]),
                "keys_official": o["keys"], "keys_ours": u["keys"]}
    raise ValueError(case)


def merge_max(acc: dict | None, new: dict) -> dict:
    if acc is None:
        return dict(new)
    out = dict(acc)
    for k, v in new.items():
        if isinstance(v, float) and isinstance(out.get(k), float):
            out[k] = max(out[k], v) if v == v and out[k] == out[k] else float("nan")
        elif out.get(k) != v:
            out[k] = f"{out.get(k)} / {v}"
    return out


def portable_hello(hello: dict, portable) -> dict:
    """A worker's hello as the result records it: where ``matris`` came from relative to its
    environment (``lib/python3.12/site-packages/matris/__init__.py``), the interpreter as
    ``VENV/bin/python``; no machine's directories."""
    out = dict(hello)
    file, exe = Path(hello.get("matris_file") or ""), hello.get("executable")
    if exe and file.is_absolute():
        prefix = Path(exe).parents[1]
        try:
            out["matris_file"] = str(file.relative_to(prefix))
        except ValueError:
            out["matris_file"] = portable(str(file))
    if exe:
        out["executable"] = portable(exe)
    return out


def timing_key(case: str) -> str:
    return "seconds_per_step" if case == "md" else "seconds"


# ----------------------------------------------------------------------------- the run
def run(args) -> dict:
    from benchmarks.common import cpu_description, gemm_rate, lscpu_model, portable, provenance
    from matris.pretrained.cache import sha256_file

    log = open(args.log, "a") if args.log else subprocess.DEVNULL
    t_start = time.perf_counter()
    inputs = structures(args.smoke, args.si216)
    ckdir = Path(args.checkpoint_dir)
    ckdir.mkdir(parents=True, exist_ok=True)
    config = CONFIG_SMALL if args.smoke else CONFIG_10M
    ckpt = ckdir / ("matris_small_random_seed%d.pth.tar" % args.seed if args.smoke
                    else "matris_10m_random_seed%d.pth.tar" % args.seed)

    meta = provenance(model_name="random weights at the " + ("small (2 x 32)" if args.smoke else "published 10M")
                      + f" config, seed {args.seed}")
    meta.update(lscpu_model=lscpu_model(), cpu=cpu_description(), threads=args.threads, rounds=args.rounds,
                relax_steps=args.relax_steps, relax_fmax=args.relax_fmax, md_steps=args.md_steps, modes=args.modes,
                cases=args.cases,
                smoke=args.smoke, gemm=gemm_rate(args.threads), config=config, dtype="float32", device="cpu",
                max_rss_gb=args.max_rss_gb, loadavg_start=os.getloadavg())
    result: dict = {"meta": meta, "sides": {}, "cases": {}, "errors": {}}

    print(f"official: {args.official_python}\nours:     {args.ours_python}", flush=True)
    official = start_side("official", args.official_python, args.threads, log, args.max_rss_gb)
    result["sides"]["official"] = portable_hello(official.hello, portable)
    if not str(official.hello["matris_dist"]).startswith("matris ") or str(ROOT) in official.hello["matris_file"]:
        print(f"warning: the official side imported {official.hello['matris_dist']} from "
              f"{official.hello['matris_file']}", flush=True)
    made = official.request("make_checkpoint", config=config, seed=args.seed, path=str(ckpt), reference_elements=94)
    meta.update(checkpoint=ckpt.name, checkpoint_sha256=sha256_file(ckpt), checkpoint_params=made["params"])
    print(f"checkpoint {ckpt} ({made['params']:,} parameters, official constructor, seed {args.seed})", flush=True)
    try:
        ours = start_side("ours", args.ours_python, args.threads, log, args.max_rss_gb)
        result["sides"]["ours"] = portable_hello(ours.hello, portable)
    except Exception as exc:  # noqa: BLE001 - our side may not be ready
        ours = None
        result["errors"]["ours:start"] = error_text(exc)
        print(f"OUR SIDE FAILED TO START:\n{error_text(exc)}", flush=True)
    for name, side in (("official", official), ("ours", ours)):
        if side:
            h = side.hello
            print(f"{name}: {h['matris_dist']} from {h['matris_file']} (torch {h['torch']}, torch-sim "
                  f"{h['torch_sim']}, python {h['python']}, {h['threads']} threads)", flush=True)

    # the work items: (case, mode, label, request)
    items = []
    for case in args.cases:
        modes = ["torch"] if case == "model" else args.modes
        for mode in modes:
            if case == "calculator":
                for key, st in inputs["calculator"].items():
                    items.append((case, mode, f"calculator/{mode}/{key}", {"structure": st}))
            elif case == "relax":
                items.append((case, mode, f"relax/{mode}", {"structure": inputs["relax"], "steps": args.relax_steps,
                                                         "fmax": args.relax_fmax}))
            elif case == "md":
                items.append((case, mode, f"md/{mode}", {"structure": inputs["md"], "steps": args.md_steps}))
            elif case == "torchsim":
                items.append((case, mode, f"torchsim/{mode}", {"structures": inputs["torchsim"]}))
            else:
                items.append((case, mode, f"model/{mode}", {"structure": inputs["model"]}))

    sides = {"official": official, "ours": ours}
    state: dict = {}
    for case, mode, label, req in items:
        entry = result["cases"].setdefault(label, {"case": case, "mode": mode})
        for name, side in sides.items():
            if side is None:
                entry.setdefault("errors", {})[name] = "the worker did not start"
                continue
            if (case, mode) in state.setdefault(name, set()):
                continue  # one object per case and mode (the calculator serves every structure)
            try:
                s = side.request("setup", case=case, mode=mode, checkpoint=str(ckpt), **req)
                state[name].add((case, mode))
                entry.setdefault("setup", {})[name] = {k: s[k] for k in ("load_seconds", "warmup_seconds", "params")}
                print(f"  setup {label:28s} {name:8s} load {s['load_seconds']:.2f} s, warm-up "
                      f"{s['warmup_seconds']:.2f} s, {s['params']:,} params", flush=True)
            except Exception as exc:  # noqa: BLE001
                entry.setdefault("errors", {})[name] = error_text(exc)
                print(f"  {label}: {name} FAILED in setup:\n{error_text(exc)}", flush=True)

    for r in range(args.rounds):
        order = ["official", "ours"] if r % 2 == 0 else ["ours", "official"]
        print(f"round {r + 1}/{args.rounds} ({' then '.join(order)})", flush=True)
        for case, mode, label, req in items:
            entry = result["cases"][label]
            outs = {}
            for name in order:
                side = sides[name]
                if side is None or name in entry.get("errors", {}):
                    continue
                try:
                    out = side.request("run", case=case, mode=mode, **req)
                except Exception as exc:  # noqa: BLE001
                    entry.setdefault("errors", {})[name] = error_text(exc)
                    print(f"  {label}: {name} FAILED:\n{error_text(exc)}", flush=True)
                    continue
                outs[name] = out
                entry.setdefault("seconds", {}).setdefault(name, []).append(out[timing_key(case)])
                entry.setdefault("peak_rss_gb", {})[name] = out["peak_rss_gb"]
            if len(outs) == 2:
                entry["diff"] = merge_max(entry.get("diff"), compare(case, outs["official"], outs["ours"]))
            if r == 0:
                entry["first_round"] = {name: _brief(case, out) for name, out in outs.items()}
            print("  " + _line(label, entry), flush=True)
    for name, side in sides.items():
        if side is not None:
            side.close()
            if side.stopped:
                result["errors"][f"{name}:memory"] = side.stopped
    for entry in result["cases"].values():
        secs = entry.get("seconds", {})
        entry["timing"] = {name: summarize(v) for name, v in secs.items()}
        if "official" in secs and "ours" in secs:
            entry["speedup_official_over_ours"] = statistics.median(secs["official"]) / statistics.median(secs["ours"])
    meta["wall_seconds"] = time.perf_counter() - t_start
    meta["loadavg_end"] = os.getloadavg()  # 1, 5, 15 min: other work on the machine shows here
    return result


def _brief(case: str, out: dict) -> dict:
    """A few scalars of a run, to read in the JSON without the arrays."""
    keys = {"calculator": ("energy", "natoms"), "relax": ("final_energy", "frames", "final_type"),
            "md": ("nsteps",), "torchsim": ("energy", "natoms"), "model": ("e", "keys")}[case]
    b = {k: out[k] for k in keys if k in out}
    if case == "md":
        b["final_potential_energy"] = out["potential_energies"][-1] if out["potential_energies"] else None
    return b


def _fmt(x, spec=".1e") -> str:
    return "-" if x is None else (f"{x:{spec}}" if isinstance(x, float) else str(x))


def _line(label: str, entry: dict) -> str:
    secs = entry.get("seconds", {})
    d = entry.get("diff", {})
    parts = [f"{label:28s}"]
    for name in ("official", "ours"):
        parts.append(f"{name} {statistics.median(secs[name]):7.3f} s" if name in secs else f"{name}    -   ")
    if d:
        parts.append(" ".join(f"{k}={_fmt(v)}" for k, v in d.items() if isinstance(v, float)))
    if entry.get("errors"):
        parts.append("errors: " + ", ".join(entry["errors"]))
    return "  ".join(parts)


def table(result: dict) -> str:
    rows = ["| entry point | official s | ours s | official/ours | max ΔE eV/atom | max ΔF eV/Å | max Δσ GPa "
            "| max Δm μB | trajectory | errors |", "|" + "---|" * 10]
    for label, e in result["cases"].items():
        t = e.get("timing", {})
        d = e.get("diff", {})
        unit = " /step" if e["case"] == "md" else ""
        de = d.get("dE_per_atom", d.get("dE_final_per_atom", d.get("dEpot_per_atom")))
        if e["case"] == "relax":
            traj = (f"frames {d.get('frames_official')}/{d.get('frames_ours')}, Δpos {_fmt(d.get('dpos'))} Å, "
                    f"Δcell {_fmt(d.get('dcell'))} Å, ΔE(traj) {_fmt(d.get('dE_traj_per_atom'))}")
        elif e["case"] == "md":
            traj = (f"steps {d.get('steps_official')}/{d.get('steps_ours')}, Δpos {_fmt(d.get('dpos_final'))} Å, "
                    f"ΔEkin {_fmt(d.get('dEkin_per_atom'))} eV/atom")
        else:
            traj = ""
        errs = "; ".join(f"{k}: {v.strip().splitlines()[-1][:120]}" for k, v in e.get("errors", {}).items())
        rows.append(
            f"| {label} | {_fmt(t['official']['median'], '.3f') + unit if 'official' in t else '-'} "
            f"| {_fmt(t['ours']['median'], '.3f') + unit if 'ours' in t else '-'} "
            f"| {_fmt(e.get('speedup_official_over_ours'), '.2f')} | {_fmt(de)} | {_fmt(d.get('dF'))} "
            f"| {_fmt(d.get('dS_gpa'))} | {_fmt(d.get('dM'))} | {traj} | {errs} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--official-python", default=None, metavar="PYTHON",
                   help="the official matris==1.0.0 environment's interpreter (default: DIR/official/bin/python)")
    p.add_argument("--ours-python", default=None, metavar="PYTHON",
                   help="the environment of this checkout's wheel (default: DIR/ours/bin/python)")
    p.add_argument("--envs", default=None, metavar="DIR",
                   help="the peers' environments (benchmarks/peers.py), default $MATRIS_PEERS_ENVS")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--relax-steps", type=int, default=5)
    p.add_argument("--relax-fmax", type=float, default=1e-5,
                   help="eV/Å; random weights give forces of ~1e-3 eV/Å, so the usual 0.05 would stop at step 0")
    p.add_argument("--md-steps", type=int, default=5)
    p.add_argument("--modes", nargs="+", default=["torch", "fast"], choices=["torch", "fast"])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--si216", action="store_true", help="also the calculator on Si216 (official: ~20 GB resident)")
    p.add_argument("--seed", type=int, default=0, help="the official constructor's torch seed")
    p.add_argument("--checkpoint-dir", default=os.environ.get("MATRIS_OFFICIAL_API_CKPT") or
                   str(Path(tempfile.gettempdir()) / "matris_official_api"),
                   help="where the shared checkpoint is written (default $MATRIS_OFFICIAL_API_CKPT, else "
                        "matris_official_api in the temporary folder)")
    p.add_argument("--max-rss-gb", type=float, default=18.0, help="stop a worker past this resident memory")
    p.add_argument("--log", help="append both workers' stderr here (default: discarded)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--smoke", action="store_true", help="small model (2 blocks of 32), Si8, one round, 3 steps")
    args = p.parse_args(argv)
    args.official_python = side_python(args.official_python, args.envs, "official", "--official-python")
    args.ours_python = side_python(args.ours_python, args.envs, "ours", "--ours-python")
    if args.smoke:
        args.rounds, args.relax_steps, args.md_steps = 1, 3, 3
    result = run(args)
    print()
    print(table(result))
    if result["errors"]:
        print("\nerrors:")
        for k, v in result["errors"].items():
            print(f"--- {k}\n{v}")
    for label, e in result["cases"].items():
        for name, err in e.get("errors", {}).items():
            print(f"\n--- {label} ({name}):\n{err}")
    if args.json:
        write_json(args.json, result)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
