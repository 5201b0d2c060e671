"""The LightningModule that trains a MatRIS model on energies, forces, stress and magnetic moments."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..model import MatRIS
from ._lightning import L
from .config import TrainConfig
from .loss import ErrorSums, compute_loss


@dataclass
class TrainBatch:
    """One batch: the graphs, their labels, and the dataset positions of its structures."""

    graph: Any  # GraphBatch
    targets: Any  # matris.data.Targets
    indices: torch.Tensor  # [S] int64

    def to(self, device) -> "TrainBatch":
        return TrainBatch(self.graph.to(device), self.targets.to(device), self.indices)


class MatRISModule(L.LightningModule):
    """Trains ``model`` with the loss of :mod:`matris.train.loss`, AdamW, warm-up + cosine and EMA.

    The EMA copy (``ema_model``) is what validation, the parity plot and the exported
    checkpoints use. ``labels`` says which labels the training data has at all, so derivative
    outputs nobody trains on are not computed.
    """

    def __init__(self, model: MatRIS, config: TrainConfig, labels: dict[str, bool] | None = None):
        super().__init__()
        self.model = model
        self.config = config
        labels = labels or {"energy": True, "forces": True, "stress": True, "magmoms": True}
        w = config.loss
        self.train_forces = bool(labels.get("forces")) and w.force_weight > 0
        self.train_stress = bool(labels.get("stress")) and w.stress_weight > 0
        self.train_magmoms = bool(labels.get("magmoms")) and w.magmom_weight > 0
        # the exported model offers magnetic moments only if this run trained its magmom head
        # (a fine-tuned backbone leaves an untrained head's outputs meaningless)
        #: why a base model's magnetic moments are not offered by the trained one (None: they are, or it had none)
        self.magmoms_dropped = None
        if model.predicts_magmoms and not self.train_magmoms:
            why = ("the training data has no magnetic-moment labels" if not labels.get("magmoms")
                   else "loss.magmom_weight is 0")
            self.magmoms_dropped = (
                f"the trained model will not offer magnetic moments, which its starting model predicted: {why}, and "
                "training changes the features its magmom head reads, so that head's output would no longer be the "
                "starting model's; give the data magmom labels (and loss.magmom_weight > 0) to keep them")
        model.targets = "efsm" if self.train_magmoms else "efs"
        decay = config.optim.ema_decay
        self.ema_decay = float(decay) if decay else 0.0
        self.ema_model = None
        if self.ema_decay > 0:
            self.ema_model = copy.deepcopy(model)
            for p in self.ema_model.parameters():
                p.requires_grad_(False)
        self.register_buffer("ema_updates", torch.zeros((), dtype=torch.int64))
        self.batches_in_epoch = 0  # training batches done in the current epoch (for exact resume)
        self._val_sums: list[ErrorSums] = []

    @property
    def eval_model(self) -> MatRIS:
        """The weights used for validation and export: the EMA when enabled."""
        return self.ema_model if self.ema_model is not None else self.model

    # ------------------------------------------------------------------ steps
    def _forward(self, model: MatRIS, batch: TrainBatch, create_graph: bool):
        out = model(batch.graph, compute_forces=self.train_forces or not create_graph,
                    compute_stress=self.train_stress, compute_magmoms=self.train_magmoms, create_graph=create_graph)
        targets = batch.targets.to(out.energy.device)  # labels stay float64; each term casts after E/N
        loss, terms, sums = compute_loss(out, targets, batch.graph.n_atoms.to(out.energy.device), self.config.loss)
        return out, loss, terms, sums

    def training_step(self, batch: TrainBatch, batch_idx: int) -> torch.Tensor:
        _, loss, terms, sums = self._forward(self.model, batch, create_graph=True)
        if self.trainer.world_size > 1:
            # DDP needs a gradient for every parameter in every step; some never get one (the
            # last block's bond refinement does not reach the energy; the magmom head without
            # labels; line-graph layers in a batch without angles): add them with weight 0
            loss = loss + 0.0 * sum(p.sum() for p in self.model.parameters() if p.requires_grad)
        self.batches_in_epoch += 1
        n = batch.graph.num_structures
        self.log("train/loss", loss.detach(), batch_size=n, prog_bar=True)
        for k, v in terms.items():
            self.log(f"train/loss_{k}", v.detach(), batch_size=n)
        for k, v in sums.as_metrics().items():
            self.log(f"train/{k}", v, batch_size=n, prog_bar=k.startswith(("energy", "force")))
        return loss

    def on_train_epoch_start(self) -> None:
        # not called for an epoch resumed in the middle: then the count comes from the checkpoint
        self.batches_in_epoch = 0

    def _eval_step(self, batch: TrainBatch, stage: str) -> None:
        model = self.eval_model
        was = model.training
        model.eval()
        _, loss, _, sums = self._forward(model, batch, create_graph=False)
        model.train(was)
        self.log(f"{stage}/loss", loss.detach(), batch_size=batch.graph.num_structures, sync_dist=True)
        self._val_sums.append(sums)

    def validation_step(self, batch: TrainBatch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: TrainBatch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def _epoch_errors(self) -> dict[str, float]:
        """Exact MAEs over every structure evaluated this epoch, on all ranks together."""
        if not self._val_sums:
            return {}
        sums = torch.stack([s.sums for s in self._val_sums]).sum(0)
        counts = torch.stack([s.counts for s in self._val_sums]).sum(0)
        self._val_sums = []
        if self.trainer.world_size > 1:
            sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
            counts = self.trainer.strategy.reduce(counts, reduce_op="sum")
        return ErrorSums(sums, counts).as_metrics()

    def on_validation_epoch_end(self) -> None:
        for k, v in self._epoch_errors().items():
            self.log(f"val/{k}", v, prog_bar=k.startswith(("energy", "force")))

    def on_test_epoch_end(self) -> None:
        for k, v in self._epoch_errors().items():
            self.log(f"test/{k}", v)

    # ------------------------------------------------------------------ EMA
    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # inside the optimizer step, so a checkpoint written after this batch holds this update
        self._update_ema()

    @torch.no_grad()
    def _update_ema(self) -> None:
        if self.ema_model is None:
            return
        self.ema_updates += 1
        n = int(self.ema_updates)
        decay = min(self.ema_decay, (1 + n) / (10 + n))  # short warm-up: early weights fade fast
        for ema, p in zip(self.ema_model.parameters(), self.model.parameters()):
            if p.requires_grad:
                ema.lerp_(p.detach().to(ema.dtype), 1 - decay)

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        o, ft = self.config.optim, self.config.finetune
        backbone_lr = ft.backbone_lr if ft.backbone_lr is not None else o.lr
        groups: dict[tuple[bool, bool], list] = {}
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            backbone = name.startswith(("atom_embedding", "edge_embedding", "three_body_embedding",
                                        "interaction_block"))
            # no weight decay on biases, norms, basis frequencies and the element table
            decay = p.ndim >= 2 and not name.startswith("atom_embedding.embedding.")
            groups.setdefault((backbone, decay), []).append(p)
        param_groups = [
            {"params": ps, "lr": backbone_lr if backbone else o.lr, "weight_decay": o.weight_decay if decay else 0.0}
            for (backbone, decay), ps in groups.items()
        ]
        optimizer = torch.optim.AdamW(param_groups, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = o.warmup_steps if o.warmup_steps is not None else int(round(o.warmup_fraction * total))
        schedule = lr_lambda(total, warmup, o.schedule, o.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["matris"] = {
            "model_config": self.eval_model.config.to_dict(),
            "train_config": self.config.to_dict(),
            "epoch": self.current_epoch,
            "batches_in_epoch": self.batches_in_epoch,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("matris", {})
        self.batches_in_epoch = int(state.get("batches_in_epoch", 0))


def lr_lambda(total: int, warmup: int, schedule: str, min_ratio: float):
    """Learning-rate factor of optimizer step ``s``: linear warm-up, then cosine to ``min_ratio`` (or constant)."""
    warmup = max(0, min(warmup, total - 1))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if schedule == "constant":
            return 1.0
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return factor


__all__ = ["MatRISModule", "TrainBatch", "lr_lambda"]
