"""``matris bench``: speed of MatRIS beside other potentials, as a table, JSON, CSV and a plot."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import DEVICE_HELP, check_inputs

HELP = "speed: E+F+S atoms/s, MD steps/s and ns/day, peak memory, vs CHGNet/SevenNet/MACE/MatterSim"
DESCRIPTION = """\
Measure MatRIS's energy + forces + stress throughput (atoms/s, with the graph construction
timed apart), its MD speed (velocity-Verlet steps/s and ns/day) and its peak memory on
standard structures (rattled diamond Si supercells of 8 to 8,192 atoms; --families si mgo adds
rock-salt MgO) and on your own files. CHGNet, SevenNet, MACE and MatterSim are measured in
the same run when installed (default: every installed one), each with its own ASE
calculator and default pretrained weights, and shown as ratios to MatRIS (time / MatRIS's
time: > 1 means MatRIS is faster). A model that is not installed, or whose weights cannot
be loaded (no network), is reported as skipped with the reason.

Times are medians of --repeat calls after a warm-up. Sizes run smallest first; a size that
runs out of memory, or whose first call takes longer than --max-seconds, is recorded as
such and the larger ones are skipped for that model. Peak memory is CUDA
max_memory_allocated on a GPU and the process's peak RSS on a CPU.

  matris bench --sizes 8 64 216 512 --compare chgnet --md-steps 20 --out bench/
  matris bench --device cuda --compare mace sevennet mattersim --json gpu.json --plot gpu.png
  matris bench --structures POSCAR big.cif --compare --model path/to/model.pth.tar
"""


# Copies of matris.bench's names (runners.COMPARISONS, structures.FAMILIES and DEFAULT_SIZES) for the
# options' help: importing matris.bench imports torch, which `matris bench --help` should not wait for.
# tests/test_cli_startup.py checks that they agree.
COMPARISONS = ("chgnet", "sevennet", "mace", "mattersim")
FAMILIES = ("mgo", "si")
DEFAULT_SIZES = (8, 64, 216, 512, 1000, 2048, 4096, 8192)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="MatRIS checkpoint path or model name (default: the bundled model)")
    p.add_argument("--compare", nargs="*", default=None, metavar="NAME[:VARIANT]",
                   help=f"other potentials: {', '.join(COMPARISONS)} (e.g. mace:small); default: every installed "
                   "one; give --compare alone for none")
    p.add_argument("--sizes", type=int, nargs="*", default=None, metavar="ATOMS",
                   help="standard structure sizes, multiples of 8 atoms (default: "
                   f"{' '.join(map(str, DEFAULT_SIZES))}; none when --structures is given)")
    p.add_argument("--families", nargs="+", default=["si"], choices=sorted(FAMILIES),
                   help="standard structures: si (diamond Si), mgo (rock-salt MgO) (default: si)")
    p.add_argument("--max-atoms", type=int, default=8192, help="largest standard size (default: 8192)")
    p.add_argument("--structures", nargs="+", default=[], metavar="FILE",
                   help="your structure files (any ASE- or pymatgen-readable format)")
    p.add_argument("--index", default="-1", help="ASE index of the frames to use from each file (default: the last)")
    p.add_argument("--repeat", type=int, default=3, help="timed calls per row, median reported (default: 3)")
    p.add_argument("--md-steps", type=int, default=20, help="velocity-Verlet steps per row, 0 for none (default: 20)")
    p.add_argument("--timestep", type=float, default=1.0, help="MD timestep, fs (default: 1)")
    p.add_argument("--max-seconds", type=float, default=600.0,
                   help="time budget of one row, s; a first call longer than this stops that model (default: 600)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="MatRIS precision: float32 (default) or float64 (MACE follows it; the others use their own)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch (default: PyTorch's)")
    p.add_argument("--json", dest="json_path", default=None, help="write all results to this JSON file")
    p.add_argument("--csv", dest="csv_path", default=None, help="write one line per row to this CSV file")
    p.add_argument("--plot", dest="plot_path", default=None, help="write the log-log plot to this PNG file")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write DIR/bench.json, bench.csv, bench.png and bench.log (table)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    check_inputs(args.structures, args.model)  # before any heavy import: a typo fails at once
    import torch

    from ..atomic import write_text
    from ..bench import BenchConfig, format_table, plot, run_bench, write_csv, write_json
    from ..bench.structures import DEFAULT_SIZES
    from ..errors import MatRISInputError

    if args.threads is not None:
        if args.threads < 1:
            raise MatRISInputError(f"--threads must be ≥ 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    sizes = args.sizes if args.sizes is not None else ([] if args.structures else DEFAULT_SIZES)
    config = BenchConfig(
        model=args.model, compare=args.compare, sizes=sizes, families=args.families, max_atoms=args.max_atoms,
        files=args.structures, index=args.index, repeat=args.repeat, md_steps=args.md_steps,
        timestep_fs=args.timestep, device=args.device, dtype=args.dtype, max_seconds=args.max_seconds,
        log=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)),
    )
    out = Path(args.out) if args.out else None
    paths = {
        "json": args.json_path or (out / "bench.json" if out else None),
        "csv": args.csv_path or (out / "bench.csv" if out else None),
        "plot": args.plot_path or (out / "bench.png" if out else None),
    }
    result = run_bench(config)
    table = format_table(result)
    print(table)
    if out:
        write_text(out / "bench.log", table + "\n")
    for kind, writer in (("json", write_json), ("csv", write_csv), ("plot", plot)):
        if paths[kind]:
            print(f"wrote {writer(result, paths[kind])}", file=sys.stderr)
    return 0
