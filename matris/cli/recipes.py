"""``matris recipes``: the training recipes shipped with the package, by name."""

from __future__ import annotations

import argparse

HELP = "list the bundled training recipes (train/finetune --config NAME)"
DESCRIPTION = """\
List the training recipes that ship with matris: YAML configs that 'matris train' and
'matris finetune' take by name. --path prints where a recipe's file is (copy it to change it).

  matris recipes
  matris train --config tiny
  matris recipes --path matris-10m-oam        # then: cp $(matris recipes --path matris-10m-oam) my.yaml
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path", metavar="NAME", default=None, help="print the file of recipe NAME and exit")


def run(args: argparse.Namespace) -> int:
    from .. import recipes

    if args.path is not None:
        print(recipes.find(args.path).resolve())
        return 0
    listing = recipes.available()
    width = max((len(name) for name, _ in listing), default=0)
    for name, description in listing:
        print(f"{name:{width}s}  {description}")
    print(f"\nfiles in {recipes.folder().resolve()}; use one with 'matris train --config NAME' "
          "(any key can be overridden: --section.key VALUE)")
    return 0
