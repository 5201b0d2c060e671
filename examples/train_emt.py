"""Train a tiny MatRIS on EMT data, then fine-tune it to "another functional" — all offline, on a CPU.

    python examples/train_emt.py                 # ~5 minutes on 2 CPU cores
    python examples/train_emt.py --steps 100     # quicker, less accurate

1. Makes labelled data with ASE's EMT potential (Al/Cu/Ag/Au/Ni/Pd/Pt alloys, strained and
   rattled cells) in examples/configs/data/.
2. Trains examples/configs/tiny.yaml (what ``matris train --config examples/configs/tiny.yaml``
   does) and reports validation errors; runs/tiny/parity.png shows the fit.
3. Relabels new structures as a different "functional" (energies scaled by 1.1 and shifted per
   element) and compares, on held-out structures of that functional: the trained model as is,
   the model fine-tuned for N steps (reference energies refitted), and a model trained from
   scratch for the same N steps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from matris import MatRIS
from matris.data.synthetic import emt_structures, write_emt_dataset
from matris.train import TrainConfig, fit

HERE = Path(__file__).resolve().parent
SHIFT = {"Al": -0.4, "Cu": 0.3, "Ag": 0.2, "Au": -0.2, "Ni": 0.5, "Pd": -0.1, "Pt": 0.1}


def errors(model: MatRIS, frames) -> tuple[float, float]:
    """Energy MAE (meV/atom) and force MAE (meV/Å) against the frames' stored labels."""
    preds = model.predict(frames, batch_size=32)
    de = [abs(p.energy_per_atom - a.get_potential_energy() / len(a)) for p, a in zip(preds, frames)]
    df = np.concatenate([np.abs(p.forces - a.get_forces()).ravel() for p, a in zip(preds, frames)])
    return 1000 * float(np.mean(de)), 1000 * float(np.mean(df))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="training steps of the tiny model")
    p.add_argument("--finetune-steps", type=int, default=60)
    p.add_argument("--out", type=Path, default=Path("runs"))
    args = p.parse_args()

    data = HERE / "configs" / "data"
    write_emt_dataset(data / "emt_train.extxyz", 400, seed=0)
    config = TrainConfig.from_yaml(HERE / "configs" / "tiny.yaml")
    config.override("trainer.max_steps", args.steps)
    config.override("trainer.out_dir", str(args.out / "tiny"))
    base = fit(config)
    print(f"tiny model: {base.metrics}")

    new = dict(energy_scale=1.1, energy_shift=SHIFT)
    write_emt_dataset(data / "emt_finetune.extxyz", 40, seed=1, **new)
    held_out = emt_structures(100, seed=2, **new)
    ft = TrainConfig.from_yaml(HERE / "configs" / "finetune.yaml")
    ft.override("finetune.from_checkpoint", str(base.last_model))
    ft.override("trainer.max_steps", args.finetune_steps)
    ft.override("trainer.out_dir", str(args.out / "finetune"))
    tuned = fit(ft)

    scratch = TrainConfig.from_yaml(HERE / "configs" / "tiny.yaml")
    scratch.data = ft.data
    scratch.override("trainer.max_steps", args.finetune_steps)
    scratch.override("trainer.out_dir", str(args.out / "scratch"))
    scratch.override("optim.lr", ft.optim.lr)
    from_scratch = fit(scratch)

    print(f"\nheld-out structures of the new 'functional' ({len(held_out)}):")
    print(f"{'model':34s} {'energy (meV/atom)':>18s} {'forces (meV/Å)':>15s}")
    for name, path in (("trained on EMT, not fine-tuned", base.last_model),
                       (f"fine-tuned {args.finetune_steps} steps", tuned.last_model),
                       (f"from scratch {args.finetune_steps} steps", from_scratch.last_model)):
        e, f = errors(MatRIS.load(path), held_out)
        print(f"{name:34s} {e:18.1f} {f:15.1f}")


if __name__ == "__main__":
    main()
