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

    if out.forces is not None:
        f_pred, f_ref = _masked(out.forces, targets.forces, 1)
        if f_pred.numel():
            diff = f_pred - f_ref
            terms["force"] = torch.linalg.vector_norm(diff, dim=-1).mean()
            sums[1], counts[1] = diff.detach().abs().sum(), diff.numel()
        else:
            terms["force"] = out.forces.sum() * 0.0
    if out.stress is not None:
        s_pred, s_ref = _masked(out.stress, targets.stress, 2)
        if s_pred.numel():
            diff = s_pred - s_ref
            terms["stress"] = diff.abs().mean()
            sums[2], counts[2] = diff.detach().abs().sum(), diff.numel()
        else:
            terms["stress"] = torch.nan_to_num(out.stress).sum() * 0.0
    if out.magmoms is not None:
        m_pred, m_ref = _masked(out.magmoms, targets.magmoms, 0)
        if m_pred.numel():
            diff = m_pred - m_ref
            terms["magmom"] = diff.abs().mean()
            sums[3], counts[3] = diff.detach().abs().sum(), diff.numel()
        else:
            terms["magmom"] = out.magmoms.sum() * 0.0

    weights = {"energy": config.energy_weight, "force": config.force_weight,
               "stress": config.stress_weight, "magmom": config.magmom_weight}
    loss = sum(weights[k] * v for k, v in terms.items())
    return loss, terms, ErrorSums(sums, counts)


__all__ = ["compute_loss", "ErrorSums", "METRIC_UNITS"]
