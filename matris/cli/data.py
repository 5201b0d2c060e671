"""``matris data build``: build the graph caches of a training config, in parallel and resumably."""

from __future__ import annotations

import argparse

from ..errors import counted

HELP = "build the graph cache of a training config's data (parallel, resumable)"
DESCRIPTION = """\
Build the graph cache of every data file a training config names (data.train/val/test or
the files of each dataset in data.datasets), as 'matris train' would at its start, but with
the workers you choose and without a model run. Each file becomes a cache entry of shards
(data.shard_size structures each) built by --workers processes; a build that is killed,
even with SIGKILL, resumes where it stopped when the command is run again and ends
byte-identical to an uninterrupted one. Training then memory-maps the shards.

  matris data build examples/configs/matris-10m-oam.yaml --workers 32
  matris data build cfg.yaml --data.cache_dir /scratch/graphs --data.shard_size 20000

The cutoffs are the model's (model.pairwise_cutoff and model.three_body_cutoff, or those
of finetune.from_checkpoint). Prints one line per file: structures, shards, built/reused,
structures/s.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="data_command", metavar="<action>")
    b = sub.add_parser("build", help="build the graph caches of a config's data files",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("config", help="training YAML config or recipe name (its model and data sections are used)")
    b.add_argument("--workers", type=int, default=None,
                   help="build processes (default: data.build_workers, else the CPUs available, at most 32)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")


def _cutoffs(config) -> tuple[float, float]:
    if config.finetune.from_checkpoint:
        from ..model import MatRIS

        model = MatRIS.load(config.finetune.from_checkpoint)
        return float(model.cutoff), float(model.three_body_cutoff)
    return float(config.model.pairwise_cutoff), float(config.model.three_body_cutoff)


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    if args.data_command != "build":
        print("usage: matris data build CONFIG [--workers N] [--section.key VALUE ...]")
        return 2
    from types import SimpleNamespace

    from .train import check_config, load_config

    check_config(args, extra or [])  # before any heavy import: a typo fails at once
    from ..train.datamodule import MatRISDataModule

    config = load_config(SimpleNamespace(config=args.config), extra or [])
    if args.workers is not None:
        if args.workers < 1:
            from ..errors import MatRISInputError

            raise MatRISInputError(f"--workers must be >= 1, got {args.workers}")
        config.data.build_workers = args.workers
    cutoff, three_body_cutoff = _cutoffs(config)
    data = MatRISDataModule(config.data, cutoff, three_body_cutoff)
    if not data.datasets:
        from ..errors import MatRISInputError

        raise MatRISInputError(f"{args.config}: no data files (set data.train, or data.datasets)")
    for ds in data.datasets:
        for f in data._files([*ds.train, *ds.val, *ds.test]):
            n_reports = len(data.build_reports)
            entry = data._load_file(f, ds, progress=not args.no_progress)
            rep = data.build_reports[n_reports]
            if rep.built:
                how = (f"built {counted(rep.built, 'shard')}" + (f", reused {rep.reused}" if rep.reused else "")
                       + f", {rep.records} records in {rep.seconds:.1f} s = {rep.rate:.0f} structures/s")
            else:
                how = "up to date"
            skipped = f", {entry.n_skipped} skipped" if entry.n_skipped else ""
            where = f"{counted(len(entry), 'structure')} in {counted(len(entry.datasets), 'shard')}"
            print(f"{ds.name}: {f}: {where}{skipped}; {how}; {entry.directory}")
    return 0
