"""``matris train`` and ``matris finetune``: Lightning training from a YAML config plus overrides."""

from __future__ import annotations

import argparse
import textwrap

HELP = "train a MatRIS model on your data (YAML config, any key overridable)"
DESCRIPTION = """\
Train MatRIS with Lightning. The run is described by a YAML config (sections model, data,
loss, optim, reference_energy, finetune, trainer); every key below can also be given on the
command line as --section.key VALUE (values are read as YAML: 1e-3, true, null, [128, 128]).

  matris train --config tiny                      # a bundled recipe by name ('matris recipes')
  matris train --config cfg.yaml --optim.lr 1e-3 --trainer.max_steps 5000 --trainer.devices 4

Outputs go to trainer.out_dir: checkpoints/last.ckpt (exact resume: rerun the same command
after an interruption), best_model.pth.tar and last_model.pth.tar (published checkpoint
format, load with MatRIS.load or MatRISCalculator), CSV and TensorBoard logs, parity.png.
A run already at trainer.max_steps is not trained again (it says so: raise max_steps to go
on); --overwrite removes the earlier run's outputs (only those) and starts afresh.
Several GPUs: --trainer.devices N (DDP); several nodes: see docs/training.md (torchrun or SLURM).
Needs the training extra: pip install 'matris-mlip[train]'.
"""

FT_HELP = "fine-tune a pretrained MatRIS checkpoint on your data"
FT_DESCRIPTION = """\
Fine-tune a pretrained model: a name from 'matris models' (e.g. matris-10m-oam, downloaded
and cached on first use; 'demo' is the bundled model), a checkpoint path or an https URL. The
model section of the config is ignored: the architecture is the checkpoint's. Typical
choices: --reference_energy.mode fit (new functional, e.g. r2SCAN: refit the per-element
reference energies on your data) or keep; --finetune.freeze_embeddings true;
--finetune.freeze_blocks K; --finetune.backbone_lr 1e-5 (readout uses optim.lr).

  matris finetune --from matris-10m-oam --config finetune --data.train mine.extxyz
  matris finetune --from model.pth.tar --config my-finetune.yaml
"""


def _key_help() -> str:
    from ..train.config import iter_keys

    lines = ["config keys (YAML section.key; command line --section.key VALUE):"]
    section = None
    for key, tname, default, help_text, choices in iter_keys():
        sec = key.split(".")[0]
        if sec != section:
            lines.append(f"\n  [{sec}]")
            section = sec
        extra = f" one of {list(choices)}." if choices else ""
        lines.append(f"  --{key} ({tname}, default {default!r})")
        lines.extend("      " + ln for ln in textwrap.wrap(f"{help_text}.{extra}", 84))
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser, finetune: bool = False) -> None:
    p.epilog = _key_help  # a function: built only when the help is shown (see matris.cli.Parser)
    p.add_argument("--config", default=None,
                   help="YAML config file, or a bundled recipe by name: tiny, matris-10m-oam, finetune, ... "
                        "('matris recipes' lists them) (default: all defaults; then set --data.train)")
    if finetune:
        p.add_argument("--from", dest="from_checkpoint", required=True,
                       help="starting model: a name (see 'matris models'), a published-format checkpoint path, "
                            "or an https URL")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in trainer.out_dir: remove an earlier run's checkpoints, models, logs and "
                        "metrics there (other files are kept) instead of resuming it")
    p.add_argument("--dry-run", action="store_true",
                   help="load the model and data, print the memory plan (what a step needs, how many structures a "
                        "batch holds on this device and on 24-141 GB GPUs) and exit without training")


def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    add_arguments(p, finetune=True)


def parse_overrides(extra: list[str]) -> list[tuple[str, str]]:
    """``['--optim.lr', '1e-3', '--trainer.max_steps=10']`` → ``[('optim.lr', '1e-3'), ...]``."""
    from ..errors import MatRISInputError

    out, k = [], 0
    while k < len(extra):
        arg = extra[k]
        if not arg.startswith("--") or "." not in arg:
            raise MatRISInputError(f"unexpected argument {arg!r}; config keys are given as --section.key VALUE "
                                   "(see --help for the list)")
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
            k += 1
        else:
            if k + 1 >= len(extra):
                raise MatRISInputError(f"{arg} needs a value")
            key, value = arg[2:], extra[k + 1]
            k += 2
        out.append((key, value))
    return out


def check_config(args: argparse.Namespace, extra: list[str]) -> None:
    """The checks that need no heavy import: the config names a file or a recipe (resolved to
    its path in ``args.config``), the overrides parse, ``--from`` names a model."""
    if args.config is not None:
        from ..recipes import find

        args.config = str(find(args.config))
    parse_overrides(extra)
    if getattr(args, "from_checkpoint", None):
        from ..pretrained import locate

        locate(args.from_checkpoint)


def load_config(args: argparse.Namespace, extra: list[str]):
    from ..train.config import TrainConfig

    config = TrainConfig.from_yaml(args.config) if args.config else TrainConfig()
    for key, value in parse_overrides(extra):
        config.override(key, value)
    if getattr(args, "from_checkpoint", None):
        config.finetune.from_checkpoint = args.from_checkpoint
        if args.config is None or "reference_energy" not in _read_text(args.config):
            if not any(k == "reference_energy.mode" for k, _ in parse_overrides(extra)):
                config.reference_energy.mode = "keep"
    config.validate("command line")
    return config


def _read_text(config: str) -> str:
    from ..recipes import find

    return find(config).read_text()


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    check_config(args, extra or [])  # before any heavy import: a typo fails at once
    config = load_config(args, extra or [])
    if args.print_config:
        print(config.to_yaml(), end="")
        return 0
    if getattr(args, "dry_run", False):
        from ..train.run import dry_run

        print(dry_run(config))
        return 0
    from ..train import fit

    result = fit(config, overwrite=getattr(args, "overwrite", False))
    if result.metrics:
        print("final errors: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(result.metrics.items())))
    state = " (the earlier, finished run: nothing trained now)" if result.loaded else ""
    print(f"models: {result.best_model or result.last_model} (published format){state}; "
          f"run directory {result.out_dir}")
    return 0


def run_finetune(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    return run(args, extra)
