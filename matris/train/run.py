"""One training or fine-tuning run: model, data, Lightning Trainer, checkpoints, exports and plots.

Outputs under ``trainer.out_dir``::

    config.yaml               the resolved configuration
    checkpoints/last.ckpt     Lightning checkpoint for exact resume (every n steps, every epoch)
    checkpoints/best.ckpt     Lightning checkpoint with the lowest val/loss
    best_model.pth.tar        published checkpoint format (EMA weights), lowest val/loss
    last_model.pth.tar        published checkpoint format (EMA weights), end of training
    logs/csv/version_k/metrics.csv  metrics (meV/atom, meV/Å, GPa, μB), one version per (resumed) segment;
                              logs/tensorboard/version_k/ for TensorBoard
    parity.png, metrics.json  validation parity plot and final errors

Reruns follow :mod:`matris.rerun`: the same command again resumes an unfinished run from
``checkpoints/last.ckpt`` (one line says so); a run whose checkpoint is already at
``max_steps`` (or ``max_epochs``) is not trained again: one line says so and how to go on,
and its exported models are returned as they are. ``overwrite=True`` (``--overwrite``)
removes the run's own outputs (the files listed above, nothing else in ``out_dir``) and
starts afresh.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import memory as memory_policy
from ..atomic import atomic_path, write_text
from ..errors import MatRISInputError, MissingExtraError
from ..model import MatRIS
from ..rerun import config_key, notice, remove_outputs, spell
from ..rerun import overwrite as overwrite_option
from ._lightning import (
    Callback,
    L,
    LearningRateMonitor,
    ModelCheckpoint,
    TorchCheckpointIO,
    TQDMProgressBar,
    rank_zero_info,
    rank_zero_only,
)
from .config import TrainConfig
from .datamodule import MatRISDataModule
from .module import MatRISModule
from .reference import read_reference_energies, refit_reference_energies, set_reference_energies

PRECISION = {"32": "32-true", "tf32": "32-true", "64": "64-true"}


@dataclass
class TrainResult:
    """Where a finished run put its outputs, and its final validation errors."""

    out_dir: Path
    best_model: Path | None
    last_model: Path
    metrics: dict[str, float]
    module: MatRISModule | None
    loaded: bool = False  # True when the run was already finished: nothing trained, outputs read back (no module)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoints written to a temp file and renamed: a kill never leaves half a file."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        with atomic_path(path, suffix=".tmp", fsync=True) as tmp:
            torch.save(checkpoint, tmp)


class ProgressBar(TQDMProgressBar):
    """Lightning's bar without the logger version number."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics


class ExportBest(Callback):
    """Writes the EMA weights in the published format: ``best_model.pth.tar`` whenever val/loss improves."""

    def __init__(self, out_dir: Path, monitor: str = "val/loss"):
        self.out_dir, self.monitor = Path(out_dir), monitor
        self.best = math.inf

    def on_validation_end(self, trainer: L.Trainer, pl_module: MatRISModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None or not math.isfinite(float(value)) or float(value) >= self.best:
            return
        self.best = float(value)
        if trainer.is_global_zero:
            pl_module.eval_model.save(self.out_dir / "best_model.pth.tar")

    def state_dict(self) -> dict[str, float]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.best = float(state.get("best", math.inf))


def build_model(config: TrainConfig) -> MatRIS:
    """A new model from ``config.model``, or the starting checkpoint of a fine-tuning run, with freezing applied."""
    ft = config.finetune
    if ft.from_checkpoint:
        model = MatRIS.load(ft.from_checkpoint).train()
    else:
        model = MatRIS(config.model).train()
    model.options.training_recompute = config.trainer.recompute
    n_blocks = len(model.interaction_block)
    if ft.freeze_blocks > n_blocks:
        raise MatRISInputError(f"finetune.freeze_blocks = {ft.freeze_blocks} but the model has {n_blocks} blocks")
    frozen = []
    if ft.freeze_embeddings:
        frozen += [model.atom_embedding, model.edge_embedding, model.three_body_embedding]
    frozen += list(model.interaction_block[: ft.freeze_blocks])
    for module in frozen:
        for p in module.parameters():
            p.requires_grad_(False)
    return model


def apply_memory_budget(model: MatRIS, config: TrainConfig, data: MatRISDataModule):
    """``data.max_memory``: the batch budget from the model's memory model, after checking that
    the largest training structure fits (a clear error now instead of an out-of-memory kill later);
    returns the plan (None without ``data.max_memory``)."""
    if config.data.max_memory is None:
        return None
    from .memory import check_fits, plan_memory

    sizes = data.train_set.sizes()
    plan = plan_memory(model, config, sizes)
    check_fits(plan, sizes)
    dtype = torch.float64 if config.trainer.precision == "64" else torch.float32
    data.set_memory_budget(lambda a, b, t: memory_policy.training_bytes(model, np.asarray(a), np.asarray(b),
                                                                          np.asarray(t), dtype, plan.recompute),
                           plan.budget)
    model.options.training_memory_limit = plan.budget  # a batch keeps its whole graph only where that fits too
    # validation and test (inference, on the model and its EMA copy) within the same budget: by default
    # inference would take its level from the device's free memory and keep everything
    model.options.memory_limit = plan.budget
    rank_zero_info(f"matris: batches of up to {plan.budget / 2**30:.2f} GB of activations ({plan.source}; "
                   f"{plan.fixed / 2**30:.2f} GB for weights, optimizer and framework)")
    return plan


def dry_run(config: TrainConfig) -> str:
    """What a run would do with memory, without training: the model, the data, and the memory plan
    (``data.max_memory``, or ``auto`` when it is not set) on the run's device."""
    from .memory import describe, plan_memory, training_device

    config.check_data_paths()
    model = build_model(config)
    data = MatRISDataModule(config.data, model.cutoff, model.three_body_cutoff, seed=config.trainer.seed)
    data.setup("fit")
    sizes = data.train_set.sizes()
    device = training_device(config)
    plan = plan_memory(model, config, sizes, device, max_memory=config.data.max_memory or "auto")
    if model.options.training_recompute is not None:
        recompute = model.options.training_recompute
    elif memory_policy.training_mode(model) == "none":
        recompute = "none"
    else:
        recompute = "automatic (per batch, the first of none, blocks, rows whose memory fits)"
    head = (f"model: {model.num_parameters():,} parameters, {model.config.num_layers} "
            f"blocks, recompute {recompute}; {len(data.train_set)} training structures")
    verdict = "the largest structure fits" if plan.costs.max(initial=0) <= plan.budget else \
        "the largest structure does NOT fit: raise data.max_memory, use a larger device or drop it"
    return f"{head}\n{describe(plan, sizes, device)}\n{verdict}"


def apply_reference_energies(model: MatRIS, config: TrainConfig, data: MatRISDataModule) -> str:
    """Set the model's per-element reference energies as ``reference_energy.mode`` says; returns a summary."""
    mode = config.reference_energy.mode
    if mode == "auto":  # fine-tuning: refit on the model's residual; from scratch: fit on composition
        mode = "refit" if config.finetune.from_checkpoint else "fit"
    if mode == "refit":
        if not config.finetune.from_checkpoint:
            raise MatRISInputError("reference_energy.mode 'refit' fits the references to what a pretrained model "
                                   "does not predict: it needs finetune.from_checkpoint; use 'fit' to train from "
                                   "scratch")
        current = None if model.reference_energy is None else model.reference_energy.fc.weight.detach().double().cpu()
        refit = refit_reference_energies(data.model_energies(model), None if current is None else current.numpy()[0])
        set_reference_energies(model, refit.values, "refitted")
        return refit.summary()
    if mode == "keep":
        if not config.finetune.from_checkpoint:
            raise MatRISInputError("reference_energy.mode 'keep' needs finetune.from_checkpoint; use 'fit' or 'none'")
        return "kept the starting checkpoint's reference energies"
    if mode == "none":
        set_reference_energies(model, None)
        return "no reference energies"
    if mode == "fit":
        values, n_labelled = data.fit_reference_energies()
        set_reference_energies(model, values, "fitted")
        return f"fitted reference energies of {int((values != 0).sum())} elements on {n_labelled} structures"
    values = read_reference_energies(mode)
    set_reference_energies(model, values, Path(mode).stem)
    return f"reference energies from {mode}"


RESUME_AUTO = "trainer.resume='auto'"


def _resume_path(config: TrainConfig, out_dir: Path) -> str | None:
    resume = config.trainer.resume
    if resume == "never":
        if (out_dir / "checkpoints").is_dir() and any((out_dir / "checkpoints").glob("*.ckpt")):
            raise MatRISInputError(
                f"{out_dir} already holds a run (checkpoints/*.ckpt) and trainer.resume is 'never': continue it with "
                f"{spell('--trainer.resume auto', RESUME_AUTO)}, start afresh there with {overwrite_option()}, or "
                f"give another {config_key('trainer.out_dir')}")
        return None
    if resume == "auto":
        last = out_dir / "checkpoints" / "last.ckpt"
        return str(last) if last.is_file() else None
    if not Path(resume).is_file():
        raise FileNotFoundError(f"trainer.resume: no checkpoint {resume}")
    return resume


RUN_FILES = ("config.yaml", "best_model.pth.tar", "last_model.pth.tar", "metrics.json", "parity.png")
RUN_FOLDERS = ("logs/csv", "logs/tensorboard")


def run_outputs(out_dir: Path) -> list[Path]:
    """The files and folders a run writes in ``out_dir`` (what ``overwrite`` removes): never
    the folder itself, and in ``checkpoints/`` only the checkpoint files."""
    out = [out_dir / name for name in RUN_FILES + RUN_FOLDERS]
    ckpt_dir = out_dir / "checkpoints"
    if ckpt_dir.is_dir():
        out += sorted(p for p in ckpt_dir.iterdir() if p.suffix in (".ckpt", ".tmp"))
    return [p for p in out if p.exists() or p.is_symlink()]


def checkpoint_progress(path: str | Path) -> tuple[int, int]:
    """(optimizer steps, epochs) a Lightning checkpoint has done; its tensors are mapped, not read."""
    state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return int(state.get("global_step", 0)), int(state.get("epoch", 0))


def _finished(config: TrainConfig, step: int, epoch: int) -> str | None:
    """Why a run at ``step``/``epoch`` has nothing left to train under ``config`` (None: it has)."""
    t = config.trainer
    if t.max_steps >= 0 and step >= t.max_steps:
        return (f"at step {step}, and trainer.max_steps is {t.max_steps}: to train further, raise "
                f"{config_key('trainer.max_steps')} above {step}")
    if t.max_epochs is not None and t.max_epochs >= 0 and epoch >= t.max_epochs:
        return (f"at epoch {epoch}, and trainer.max_epochs is {t.max_epochs}: to train further, raise "
                f"{config_key('trainer.max_epochs')} above {epoch}")
    return None


def _loaded_result(out_dir: Path) -> TrainResult:
    """The outputs of a finished run, read back instead of trained again."""
    metrics_file = out_dir / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
    best = out_dir / "best_model.pth.tar"
    return TrainResult(out_dir, best if best.is_file() else None, out_dir / "last_model.pth.tar", metrics, None,
                       loaded=True)


@contextlib.contextmanager
def quiet_lightning():
    """Lightning without its per-run info lines (GPU/TPU available, LOCAL_RANK, the litlogger and
    litmodels tips, 'fit stopped: max_steps reached': matris prints what it did itself) and
    without a deprecation that torch raises inside Lightning's own code, nor the warning that a
    resumed run's checkpoints/ is not empty. Lightning's warnings
    about the run (data, config, checkpoints) stay visible: they are warnings, not info."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                category=FutureWarning)
        # a resumed run writes into its own checkpoints/ by design (a clash with another run is refused earlier)
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        for lg in loggers:
            lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def _rerun(config: TrainConfig, out_dir: Path, overwrite: bool) -> tuple[str | None, TrainResult | None]:
    """The rerun rule (:mod:`matris.rerun`) for ``out_dir``: the checkpoint to resume from, and the
    finished run's result when there is nothing to train."""
    if overwrite:
        if config.trainer.resume not in ("auto", "never"):
            raise MatRISInputError(f"{overwrite_option()} starts afresh, but trainer.resume names a checkpoint to "
                                   f"continue ({config.trainer.resume}): drop one of the two")
        # every rank starts afresh; only rank 0 removes files (the others may already be reading the folder)
        if rank_zero_only.rank == 0:
            removed = remove_outputs(run_outputs(out_dir))
            if removed:
                notice(f"train: {overwrite_option()}: removed the earlier run's {len(removed)} outputs in {out_dir} "
                       "(checkpoints, models, logs, metrics; other files are kept); starting afresh")
        return None, None
    resume = _resume_path(config, out_dir)
    if resume is None:
        return None, None
    step, epoch = checkpoint_progress(resume)
    done = _finished(config, step, epoch)
    own = Path(resume).resolve() == (out_dir / "checkpoints" / "last.ckpt").resolve()
    if done and own and (out_dir / "last_model.pth.tar").is_file():
        if rank_zero_only.rank == 0:
            notice(f"train: {out_dir} holds a finished run, not trained again: {resume} is {done}; to start afresh, "
                   f"pass {overwrite_option()} or another {config_key('trainer.out_dir')}")
        return resume, _loaded_result(out_dir)
    if rank_zero_only.rank == 0:
        what = f"{done}; nothing left to train, writing the exports" if done else f"at step {step}"
        notice(f"train: resuming from {resume} ({what}); {overwrite_option()} or another "
               f"{config_key('trainer.out_dir')} starts afresh")
    return resume, None


def _devices(value: str) -> Any:
    if value == "auto":
        return "auto"
    if "," in value:
        return [int(v) for v in value.split(",") if v.strip()]
    try:
        return int(value)
    except ValueError:
        raise MatRISInputError(f"trainer.devices = {value!r}: give a number, a list like '0,1', or 'auto'") from None


def fit(config: TrainConfig, callbacks: list[Callback] | None = None, overwrite: bool = False) -> TrainResult:
    """Train (or fine-tune, when ``config.finetune.from_checkpoint`` is set) and export the model.

    A run already in ``trainer.out_dir`` is resumed, or, when it is finished, returned as it is
    (``loaded``, nothing trained); ``overwrite=True`` removes its outputs and starts afresh."""
    t = config.trainer
    out_dir = Path(t.out_dir)
    config.check_data_paths()  # before anything is removed or built: a wrong path says what it was resolved against
    resume, loaded = _rerun(config, out_dir, overwrite)
    if loaded is not None:
        return loaded
    L.seed_everything(t.seed, workers=True, verbose=False)
    if t.precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = build_model(config)
    data = MatRISDataModule(config.data, model.cutoff, model.three_body_cutoff, seed=t.seed)
    data.setup("fit")
    apply_memory_budget(model, config, data)
    summary = apply_reference_energies(model, config, data)
    module = MatRISModule(model, config, labels=data.labels)
    if rank_zero_only.rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text(out_dir / "config.yaml", config.to_yaml())
        n_train = len(data.train_set)
        n_val = len(data.val_set) if data.val_set is not None else 0
        notice(f"{model.num_parameters():,} parameters; {n_train} training / {n_val} validation structures; {summary}")
        if module.magmoms_dropped:
            notice(module.magmoms_dropped)

    has_val = data.val_set is not None
    ckpt_dir = out_dir / "checkpoints"
    last = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=0,
                           every_n_train_steps=max(1, t.checkpoint_every_n_steps), save_on_train_epoch_end=True)
    cbs: list[Callback] = [last, LearningRateMonitor(logging_interval="step")]
    if t.progress_bar:
        cbs.append(ProgressBar())
    if has_val:
        # saved after validation only: at a train-epoch end val/loss may not exist yet (Lightning warns then)
        cbs += [ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="val/loss", mode="min", save_top_k=1,
                                auto_insert_metric_name=False, enable_version_counter=False,
                                save_on_train_epoch_end=False),
                ExportBest(out_dir)]
    cbs += list(callbacks or [])
    # a new version directory per (resumed) segment: earlier logs are never overwritten
    loggers: list[Any] = [L.pytorch.loggers.CSVLogger(out_dir / "logs", name="csv")]
    if t.tensorboard:
        try:
            loggers.append(L.pytorch.loggers.TensorBoardLogger(out_dir / "logs", name="tensorboard"))
        except ModuleNotFoundError:
            rank_zero_info("matris: neither tensorboard nor tensorboardX is installed; CSV logs only")
    with quiet_lightning():
        return _train(config, module, data, loggers, cbs, resume, out_dir, has_val)


def _train(config, module, data, loggers, cbs, resume, out_dir, has_val) -> TrainResult:
    t = config.trainer
    ckpt_dir = out_dir / "checkpoints"
    trainer = L.Trainer(
        default_root_dir=out_dir,
        max_epochs=t.max_epochs,
        max_steps=t.max_steps,
        accelerator=t.accelerator,
        devices=_devices(t.devices),
        num_nodes=t.num_nodes,
        strategy=t.strategy,
        precision=PRECISION[t.precision],
        accumulate_grad_batches=t.accumulate_grad_batches,
        gradient_clip_val=config.optim.grad_clip,
        check_val_every_n_epoch=t.val_every_n_epochs if t.val_check_interval is None else None,
        val_check_interval=t.val_check_interval,
        log_every_n_steps=t.log_every_n_steps,
        callbacks=cbs,
        logger=loggers,
        plugins=[AtomicCheckpointIO()],
        enable_progress_bar=t.progress_bar,
        enable_model_summary=False,
        deterministic=t.deterministic,
        inference_mode=False,  # validation needs autograd for forces and stress
        use_distributed_sampler=False,  # the budget sampler shards by rank itself
        num_sanity_val_steps=0,
        limit_val_batches=None if has_val else 0,
    )
    trainer.fit(module, datamodule=data, ckpt_path=resume)
    # the final state too, so rerunning a finished run resumes at its end instead of repeating steps
    trainer.save_checkpoint(ckpt_dir / "last.ckpt", weights_only=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    if data.test_set is not None:  # the EMA weights at the end of training
        trainer.test(module, datamodule=data, ckpt_path=None, verbose=False)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")})

    last_model = out_dir / "last_model.pth.tar"
    best_model = out_dir / "best_model.pth.tar"
    if trainer.is_global_zero:
        module.eval_model.save(last_model)
        if has_val and not best_model.is_file():
            module.eval_model.save(best_model)
        if t.parity_plot:
            subset = data.val_set if has_val else data.train_set
            pred = evaluate(module.eval_model, subset, data)
            metrics.update(parity_errors(pred))
            try:
                parity_plot(pred, out_dir / "parity.png", title="validation set" if has_val else "training set")
            except MissingExtraError as exc:  # the model is trained and saved: say why there is no plot, go on
                notice(f"no parity.png: {exc}")
        write_text(out_dir / "metrics.json", json.dumps(metrics, indent=1))
    return TrainResult(out_dir, best_model if best_model.is_file() else None, last_model, metrics, module)


def evaluate(model: MatRIS, subset, data: MatRISDataModule) -> dict[str, np.ndarray]:
    """Predicted and reference energies per atom (eV/atom) and force components (eV/Å) of ``subset``."""
    from .datamodule import Collate

    model = model.eval()
    collate = Collate(subset)
    sampler = data._sampler(subset, False, 0, 1)
    out: dict[str, list] = {"e_pred": [], "e_ref": [], "f_pred": [], "f_ref": []}
    for positions in sampler:
        batch = collate(positions)
        batch = batch.to(model.device)
        res = model(batch.graph, compute_forces=True, compute_stress=False, compute_magmoms=False)
        n = batch.graph.n_atoms.to(torch.float64)
        out["e_pred"].append(res.energy_per_atom.detach().double().cpu().numpy())
        out["e_ref"].append((batch.targets.energy / n).cpu().numpy())
        out["f_pred"].append(res.forces.detach().double().cpu().numpy().reshape(-1))
        out["f_ref"].append(batch.targets.forces.double().cpu().numpy().reshape(-1))
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}


def parity_errors(pred: dict[str, np.ndarray]) -> dict[str, float]:
    """MAE of energy (meV/atom) and force components (meV/Å) over labelled entries."""
    out = {}
    for key, name in (("e", "parity/energy_mae_meV_atom"), ("f", "parity/force_mae_meV_A")):
        ok = np.isfinite(pred[f"{key}_ref"])
        if ok.any():
            out[name] = float(np.abs(pred[f"{key}_pred"][ok] - pred[f"{key}_ref"][ok]).mean() * 1000)
    return out


def parity_plot(pred: dict[str, np.ndarray], path: Path, title: str = "validation set") -> Path:
    """Predicted vs reference energies per atom and force components, as a PNG."""
    from ..extras import require

    matplotlib = require("matplotlib", "plot", "the parity plot (trainer.parity_plot)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, key, label, unit in ((axes[0], "e", "energy", "eV/atom"), (axes[1], "f", "force component", "eV/Å")):
        ref, est = pred[f"{key}_ref"], pred[f"{key}_pred"]
        ok = np.isfinite(ref)
        ref, est = ref[ok], est[ok]
        if len(ref):
            lo, hi = float(min(ref.min(), est.min())), float(max(ref.max(), est.max()))
            ax.plot([lo, hi], [lo, hi], color="0.6", lw=1)
            ax.scatter(ref, est, s=6, alpha=0.6)
            mae = np.abs(est - ref).mean()
            ax.set_title(f"{label}: MAE {mae * 1000:.1f} m{unit}")
        ax.set_xlabel(f"reference {label} ({unit})")
        ax.set_ylabel(f"MatRIS {label} ({unit})")
    fig.suptitle(f"MatRIS parity, {title}")
    fig.tight_layout()
    try:
        with atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=120)
    finally:
        plt.close(fig)
    return path


__all__ = ["fit", "TrainResult", "build_model", "apply_reference_energies", "AtomicCheckpointIO", "parity_plot",
           "evaluate"]
