"""The ``matris`` command: one entry point, one module per subcommand.

Start-up is light on purpose. The subcommand modules import only the standard library at
module level (their ``HELP``, ``DESCRIPTION`` and ``add_arguments``); torch, ase and pymatgen
are imported inside their ``run`` functions, after the input files and the model argument are
checked (:mod:`.common`). So ``matris --help``, ``matris CMD --help``, ``--version``, argument
errors and a missing file answer in a fraction of a second (``tests/test_cli_startup.py``
checks that torch stays unimported).
"""

from __future__ import annotations

import argparse
import sys

from . import bench as _bench
from . import data as _data
from . import discovery as _discovery
from . import eos as _eos
from . import lammps as _lammps
from . import md as _md
from . import models as _models
from . import phonons as _phonons
from . import predict as _predict
from . import recipes as _recipes
from . import relax as _relax
from . import train as _train

# name → (help, description, add_arguments, run, takes --section.key overrides)
SUBCOMMANDS = {
    "predict": (_predict.HELP, _predict.DESCRIPTION, _predict.add_arguments, _predict.run, False),
    "train": (_train.HELP, _train.DESCRIPTION, _train.add_arguments, _train.run, True),
    "data": (_data.HELP, _data.DESCRIPTION, _data.add_arguments, _data.run, True),
    "finetune": (_train.FT_HELP, _train.FT_DESCRIPTION, _train.add_finetune_arguments, _train.run_finetune, True),
    "recipes": (_recipes.HELP, _recipes.DESCRIPTION, _recipes.add_arguments, _recipes.run, False),
    "relax": (_relax.HELP, _relax.DESCRIPTION, _relax.add_arguments, _relax.run, False),
    "md": (_md.HELP, _md.DESCRIPTION, _md.add_arguments, _md.run, False),
    "eos": (_eos.HELP, _eos.DESCRIPTION, _eos.add_arguments, _eos.run, False),
    "phonons": (_phonons.HELP, _phonons.DESCRIPTION, _phonons.add_arguments, _phonons.run, False),
    "discovery": (_discovery.HELP, _discovery.DESCRIPTION, _discovery.add_arguments, _discovery.run, False),
    "bench": (_bench.HELP, _bench.DESCRIPTION, _bench.add_arguments, _bench.run, False),
    "models": (_models.HELP, _models.DESCRIPTION, _models.add_arguments, _models.run, False),
    "lammps": (_lammps.HELP, _lammps.DESCRIPTION, _lammps.add_arguments, _lammps.run, False),
    "export": (_lammps.EXPORT_HELP, _lammps.EXPORT_DESCRIPTION, _lammps.add_export_arguments, _lammps.run_export,
               False),
    "download": (_models.DOWNLOAD_HELP, _models.DOWNLOAD_DESCRIPTION, _models.add_download_arguments,
                 _models.run_download, False),
}

DEFAULTS_NOTE = ("Defaults everywhere: --device auto (a CUDA GPU when there is one, else the CPU), --dtype float32, "
                 "and the bundled demo model when no --model is named.")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose epilog may be a function, called only when the help is shown:
    the list of training config keys needs the config classes, which ``matris train CONFIG``
    imports anyway but ``matris --help`` should not."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def _version() -> str:
    from .. import __version__

    try:
        from .._version import DISTRIBUTION
    except ImportError:  # pragma: no cover - a tree without _version.py
        DISTRIBUTION = "matris-mlip"
    return f"matris {__version__} (distribution {DISTRIBUTION})"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="matris",
        description="MatRIS: a universal machine-learned interatomic potential. "
        "Run 'matris <command> --help' for the options of a command.",
        epilog=DEFAULTS_NOTE,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (help_text, description, add_arguments, run, overrides) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=description,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        add_arguments(p)
        p.set_defaults(handler=run, takes_overrides=overrides, command_parser=p)
    return parser


def _input_warnings_as_lines(command: str, shown):
    """A ``warnings.showwarning`` that prints :class:`MatRISInputWarning` (an implausible
    structure) as one stderr line, like the errors, instead of Python's file:line form, and
    passes other warnings to ``shown``."""
    from ..errors import MatRISInputWarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, MatRISInputWarning):
            print(f"matris {command}: warning: {' '.join(str(message).split())}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    return show


def unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """"unrecognized arguments: --modle (did you mean --model?)" for ``parser``'s options."""
    import difflib

    options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    flags = [word.split("=", 1)[0] for word in extra if word.startswith("-")]
    hints = []
    for flag in flags:
        match = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
        if match:
            hints.append(f"did you mean {match[0]}" + ("?" if len(flags) == 1 else f" for {flag}?"))
    return f"unrecognized arguments: {' '.join(extra)}" + (f"; {' '.join(hints)}" if hints else "")


def main(argv: list[str] | None = None) -> int:
    from ..threads import set_wait_policy

    set_wait_policy()  # before torch loads its OpenMP runtime: idle threads sleep, not spin (matris.threads)
    from .._conflict import check as check_conflict
    from ..bundled import notices_to_stderr
    from ..errors import CheckpointError, MatRISInputError

    try:
        # the official package's files may have replaced our matris/__init__.py (and its check)
        check_conflict()
    except ImportError as exc:
        print(f"matris: error: {exc}", file=sys.stderr)
        return 2
    notices_to_stderr()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if extra and not args.takes_overrides:
        # the subcommand's usage, and the closest of its options to a misspelt one
        args.command_parser.error(unrecognized(args.command_parser, extra))
    import warnings

    shown = warnings.showwarning
    warnings.showwarning = _input_warnings_as_lines(args.command, shown)
    from ..rerun import command_line

    try:
        with command_line():  # messages name the flags (--overwrite), not the Python keywords
            if args.takes_overrides:
                return int(args.handler(args, extra) or 0)
            return int(args.handler(args) or 0)
    except (MatRISInputError, CheckpointError, FileNotFoundError) as exc:
        # one line, no traceback: the message names the problem and the fix
        message = " ".join(str(exc).split("\n")).strip() or type(exc).__name__
        print(f"matris {args.command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = shown
