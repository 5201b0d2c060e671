"""Energies alone (no forces, no stress): level 0's forward against the streamed forward, by size.

    python -m benchmarks.energy_only_levels --json benchmarks/results/energy_only_levels_cpu.json

A call without a backward pass keeps nothing for one, so its memory level only decides how the
forward runs: whole blocks at once (level 0) or the angles streamed by chunks (level 2,
:mod:`matris.model.stream`). Which is faster depends on the size; ``matris.memory.inference_level``
picks level 0 below ``matris.memory.STREAMED_FORWARD_ANGLES`` angles and the streamed forward above,
and this script is the measurement behind that threshold.

Model: ``MatRISConfig.published_10m()`` with random weights (speed does not depend on them), float32,
through ``model.predict(atoms, compute_forces=False, compute_stress=False)`` with
``model.options.memory_level`` 0, 2 and None (the automatic choice). Structures: the rattled diamond
Si cells of ``matris bench``. Rounds interleave the levels (this machine is shared: the best of the
rounds is reported, with every sample), after one warm-up call of each.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import provenance, write_json

LEVELS = {"level 0": 0, "streamed": 2, "auto": None}


def run(sizes, rounds: int) -> dict:
    import torch

    from matris import MatRIS, MatRISConfig, memory
    from matris.bench import standard_structure

    torch.manual_seed(0)
    model = MatRIS(MatRISConfig.published_10m()).eval()
    rows = []
    for n in sizes:
        atoms = standard_structure("si", n).atoms
        samples = {name: [] for name in LEVELS}
        chosen = None
        for r in range(rounds + 1):
            for name, level in LEVELS.items():
                model.options.memory_level = level
                start = time.perf_counter()
                energy = model.predict(atoms, compute_forces=False, compute_stress=False, warn_inputs=False).energy
                if r:  # round 0 warms up
                    samples[name].append(time.perf_counter() - start)
        model.options.memory_level = None
        from matris.graph import GraphBatch
        from matris.structures import to_system

        graph = GraphBatch.from_systems([to_system(atoms)], model.cutoff, model.three_body_cutoff)
        with torch.no_grad():
            chosen = memory.inference_level(model, graph, backward=False)
        best = {name: min(v) for name, v in samples.items()}
        rows.append({"atoms": n, "angles": graph.num_angles, "energy_eV": float(energy),
                     "seconds": best, "samples": samples, "auto_level": chosen,
                     "streamed_over_level0": best["streamed"] / best["level 0"]})
        print(f"Si{n:<5d} {graph.num_angles:8d} angles  level 0 {best['level 0']:8.3f} s  streamed "
              f"{best['streamed']:8.3f} s  ratio {best['streamed'] / best['level 0']:.2f}  auto -> level {chosen} "
              f"({best['auto']:.3f} s)", flush=True)
    return {"threshold_angles": memory.STREAMED_FORWARD_ANGLES, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128, 216])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    result = run(args.sizes, args.rounds)
    if args.json:
        meta = provenance(argv, model_name="MatRIS published 10M architecture (MatRISConfig.published_10m()), "
                                           "random weights")
        write_json(args.json, {**result, "dtype": "float32", "device": "cpu", "meta": meta})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
