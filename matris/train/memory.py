"""Batches sized by memory: ``data.max_memory`` turned into a batch budget by the model's memory model.

A training step's memory is the fixed part (parameters, gradients, AdamW's moments, the EMA copy,
the framework: :func:`matris.memory.training_fixed_bytes`) plus the activations, linear in each
structure's atoms, bonds and angles (:func:`matris.memory.training_bytes`, fitted to measured
peaks by ``benchmarks/train_memory.py``). ``data.max_memory`` less the fixed part is the budget of
activations per batch; the batch sampler fills batches up to it. A structure that alone does not fit
is refused before the first step, by name, with what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import memory as memory_policy
from ..errors import MatRISInputError
from ..memory import available_memory
from ..model import MatRIS
from ..settings import parse_size
from .config import TrainConfig

GB = 2**30
# the share of a device's free memory that max_memory "auto" uses (the model is fitted, not exact)
AUTO_SHARE = 0.85


@dataclass
class MemoryPlan:
    """What ``data.max_memory`` means for one model, data set and device."""

    total: int  # bytes a training process may use on the device
    fixed: int  # parameters, optimizer state, EMA, framework
    budget: int  # activations per batch: total - fixed
    costs: np.ndarray  # [S] activation bytes of each training structure
    source: str  # how total was set
    recompute: str = "none"  # the training recompute mode the costs assume (matris.memory.training_mode)

    def largest(self) -> int:
        """Position (in the training set) of the structure that needs the most memory."""
        return int(np.argmax(self.costs))


def training_device(config: TrainConfig) -> torch.device:
    """The device one training process runs on (rank 0's): CUDA where the trainer would choose it."""
    accel = config.trainer.accelerator
    if accel in ("gpu", "cuda") or (accel == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", 0)
    return torch.device("cpu")


def plan_memory(model: MatRIS, config: TrainConfig, sizes: tuple[np.ndarray, np.ndarray, np.ndarray],
                device: torch.device | None = None, max_memory=None) -> MemoryPlan:
    """The memory plan of a run: ``max_memory`` (default ``config.data.max_memory``; ``'auto'``:
    :data:`AUTO_SHARE` of what ``device`` has free), the fixed part, the activation budget and the
    cost of each structure of ``sizes`` (atoms, bonds, angles), in the recompute mode the model plans
    (:func:`matris.memory.training_mode`)."""
    device = device or training_device(config)
    value = config.data.max_memory if max_memory is None else max_memory
    dtype = torch.float64 if config.trainer.precision == "64" else torch.float32
    mode = memory_policy.training_mode(model)
    fixed = memory_policy.training_fixed_bytes(model, dtype, ema=bool(config.optim.ema_decay), recompute=mode)
    parsed = parse_size(value, "data.max_memory")
    if parsed is None:
        total = int(AUTO_SHARE * (available_memory(device) + (fixed if device.type == "cuda" else 0)))
        source = f"auto: {AUTO_SHARE:.0%} of the memory free on {device}"
    else:
        total, source = parsed, f"data.max_memory = {value}"
    atoms, bonds, angles = (np.asarray(a, dtype=np.int64) for a in sizes)
    costs = np.asarray(memory_policy.training_bytes(model, atoms, bonds, angles, dtype, recompute=mode), dtype=np.int64)
    return MemoryPlan(total=total, fixed=fixed, budget=total - fixed, costs=costs, source=source, recompute=mode)


def check_fits(plan: MemoryPlan, sizes: tuple[np.ndarray, np.ndarray, np.ndarray], what: str = "training") -> None:
    """A clear error, before any step, where the fixed part or the largest structure alone exceeds
    the plan (instead of an out-of-memory kill in the middle of an epoch)."""
    if plan.budget <= 0:
        raise MatRISInputError(
            f"the model's parameters, optimizer state and framework need about {plan.fixed / GB:.1f} GB, more than "
            f"the {plan.total / GB:.1f} GB allowed ({plan.source}); raise data.max_memory or use a larger device")
    k = plan.largest()
    if plan.costs[k] > plan.budget:
        atoms, bonds, angles = (int(a[k]) for a in sizes)
        fits = int(plan.budget / max(1, plan.costs[k]) * angles)
        raise MatRISInputError(
            f"the largest {what} structure (position {k}: {atoms} atoms, {bonds} bonds, {angles} angles) needs about "
            f"{(plan.costs[k] + plan.fixed) / GB:.1f} GB for one training step of this model, more than the "
            f"{plan.total / GB:.1f} GB allowed ({plan.source}; recompute {plan.recompute}); structures of up to about "
            f"{fits} angles fit. Raise data.max_memory, use a device with more memory, "
            + ("set trainer.recompute: rows (least memory), " if plan.recompute != "rows" else "")
            + "or remove the largest structures from the data")


def describe(plan: MemoryPlan, sizes, device: torch.device) -> str:
    """The dry run's report: the plan, the largest structure and how many structures a batch takes."""
    atoms, bonds, angles = (np.asarray(a) for a in sizes)
    k = plan.largest()
    median = float(np.median(plan.costs)) if plan.costs.size else 0.0
    lines = [f"memory plan on {device} ({plan.source}):",
             f"  allowed per device        {plan.total / GB:8.2f} GB",
             f"  fixed (weights, AdamW, EMA, framework) {plan.fixed / GB:8.2f} GB",
             f"  activations per batch     {plan.budget / GB:8.2f} GB (recompute {plan.recompute})",
             f"  largest structure         position {k}: {int(atoms[k])} atoms, {int(angles[k])} angles, "
             f"{plan.costs[k] / GB:.2f} GB",
             f"  median structure          {median / GB:.3f} GB: about {int(plan.budget // max(median, 1))} per batch"]
    for size in (24, 40, 80, 141):
        room = size * GB - plan.fixed
        lines.append(f"  a {size:3d} GB device: {'largest fits' if room >= plan.costs[k] else 'largest does not fit'}"
                     f", about {max(0, int(room // max(median, 1)))} median structures per batch")
    return "\n".join(lines)
