"""Training configuration: typed sections, YAML files, and ``--section.key value`` overrides.

A run is described by one :class:`TrainConfig`; every key has a type, a default and a help
text, so the command line can list, check and override all of them. YAML files use the same
nesting::

    model: {num_layers: 2, node_feat_dim: 32}
    data: {train: [train.extxyz], val_fraction: 0.1, max_atoms: 512}
    optim: {lr: 1.0e-3}
    trainer: {max_steps: 200, out_dir: runs/tiny}
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MatRISInputError
from ..model.config import MatRISConfig
from ..settings import parse_size


def _f(default: Any, help: str, **kw: Any):
    """A dataclass field with a help text (mutable defaults through a factory)."""
    if isinstance(default, (list, dict, tuple)) and not isinstance(default, tuple):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


_LABEL_NAMES = ("energy", "forces", "stress", "magmoms")
_READER_KEYS = ("energy_key", "forces_key", "stress_key", "magmoms_key", "material_id_key", "stress_unit",
                "mptrj_energy_key")


@dataclass
class DatasetConfig:
    """One dataset of a mixture (``data.datasets``); unset reader keys take the ``data`` section's.

    YAML::

        data:
          datasets:
            - {name: salex, train: [salex/train], val: [salex/val], weight: 0.5, labels: [energy, forces, stress]}
            - {name: mptrj, train: [MPtrj_2022.9_full.json], val_fraction: 0.02, weight: 0.5,
               reference_energy: fit}
    """

    name: str = ""
    train: list = field(default_factory=list)
    val: list = field(default_factory=list)
    test: list = field(default_factory=list)
    weight: float = 1.0
    val_fraction: typing.Optional[float] = None
    test_fraction: typing.Optional[float] = None
    split_by: typing.Optional[str] = None
    labels: list = field(default_factory=lambda: list(_LABEL_NAMES))
    reference_energy: typing.Optional[str] = None
    energy_key: typing.Optional[str] = None
    forces_key: typing.Optional[str] = None
    stress_key: typing.Optional[str] = None
    magmoms_key: typing.Optional[str] = None
    material_id_key: typing.Optional[str] = None
    stress_unit: typing.Optional[str] = None
    mptrj_energy_key: typing.Optional[str] = None

    HELP = {
        "name": "a short name (logs, per-dataset reference energies)",
        "train": "files, directories or globs of this dataset's training data",
        "val": "validation files (empty: split val_fraction off train)",
        "test": "test files (empty: split test_fraction off train)",
        "weight": "sampling weight: the share of training draws is weight / sum of weights",
        "val_fraction": "default: data.val_fraction", "test_fraction": "default: data.test_fraction",
        "split_by": "default: data.split_by",
        "labels": "labels trained on (others masked): any of energy, forces, stress, magmoms",
        "reference_energy": "null: energies as stored; 'fit' or a JSON file {symbol: eV/atom}: per-element "
                            "energies R_d of this dataset; energies are moved to the first dataset's convention, "
                            "E - sum_i (R_d - R_1)(Z_i)",
    }

    @classmethod
    def from_value(cls, value: Any, where: str) -> "DatasetConfig":
        if isinstance(value, DatasetConfig):
            return value
        if not isinstance(value, dict):
            raise MatRISInputError(f"{where} must be a mapping (name, train, weight, ...), got {value!r}")
        parsed = _parse_keys(cls, value, where, "", "config",
                             f"dataset keys: {sorted(f.name for f in dataclasses.fields(cls))}")
        d = cls(**parsed)
        d.validate(where)
        return d

    def validate(self, where: str) -> None:
        problems = []
        if not self.name:
            problems.append("give it a name")
        if not self.train:
            problems.append("give its training files (train)")
        if not (self.weight >= 0 and self.weight != float("inf")):
            problems.append(f"weight must be >= 0, got {self.weight}")
        bad = [x for x in self.labels if x not in _LABEL_NAMES]
        if bad or not self.labels:
            problems.append(f"labels must be a non-empty list of {list(_LABEL_NAMES)}, got {self.labels}")
        if self.split_by not in (None, "structure", "material"):
            problems.append("split_by must be 'structure' or 'material'")
        if self.stress_unit not in (None, "eV/A3", "GPa", "kbar"):
            problems.append("stress_unit must be eV/A3, GPa or kbar")
        if problems:
            raise MatRISInputError(f"{where} ({self.name or 'unnamed'}): " + "; ".join(problems))


@dataclass
class DataConfig:
    """Where the structures come from and how they are batched."""

    train: list = _f([], "training data: files, directories or globs (extxyz or any ASE-readable file, ASE .db, "
                     ".aselmdb, MPtrj or MatPES .json/.json.gz)")
    val: list = _f([], "validation files; empty: split val_fraction off the training files")
    test: list = _f([], "test files; empty: split test_fraction off the training files")
    val_fraction: float = _f(0.05, "fraction of the training data held out for validation (when val is empty)")
    test_fraction: float = _f(0.0, "fraction of the training data held out for testing (when test is empty)")
    split_by: str = _f("structure", "split unit: 'structure', or 'material' (all frames of a material id together)",
                       choices=("structure", "material"))
    split_seed: int = _f(0, "seed of the train/val/test split")
    energy_key: typing.Optional[str] = _f(None, "ASE files: info key of the total energy (eV); default: stored results")
    forces_key: typing.Optional[str] = _f(None, "ASE files: arrays key of the forces (eV/Å); default: stored results")
    stress_key: typing.Optional[str] = _f(None, "ASE files: info key of the stress; default: stored results")
    magmoms_key: typing.Optional[str] = _f(None, "ASE files: arrays key of magnetic moments (μB); "
                                           "default: stored results")
    material_id_key: typing.Optional[str] = _f(None, "ASE files/db: info key of a material id (for split_by=material)")
    stress_unit: str = _f("eV/A3", "unit of stress read from ASE files (ASE sign convention)",
                          choices=("eV/A3", "GPa", "kbar"))
    mptrj_energy_key: str = _f("corrected_total_energy", "MPtrj files: which energy to train on")
    cache_dir: typing.Optional[str] = _f(None, "graph cache directory; "
                                         "default $MATRIS_CACHE/graphs or ~/.cache/matris/graphs")
    cache_angles: bool = _f(True, "store the line graph in the cache too (fastest); false stores bonds only and "
                            "rebuilds angles per batch (about 3x smaller cache, for MPtrj-sized data)")
    max_structures: typing.Optional[int] = _f(32, "batch budget: structures per batch (per device)")
    max_atoms: typing.Optional[int] = _f(None, "batch budget: atoms per batch (per device)")
    max_bonds: typing.Optional[int] = _f(None, "batch budget: bonds per batch (per device)")
    max_angles: typing.Optional[int] = _f(None, "batch budget: angles per batch (per device)")
    max_memory: typing.Optional[str] = _f(None, "batch budget by memory: 'auto' (what the device has free) or a "
                                               "size like '20 GB' per device, turned into a budget by the model's "
                                               "memory model (see matris finetune --dry-run)")
    num_workers: int = _f(0, "data-loading worker processes per device")
    datasets: list = _f([], "a mixture instead of train/val/test: a list of datasets {name, train, val, test, "
                        "weight, labels, reference_energy, val_fraction, split_by, reader keys}; see the docs")
    epoch_size: typing.Optional[int] = _f(None, "mixtures: structures drawn per epoch (default: all training "
                                               "structures)")
    on_error: str = _f("raise", "a bad record (unreadable, invalid, no energy, non-finite labels): 'raise' an "
                       "error naming file and record, or 'skip' it (counted and reported)", choices=("raise", "skip"))
    build_workers: typing.Optional[int] = _f(None, "processes building the graph cache (default: the CPUs "
                                                  "available, at most 32)")
    shard_size: int = _f(50000, "structures per cache shard: the unit of parallel build and of resumption")
    shuffle: bool = _f(True, "shuffle the training data every epoch (seeded by trainer.seed and the epoch)")


@dataclass
class LossConfig:
    """loss = w_e·ℓ(E/atom) + w_f·mean‖ΔF‖ + w_s·MAE(σ, GPa) + w_m·MAE(m, μB); missing labels are masked."""

    energy_weight: float = _f(5.0, "weight w_e of the energy-per-atom term")
    force_weight: float = _f(5.0, "weight w_f of the force term (mean L2 norm of the error, eV/Å)")
    stress_weight: float = _f(0.1, "weight w_s of the stress term (MAE, GPa)")
    magmom_weight: float = _f(0.1, "weight w_m of the magnetic-moment term (MAE, μB)")
    energy_loss: str = _f("huber", "energy term: 'huber' or 'mae' of the energy per atom", choices=("huber", "mae"))
    huber_delta: float = _f(0.1, "Huber δ, eV/atom")


@dataclass
class OptimConfig:
    """AdamW with linear warm-up and a cosine (or constant) schedule."""

    lr: float = _f(3e-4, "peak learning rate")
    weight_decay: float = _f(1e-2, "AdamW weight decay (not applied to biases, norms and embeddings)")
    betas: list = _f([0.9, 0.999], "AdamW betas")
    warmup_steps: typing.Optional[int] = _f(None, "optimizer steps of linear warm-up; "
                                            "default: warmup_fraction of all steps")
    warmup_fraction: float = _f(0.05, "warm-up as a fraction of all optimizer steps (when warmup_steps is not set)")
    schedule: str = _f("cosine", "after warm-up: 'cosine' decay to min_lr_ratio·lr, or 'constant'",
                       choices=("cosine", "constant"))
    min_lr_ratio: float = _f(0.01, "final learning rate of the cosine schedule, as a fraction of lr")
    grad_clip: typing.Optional[float] = _f(10.0, "clip the gradient norm to this value (null: no clipping)")
    ema_decay: typing.Optional[float] = _f(0.999, "decay of the exponential moving average of the weights used for "
                                              "validation and export (null or 0: no EMA)")


@dataclass
class ReferenceConfig:
    """Per-element reference energies (eV/atom), stored in the checkpoint (``reference_energy.fc.weight``)."""

    mode: str = _f("auto", "'auto': 'refit' when fine-tuning, else 'fit'; 'refit' (fine-tuning): least squares of "
                   "(E − the pretrained model's E without its references)/atom on composition over the training "
                   "set, elements absent from it keep the checkpoint's values; 'fit': least squares of E/atom on "
                   "composition (from scratch); 'keep': those of the starting checkpoint; 'none': no reference "
                   "term; or a JSON file {symbol: eV/atom} or a checkpoint path to copy them from")


@dataclass
class FinetuneConfig:
    """Start from published weights (used by ``matris finetune``)."""

    from_checkpoint: typing.Optional[str] = _f(None, "checkpoint path (published format) or model name to start from")
    freeze_embeddings: bool = _f(False, "freeze the atom, bond and angle embeddings")
    freeze_blocks: int = _f(0, "freeze the first k interaction blocks")
    backbone_lr: typing.Optional[float] = _f(None, "learning rate of embeddings and blocks (default: optim.lr); "
                                                    "the readout always uses optim.lr")


@dataclass
class TrainerConfig:
    """Lightning Trainer settings, outputs and resumption."""

    out_dir: str = _f("runs/matris", "output directory: checkpoints, exported models, logs, plots")
    max_epochs: int = _f(100, "number of epochs (-1: no limit; then set max_steps)")
    max_steps: int = _f(-1, "number of optimizer steps (-1: no limit)")
    accelerator: str = _f("auto", "'cpu', 'gpu' or 'auto'")
    devices: str = _f("auto", "devices per node: a number, a list like '0,1', or 'auto'")
    num_nodes: int = _f(1, "number of nodes (multi-node DDP via SLURM or torchrun)")
    strategy: str = _f("auto", "'auto', 'ddp', 'ddp_spawn' ... (DDP is chosen automatically for several devices)")
    precision: str = _f("32", "'32', 'tf32' (float32 with TF32 matmuls on GPU) or '64'; half precision "
                        "(bf16/fp16) is not offered: forces and stress are derivatives that need float32 or float64, "
                        "and the fused kernels take only those", choices=("32", "tf32", "64"))
    accumulate_grad_batches: int = _f(1, "batches per optimizer step")
    val_every_n_epochs: int = _f(1, "validate every n epochs")
    val_check_interval: typing.Optional[int] = _f(None, "validate every n training batches instead (long epochs)")
    log_every_n_steps: int = _f(10, "log training metrics every n steps")
    checkpoint_every_n_steps: int = _f(100, "write the resumable last.ckpt every n optimizer steps (and every epoch)")
    resume: str = _f("auto", "'auto': continue from out_dir/checkpoints/last.ckpt if present; 'never'; or a .ckpt path")
    seed: int = _f(0, "seed of weights initialisation and shuffling")
    progress_bar: bool = _f(True, "show a progress bar")
    tensorboard: bool = _f(True, "write TensorBoard logs besides the CSV log")
    parity_plot: bool = _f(True, "at the end, plot predicted vs reference energies and forces of the validation set")
    deterministic: bool = _f(False, "use deterministic algorithms (slower on GPU)")
    recompute: typing.Optional[str] = _f(None, "what the backward passes of a step on forces recompute instead of "
                                               "keeping (exact either way): 'none' (fastest), 'blocks' (each "
                                               "interaction block: a sixth of the memory for the published 10M "
                                               "models, slower), 'rows' (as 'blocks', and inside each block the work "
                                               "per angle by row chunks: least memory); null: for models of 4 blocks "
                                               "or more, per batch the first of none, blocks, rows whose memory fits "
                                               "the batch's budget")


@dataclass
class TrainConfig:
    """Everything a training or fine-tuning run needs; see ``matris train --help``."""

    model: MatRISConfig = field(default_factory=lambda: MatRISConfig(reference_energy=None),
                                metadata={"help": "model hyper-parameters (ignored when fine-tuning)"})
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    reference_energy: ReferenceConfig = field(default_factory=ReferenceConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        out = {}
        for sec in dataclasses.fields(self):
            value = getattr(self, sec.name)
            out[sec.name] = value.to_dict() if isinstance(value, MatRISConfig) else dataclasses.asdict(value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, source: str = "config") -> "TrainConfig":
        data = dict(data or {})
        sections = {f.name: f for f in dataclasses.fields(cls)}
        unknown = [k for k in data if k not in sections]
        if unknown:
            what = "section" if len(unknown) == 1 else "sections"
            raise MatRISInputError(f"{source}: unknown {what} {unknown}{_suggest(unknown[0], sections)}; "
                                   f"valid sections: {sorted(sections)}")
        kwargs = {}
        for name, f in sections.items():
            kind = _section_types()[name]
            values = data.get(name) or {}
            if not isinstance(values, dict):
                raise MatRISInputError(f"{source}: section '{name}' must be a mapping of keys to values")
            parsed = _parse_keys(kind, values, source, f"{name}.", source, "see 'matris train --help' for all keys")
            if kind is MatRISConfig:
                base = {"reference_energy": None}
                base.update(parsed)
                try:
                    kwargs[name] = MatRISConfig(**base)
                except ValueError as exc:
                    raise MatRISInputError(f"{source}: {exc}") from exc
            else:
                kwargs[name] = kind(**parsed)
        config = cls(**kwargs)
        config.validate(source)
        return config

    def validate(self, source: str = "config") -> None:
        d, t = self.data, self.trainer
        problems = []
        if not 0 <= d.val_fraction < 1 or not 0 <= d.test_fraction < 1 or d.val_fraction + d.test_fraction >= 1:
            problems.append("data.val_fraction and data.test_fraction must be in [0, 1) and sum to less than 1")
        if t.max_epochs < 0 and t.max_steps < 0:
            problems.append("set trainer.max_epochs or trainer.max_steps (both are unlimited)")
        if d.datasets:
            d.datasets = [DatasetConfig.from_value(x, f"data.datasets[{k}]") for k, x in enumerate(d.datasets)]
            names = [x.name for x in d.datasets]
            if len(set(names)) != len(names):
                problems.append(f"data.datasets names must be unique, got {names}")
            if d.train or d.val or d.test:
                problems.append("give data.datasets or data.train/val/test, not both (put the files in a dataset)")
            if sum(x.weight for x in d.datasets) <= 0:
                problems.append("at least one of data.datasets needs a weight > 0")
            if any(x.reference_energy for x in d.datasets[1:]) and not d.datasets[0].reference_energy:
                problems.append("per-dataset reference energies move energies to the first dataset's convention; "
                                f"give data.datasets[0] ({d.datasets[0].name}) a reference_energy too")
        elif d.epoch_size is not None:
            problems.append("data.epoch_size applies to a mixture (data.datasets)")
        if d.build_workers is not None and d.build_workers < 1:
            problems.append("data.build_workers must be >= 1")
        if d.shard_size < 1:
            problems.append("data.shard_size must be >= 1")
        if all(getattr(d, k) is None for k in ("max_structures", "max_atoms", "max_bonds", "max_angles",
                                                "max_memory")):
            problems.append("set at least one batch budget (data.max_structures, max_atoms, max_bonds, max_angles "
                            "or max_memory)")
        if d.max_memory is not None:
            try:
                parse_size(d.max_memory, "data.max_memory")
            except ValueError as exc:
                problems.append(str(exc))
        if self.trainer.recompute == "steps":
            problems.append("trainer.recompute 'steps' was removed in matris-mlip 0.3: 'rows' needs less "
                            "memory than it did; set trainer.recompute: rows (or null)")
        elif self.trainer.recompute not in (None, "none", "blocks", "rows"):
            problems.append(f"trainer.recompute must be 'none', 'blocks', 'rows' or null (automatic), "
                            f"got {self.trainer.recompute!r}")
        for k in ("energy_weight", "force_weight", "stress_weight", "magmom_weight"):
            if getattr(self.loss, k) < 0:
                problems.append(f"loss.{k} must be >= 0")
        if self.optim.lr <= 0:
            problems.append("optim.lr must be > 0")
        if self.finetune.freeze_blocks < 0:
            problems.append("finetune.freeze_blocks must be >= 0")
        if problems:
            raise MatRISInputError(f"{source}: " + "; ".join(problems))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "TrainConfig":
        """A config from a YAML file, or from a published recipe by name (``tiny``,
        ``matris-10m-oam``: :mod:`matris.recipes`); data paths in it are relative to the file."""
        from ..recipes import find

        path = find(path)
        yaml = _yaml("reading a training config")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise MatRISInputError(f"{path} is not valid YAML: {exc}") from exc
        if data is not None and not isinstance(data, dict):
            raise MatRISInputError(f"{path}: the top level must be a mapping of sections (model, data, ...)")
        config = cls.from_dict(data, source=str(path))
        # data paths in a config file are relative to the file, so a config and its data move together;
        # what each came from is kept for check_data_paths' message
        config._config_paths = {}

        def rel(paths: list) -> list:
            out = []
            for p in paths:
                if not Path(p).is_absolute():
                    config._config_paths[str(path.parent / p)] = (str(p), path)
                    p = str(path.parent / p)
                out.append(p)
            return out

        for key in ("train", "val", "test"):
            setattr(config.data, key, rel(getattr(config.data, key)))
        for ds in config.data.datasets:
            ds.train, ds.val, ds.test = rel(ds.train), rel(ds.val), rel(ds.test)
            if ds.reference_energy not in (None, "fit"):
                ds.reference_energy = rel([ds.reference_energy])[0]
        return config

    def check_data_paths(self) -> None:
        """Every data path that names a file or folder (not a glob pattern) exists; else a
        FileNotFoundError that says what a relative path was resolved against and the absolute
        path tried: the config file's folder for paths from a config file, the current folder
        for paths given on the command line or in Python."""
        from_file = getattr(self, "_config_paths", {})
        groups = [(f"data.{k}", getattr(self.data, k)) for k in ("train", "val", "test")]
        groups += [(f"data.datasets[{d.name}].{k}", getattr(d, k)) for d in self.data.datasets
                   for k in ("train", "val", "test")]
        for key, paths in groups:
            for text in paths:
                text = str(text)
                if any(c in text for c in "*?[") or Path(text).expanduser().exists():
                    continue
                tried = Path(text).expanduser().resolve()
                if text in from_file:
                    original, config_file = from_file[text]
                    rule = (f"relative paths in a config file are resolved against the config file's folder "
                            f"({config_file.parent.resolve()})")
                    fix = ("give an absolute path or one relative to that folder, or copy a recipe together with "
                           "its data: matris recipes --copy NAME DIR")
                elif Path(text).is_absolute():
                    original, rule, fix = text, "", "check the path"
                else:
                    original = text
                    rule = ("relative paths given on the command line are resolved against the current folder "
                            f"({Path.cwd()})")
                    fix = "give an absolute path, or run from the folder the path is relative to"
                raise FileNotFoundError(f"{key}: data file {original!r} does not exist" +
                                        (f": {rule}, so {tried} was tried" if rule else f" ({tried})") + f"; {fix}")

    def to_yaml(self) -> str:
        yaml = _yaml("writing a training config")
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def override(self, key: str, value: Any) -> None:
        """Set ``section.key`` from a command-line string or a Python value."""
        section, _, name = key.partition(".")
        kinds = _section_types()
        if section not in kinds or not name:
            raise MatRISInputError(f"unknown config key '{key}'{_suggest(key, _all_keys())}")
        known = {f.name: f for f in dataclasses.fields(kinds[section])}
        if name not in known:
            raise MatRISInputError(f"unknown config key '{key}'{_suggest(key, _all_keys())}")
        parsed = _coerce(_parse_cli(value, known[name]), known[name], key, "command line")
        if kinds[section] is MatRISConfig:
            values = self.model.to_dict()
            values[name] = parsed
            try:
                self.model = MatRISConfig(**values)
            except ValueError as exc:
                raise MatRISInputError(str(exc)) from exc
        else:
            setattr(getattr(self, section), name, parsed)


def _parse_keys(kind: type, values: dict, where: str, prefix: str, source: str, hint: str) -> dict[str, Any]:
    """``values`` checked against the fields of dataclass ``kind`` and coerced to their types."""
    known = {x.name: x for x in dataclasses.fields(kind)}
    bad = [k for k in values if k not in known]
    if bad:
        raise MatRISInputError(f"{where}: unknown key '{prefix}{bad[0]}'{_suggest(bad[0], known)}; {hint}")
    return {k: _coerce(v, known[k], f"{prefix}{k}" if prefix else f"{where}.{k}", source) for k, v in values.items()}


def _section_types() -> dict[str, type]:
    return {"model": MatRISConfig, "data": DataConfig, "loss": LossConfig, "optim": OptimConfig,
            "reference_energy": ReferenceConfig, "finetune": FinetuneConfig, "trainer": TrainerConfig}


def _all_keys() -> list[str]:
    return [f"{s}.{f.name}" for s, kind in _section_types().items() for f in dataclasses.fields(kind)]


def iter_keys():
    """``(section.key, type name, default, help, choices)`` of every key, for ``--help``."""
    defaults = TrainConfig()
    model_help = {
        "num_layers": "number of interaction blocks", "node_feat_dim": "atom feature width d_n",
        "edge_feat_dim": "bond feature width d_e", "three_body_feat_dim": "angle feature width d_t",
        "mlp_hidden_dims": "hidden widths of the energy head", "dropout": "dropout probability in the readout heads",
        "use_bias": "biases in the Φ layers", "distance_expansion": "radial basis: 'Bessel' or 'Gaussian'",
        "three_body_expansion": "angle basis: 'SH' (spherical harmonics) or 'Fourier'",
        "num_radial": "radial basis size", "num_angular": "Fourier angle basis size (odd; = num_radial)",
        "max_l": "SH basis: number of l values (1-4)", "max_n": "SH basis: number of n values (1-4)",
        "envelope_exponent": "exponent p of the smooth cutoff envelope",
        "graph_conv_mlp": "Φ type: 'GateMLP' or 'MLP'",
        "activation_type": "activation: relu, silu, gelu, softplus, sigmoid or tanh",
        "norm_type": "normalisation: 'rms' or 'layer'", "pairwise_cutoff": "atom-graph cutoff r_c, Å",
        "three_body_cutoff": "line-graph cutoff r_3, Å",
        "use_smoothed_for_delta_edge": "use the smoothed bond basis for the bond update",
        "learnable_basis": "train the basis frequencies", "is_intensive": "energy head predicts energy per atom",
        "is_conservation": "forces and stress as derivatives of the energy (must be true)",
        "reference_energy": "name of the reference-energy set (set by the reference_energy section)",
    }
    for section, kind in _section_types().items():
        for f in dataclasses.fields(kind):
            default = getattr(getattr(defaults, section), f.name)
            help_text = f.metadata.get("help") or model_help.get(f.name, "model hyper-parameter (spec §1)")
            yield f"{section}.{f.name}", _type_name(f), default, help_text, f.metadata.get("choices")


def _type_name(f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return str(t).replace("typing.", "")


def _suggest(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _yaml(feature: str):
    """The yaml module (PyYAML, installed with the train and data extras)."""
    from ..extras import require

    return require("yaml", "train", feature, package="pyyaml")


def _parse_cli(value: Any, f: dataclasses.Field) -> Any:
    """Command-line strings are read as YAML scalars/lists: 1e-3, true, null, [1, 2]."""
    if not isinstance(value, str):
        return value
    yaml = _yaml("reading command-line overrides")
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    base, _ = _base_type(_type_name(f))
    if base in ("list", "tuple") and isinstance(parsed, str):
        return [p for p in parsed.split(",") if p]
    if base == "str" and parsed is not None and not isinstance(parsed, str):
        return value  # keep '32' or '0,1' as given
    return parsed


def _base_type(tname: str) -> tuple[str, bool]:
    """('int', optional?) from 'Optional[int]', 'int | None', 'tuple[int, ...]' ..."""
    optional = tname.startswith("Optional[") or tname.endswith("| None")
    if tname.startswith("Optional["):
        tname = tname[len("Optional["):-1]
    tname = tname.replace("| None", "").strip()
    for base in ("list", "tuple", "bool", "int", "float", "str"):
        if tname.startswith(base):
            return base, optional
    return tname, optional


def _coerce(value: Any, f: dataclasses.Field, key: str, source: str) -> Any:
    base, optional = _base_type(_type_name(f))
    if value is None:
        if optional:
            return None
        raise MatRISInputError(f"{source}: {key} cannot be null")
    try:
        if base == "float":
            if isinstance(value, bool):
                raise ValueError("not a number")
            value = float(value)
        elif base == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError("not an integer")
            value = int(value)
        elif base == "bool":
            if not isinstance(value, bool):
                raise ValueError("not true/false")
        elif base in ("list", "tuple"):
            value = [value] if isinstance(value, (str, int, float)) else list(value)
        elif base == "str":
            value = str(value)
    except (TypeError, ValueError) as exc:
        raise MatRISInputError(f"{source}: {key} = {value!r}: expected {_type_name(f)} ({exc})") from exc
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise MatRISInputError(f"{source}: {key} = {value!r}; choose one of {list(choices)}")
    return value


__all__ = ["TrainConfig", "DataConfig", "DatasetConfig", "LossConfig", "OptimConfig", "ReferenceConfig",
           "FinetuneConfig", "TrainerConfig", "iter_keys"]

