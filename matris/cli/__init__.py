"""The ``matris`` command: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from . import predict as _predict

SUBCOMMANDS = {"predict": _predict}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="matris",
        description="MatRIS: a universal machine-learned interatomic potential. "
        "Run 'matris <command> --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"matris {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, module in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..errors import CheckpointError, MatRISInputError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.handler(args) or 0)
    except (MatRISInputError, CheckpointError, FileNotFoundError) as exc:
        print(f"matris {args.command}: error: {exc}", file=sys.stderr)
        return 2
