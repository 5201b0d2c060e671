"""Energy+forces+stress time per call of the published-size MatRIS, with graph construction beside it.

    python -m benchmarks.speed                  # Si 8/64/216/512 atoms and 1,000-atom bcc Fe
    python -m benchmarks.speed --json out.json  # also write the numbers
    python -m benchmarks.speed --sizes 8 64 --no-fe --repeat 5

The model is the 10-block, width-128 architecture of MatRIS-10M (r_c 6 Å, r_3 4.5 Å) with
random weights (speed does not depend on their values). Times are medians over --repeat
calls after one warm-up call, measured with time.perf_counter on this process's threads.
"graph" is structure → GraphBatch (neighbour list + line graph); "E+F+S" is one model
call on a prebuilt graph; "total" is both, what a calculator call costs. "ckpt" is the
memory-saving level the model chose (0: none; 1, 2: activations recomputed in the
backward pass, see matris.memory.inference_level); "peak RSS" is this process's peak so far.
Sizes run in increasing order, so a row's peak RSS is that row's peak. The structures and
timing helpers are matris.bench's; ``matris bench`` measures a loaded model (and other
potentials) through their ASE calculators, with MD speed, JSON/CSV and a plot.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import numpy as np
import torch

from benchmarks.common import peak_rss_gb, write_json
from matris import GraphBatch, MatRIS, MatRISConfig, memory
from matris.bench.measure import median_time
from matris.bench.structures import standard_structure
from matris.structures import to_system


def structures(si_sizes, with_fe):
    """(name, Atoms) of the rattled diamond Si cells (matris.bench's standard ladder) and a 1,000-atom Fe cell."""
    from ase.build import bulk

    out = [(f"Si diamond {n}", standard_structure("si", n).atoms) for n in si_sizes]
    if with_fe:
        rng = np.random.default_rng(0)
        a = bulk("Fe", "bcc", a=2.87, cubic=True).repeat(8)  # 1,024 atoms
        a = a[:1000]  # exactly 1,000 atoms (a vacancy cluster; still a periodic cell)
        a.positions += rng.normal(scale=0.02, size=a.positions.shape)
        out.append(("Fe bcc 1000", a))
    return out


def timeit(fn, repeat, long_call=20.0, device=None):
    """Median of ``repeat`` calls after a warm-up; a first call longer than ``long_call``
    seconds is reported alone (warm-up effects are negligible there)."""
    return median_time(fn, repeat, device=device, long_call=long_call).seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="*", default=[8, 64, 216, 512], help="Si sizes (multiples of 8 atoms)")
    p.add_argument("--no-fe", action="store_true", help="skip the 1,000-atom Fe cell")
    p.add_argument("--repeat", type=int, default=3, help="timed calls per size (median reported)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, help="write results to this JSON file")
    args = p.parse_args(argv)

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = MatRIS(MatRISConfig(num_layers=10, three_body_cutoff=4.5, reference_energy="mptrj"))
    model = model.to(device=args.device, dtype=dtype).eval()

    rows = []
    print(f"MatRIS 10-block width-128 ({model.num_parameters():,} parameters), {args.dtype}, {args.device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    header = f"{'structure':16s} {'atoms':>6s} {'edges':>8s} {'angles':>9s} {'graph (ms)':>11s} " \
             f"{'E+F+S (ms)':>11s} {'total (ms)':>11s} {'graph share':>11s} {'µs/atom':>8s} {'ckpt':>4s} " \
             f"{'peak RSS':>9s}"
    print(header)
    print("-" * len(header))
    for name, atoms in structures(args.sizes, not args.no_fe):
        system = to_system(atoms)

        def build():
            return GraphBatch.from_systems([system], model.cutoff, model.three_body_cutoff, dtype=dtype,
                                           device=args.device)

        graph = build()

        def call():
            return model(graph)

        t_graph = timeit(build, args.repeat, device=args.device)
        t_model = timeit(call, args.repeat, device=args.device)
        total = t_graph + t_model
        row = dict(structure=name, atoms=len(atoms), directed_edges=2 * graph.num_bonds, angles=graph.num_angles,
                   graph_ms=1e3 * t_graph, efs_ms=1e3 * t_model, total_ms=1e3 * total,
                   graph_share_of_efs=t_graph / t_model, us_per_atom=1e6 * total / len(atoms),
                   checkpoint_level=memory.inference_level(model, graph), peak_rss_gb=peak_rss_gb())
        rows.append(row)
        print(f"{name:16s} {row['atoms']:6d} {row['directed_edges']:8d} {row['angles']:9d} {row['graph_ms']:11.1f} "
              f"{row['efs_ms']:11.1f} {row['total_ms']:11.1f} {100 * row['graph_share_of_efs']:10.3f}% "
              f"{row['us_per_atom']:8.0f} {row['checkpoint_level']:4d} {row['peak_rss_gb']:7.1f}GB", flush=True)
    if args.json:
        meta = dict(torch=torch.__version__, threads=torch.get_num_threads(), dtype=args.dtype, device=args.device,
                    python=sys.version.split()[0], machine=platform.machine(), cpus=os.cpu_count(),
                    parameters=model.num_parameters())
        write_json(args.json, {"meta": meta, "rows": rows})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
