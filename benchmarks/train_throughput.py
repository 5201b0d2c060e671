"""Training throughput of the Lightning pipeline: structures/s and atoms/s.

    python -m benchmarks.train_throughput                       # tiny config on CPU
    python -m benchmarks.train_throughput --device cuda --config examples/configs/matris-10m.yaml
    python -m benchmarks.train_throughput --json results/train_cpu.json

Runs the real pipeline (packed graph cache, budget batches, MatRISModule with the force,
stress and magmom loss, AdamW, EMA) through ``lightning.Trainer`` on synthetic structures
with random labels (throughput does not depend on what the labels are), so it needs neither
ase nor downloaded data. Timing starts after ``--warmup`` steps; "model" is the share of the
step spent in forward + double backward, the rest is data, optimizer, EMA and Lightning.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch

from benchmarks.common import ROOT, write_json
from matris.data import PackedDataset, Sample
from matris.graph import AtomicSystem
from matris.train import TrainConfig
from matris.train.datamodule import Collate, Subset, _Positions
from matris.train.module import MatRISModule
from matris.train.run import build_model

FCC = np.array([[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]])


def synthetic_samples(n: int, atoms: tuple[int, int], seed: int = 0) -> list[Sample]:
    """``n`` rattled fcc alloy cells of Al/Cu/Ni/Pd/Pt with ``atoms[0]``–``atoms[1]`` atoms and random labels."""
    rng = np.random.default_rng(seed)
    elements = np.array([13, 29, 28, 46, 78])
    out = []
    for k in range(n):
        reps = 1
        while 4 * (reps + 1) ** 3 <= atoms[1]:
            reps += 1
        reps = int(rng.integers(1, reps + 1)) if 4 * reps ** 3 > atoms[0] else reps
        grid = np.stack(np.meshgrid(*[np.arange(reps)] * 3, indexing="ij"), -1).reshape(-1, 3)
        frac = (grid[:, None, :] + FCC[None]).reshape(-1, 3) / reps
        a = 3.8 * reps
        cell = a * (np.eye(3) + rng.uniform(-0.03, 0.03, (3, 3)))
        pos = frac @ cell + rng.normal(scale=0.06, size=frac.shape)
        z = rng.choice(elements, size=len(pos))
        system = AtomicSystem(pos, cell, True, z, f"syn{k}")
        out.append(Sample(system=system, energy=float(-4 * len(z) + rng.normal()),
                          forces=rng.normal(scale=0.3, size=pos.shape), stress=rng.normal(size=(3, 3)),
                          magmoms=np.abs(rng.normal(size=len(z))), material_id=f"syn{k}"))
    return out


class Timer(L.Callback):
    def __init__(self, warmup: int):
        self.warmup, self.t0, self.steps, self.structures, self.atoms = warmup, None, 0, 0, 0
        self.model_time = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.warmup:
            _sync(pl_module.device)
            self.t0 = time.perf_counter()
        if self.t0 is not None:
            self.steps += 1
            self.structures += batch.graph.num_structures
            self.atoms += batch.graph.num_atoms

    def on_train_end(self, trainer, pl_module):
        _sync(pl_module.device)
        self.elapsed = time.perf_counter() - self.t0


class TimedModule(MatRISModule):
    """Adds the time of forward + backward of the loss (the model's share of a step)."""

    def training_step(self, batch, batch_idx):
        _sync(self.device)
        t = time.perf_counter()
        loss = super().training_step(batch, batch_idx)
        self._t_fwd = t
        return loss

    def on_after_backward(self):
        _sync(self.device)
        if getattr(self, "_timer", None) is not None and self._timer.t0 is not None:
            self._timer.model_time += time.perf_counter() - self._t_fwd


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def run(config_path: Path, device: str, steps: int, warmup: int, n_structures: int, atoms: tuple[int, int],
        batch: int, precision: str) -> dict:
    config = TrainConfig.from_yaml(config_path)
    config.optim.ema_decay = 0.999
    model = build_model(config)
    with tempfile.TemporaryDirectory() as tmp:
        samples = synthetic_samples(n_structures, atoms)
        packed = PackedDataset.from_samples(samples, model.cutoff, model.three_body_cutoff, Path(tmp) / "cache")
        subset = Subset(packed, np.arange(len(packed)))
        from matris.data import BudgetBatchSampler

        sampler = BudgetBatchSampler(*subset.sizes(), max_structures=batch, shuffle=True, seed=0)
        loader = torch.utils.data.DataLoader(_Positions(len(subset)), batch_sampler=sampler,
                                             collate_fn=Collate(subset))
        module = TimedModule(model, config, labels=packed.has_labels)
        timer = Timer(warmup)
        module._timer = timer
        trainer = L.Trainer(max_steps=warmup + steps, accelerator="gpu" if device.startswith("cuda") else "cpu",
                            devices=1, precision={"32": "32-true", "bf16-mixed": "bf16-mixed", "64": "64-true"}
                            [precision], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, inference_mode=False, use_distributed_sampler=False,
                            callbacks=[timer], gradient_clip_val=config.optim.grad_clip, default_root_dir=tmp)
        trainer.fit(module, train_dataloaders=loader)
        a, b, t = subset.sizes()
    return {
        "config": str(config_path), "device": device, "precision": precision,
        "parameters": model.num_parameters(), "batch_structures": batch,
        "mean_atoms": float(a.mean()), "mean_bonds": float(b.mean()), "mean_angles": float(t.mean()),
        "steps": timer.steps, "seconds": timer.elapsed,
        "structures_per_s": timer.structures / timer.elapsed, "atoms_per_s": timer.atoms / timer.elapsed,
        "ms_per_step": 1000 * timer.elapsed / timer.steps, "model_share": timer.model_time / timer.elapsed,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "configs" / "tiny.yaml")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--structures", type=int, default=256)
    p.add_argument("--atoms", default="4,32", help="min,max atoms per structure")
    p.add_argument("--batch", type=int, default=16, help="structures per batch")
    p.add_argument("--precision", default="32", choices=["32", "bf16-mixed", "64"])
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    lo, hi = (int(x) for x in args.atoms.split(","))
    r = run(args.config, args.device, args.steps, args.warmup, args.structures, (lo, hi), args.batch, args.precision)
    print(f"{'config':22s} {'device':6s} {'params':>9s} {'atoms/str':>9s} {'angles/str':>10s} {'ms/step':>8s} "
          f"{'struct/s':>9s} {'atoms/s':>9s} {'model':>6s}")
    print(f"{Path(r['config']).name:22s} {r['device']:6s} {r['parameters']:9,d} {r['mean_atoms']:9.1f} "
          f"{r['mean_angles']:10.0f} {r['ms_per_step']:8.1f} {r['structures_per_s']:9.2f} {r['atoms_per_s']:9.1f} "
          f"{100 * r['model_share']:5.0f}%")
    if args.json:
        write_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
