"""``matris recipes``: the training recipes shipped with the package, by name."""

from __future__ import annotations

import argparse

HELP = "list the bundled training recipes (train/finetune --config NAME)"
DESCRIPTION = """\
List the training recipes that ship with matris: YAML configs that 'matris train' and
'matris finetune' take by name. --path prints where a recipe's file is. To change a recipe,
--copy it: the YAML file and the data files it names go into DIR with their relative paths
(relative paths in a config are resolved against the config file's folder), so the copy
trains as it is.

  matris recipes
  matris train --config tiny
  matris recipes --copy tiny my-run             # then edit my-run/tiny.yaml
  matris train --config my-run/tiny.yaml
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path", metavar="NAME", default=None, help="print the file of recipe NAME and exit")
    p.add_argument("--copy", nargs="+", metavar=("NAME", "DIR"), default=None,
                   help="copy recipe NAME and its data files into DIR (default: the current folder) and exit")
    p.add_argument("--overwrite", action="store_true", help="--copy: replace files that already exist in DIR")


def run(args: argparse.Namespace) -> int:
    from .. import recipes

    if args.path is not None:
        print(recipes.find(args.path).resolve())
        return 0
    if args.copy is not None:
        from ..errors import MatRISInputError

        if len(args.copy) > 2:
            raise MatRISInputError("--copy takes a recipe NAME and at most one folder DIR")
        name, folder = args.copy[0], (args.copy[1] if len(args.copy) > 1 else ".")
        copied = recipes.copy(name, folder, overwrite=args.overwrite)
        data = recipes.data_files(copied)
        print(f"copied {copied}" + (f" and its data ({', '.join(str(f) for f in data)})" if data else "")
              + f"; train with: matris train --config {copied}")
        return 0
    listing = recipes.available()
    width = max((len(name) for name, _ in listing), default=0)
    for name, description in listing:
        print(f"{name:{width}s}  {description}")
    print(f"\nfiles in {recipes.folder().resolve()}; use one with 'matris train --config NAME' "
          "(any key can be overridden: --section.key VALUE)")
    return 0
