"""Shared pieces of the training tests: a micro model config and EMT data made offline."""

from __future__ import annotations

from pathlib import Path

import yaml

MICRO_MODEL = {
    "num_layers": 2, "node_feat_dim": 16, "edge_feat_dim": 16, "three_body_feat_dim": 16, "mlp_hidden_dims": [16],
    "num_radial": 5, "num_angular": 5, "max_l": 2, "max_n": 2, "pairwise_cutoff": 4.5, "three_body_cutoff": 3.0,
}


def micro_config(out_dir: Path, train: list, cache_dir: Path, **sections) -> dict:
    """A config dict for a 2-block width-16 model that trains at a few steps per second on one CPU core."""
    config = {
        "model": dict(MICRO_MODEL),
        "data": {"train": [str(p) for p in train], "val_fraction": 0.0, "max_structures": 4,
                 "cache_dir": str(cache_dir)},
        "optim": {"lr": 5e-3, "weight_decay": 0.0, "warmup_steps": 2, "ema_decay": 0.9},
        "loss": {"energy_loss": "mae"},
        "trainer": {"out_dir": str(out_dir), "max_epochs": -1, "max_steps": 10, "accelerator": "cpu",
                    "devices": "1", "progress_bar": False, "tensorboard": False, "parity_plot": False,
                    "log_every_n_steps": 1, "checkpoint_every_n_steps": 2},
    }
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path
