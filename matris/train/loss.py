"""The training loss and error metrics, with missing labels masked out (NaN = not labelled)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model import ModelOutput
from .config import LossConfig

# metric name → (unit, factor from the model's unit)
# metric names carry their unit, so logs and TensorBoard are unambiguous
METRIC_UNITS = {"energy_mae_meV_atom": ("meV/atom", 1000.0), "force_mae_meV_A": ("meV/Å", 1000.0),
                "stress_mae_GPa": ("GPa", 1.0), "magmom_mae_muB": ("μB", 1.0)}


@dataclass
class ErrorSums:
    """Sums of absolute errors and counts of labels in one batch, for exact averages across batches and ranks.

    energy: |ΔE/atom| summed over labelled structures (eV/atom); force: |ΔF| components
    (eV/Å); stress: |Δσ| components (GPa); magmom: |Δm| (μB).
    """

    sums: torch.Tensor  # [4]: energy, force, stress, magmom
    counts: torch.Tensor  # [4]

    NAMES = tuple(METRIC_UNITS)

    def as_metrics(self) -> dict[str, float]:
        out = {}
        for k, name in enumerate(self.NAMES):
            if self.counts[k] > 0:
                out[name] = float(self.sums[k] / self.counts[k]) * METRIC_UNITS[name][1]
        return out


def _masked(pred: torch.Tensor, target: torch.Tensor, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of pred/target whose label is present (no NaN in the row)."""
    mask = ~torch.isnan(target)
    if dims:
        mask = mask.flatten(1).all(dim=1)
    return pred[mask], target[mask].to(pred.dtype)


def compute_loss(out: ModelOutput, targets, n_atoms: torch.Tensor, config: LossConfig
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor], ErrorSums]:
    """Weighted loss of one batch; returns (loss, per-term losses, error sums).

    ``targets`` holds energy ``[S]`` (total, eV), forces ``[N, 3]``, stress ``[S, 3, 3]`` (GPa)
    and magmoms ``[N]``, NaN where a structure has no label. A term with no label in the
    batch contributes ``0 × prediction`` so every parameter stays in the graph (DDP).
    """
    zero = out.energy.sum() * 0.0
    terms: dict[str, torch.Tensor] = {}
    sums = torch.zeros(4, dtype=torch.float64, device=out.energy.device)
    counts = torch.zeros(4, dtype=torch.float64, device=out.energy.device)

    # energy per atom
    # per-atom energies in the labels' precision (float64 from the data pipeline) before any cast
    e_pred, e_ref = _masked(out.energy_per_atom, targets.energy / n_atoms.to(targets.energy.dtype), 0)
    if e_pred.numel():
        diff = e_pred - e_ref
        if config.energy_loss == "huber":
            terms["energy"] = torch.nn.functional.huber_loss(e_pred, e_ref, delta=config.huber_delta)
        else:
            terms["energy"] = diff.abs().mean()
        sums[0], counts[0] = diff.detach().abs().sum(), diff.numel()
    else:
        terms["energy"] = zero

    # forces: mean L2 norm of the error per atom; stress, magmoms: MAE of the components
    for k, (name, pred, target, dims) in enumerate(
        (("force", out.forces, targets.forces, 1), ("stress", out.stress, targets.stress, 2),
         ("magmom", out.magmoms, targets.magmoms, 0)), start=1):
        if pred is None:
            continue
        p, t = _masked(pred, target, dims)
        if p.numel():
            diff = p - t
            terms[name] = torch.linalg.vector_norm(diff, dim=-1).mean() if name == "force" else diff.abs().mean()
            sums[k], counts[k] = diff.detach().abs().sum(), diff.numel()
        else:
            terms[name] = torch.nan_to_num(pred).sum() * 0.0  # NaN stress of non-3-D cells stays out
    weights = {"energy": config.energy_weight, "force": config.force_weight,
               "stress": config.stress_weight, "magmom": config.magmom_weight}
    loss = sum(weights[k] * v for k, v in terms.items())
    return loss, terms, ErrorSums(sums, counts)


__all__ = ["compute_loss", "ErrorSums", "METRIC_UNITS"]
