"""Training and fine-tuning of MatRIS with Lightning (``matris train``, ``matris finetune``).

    from matris.train import TrainConfig, fit
    config = TrainConfig.from_yaml("examples/configs/tiny.yaml")
    config.override("trainer.max_steps", 100)
    result = fit(config)          # result.best_model: a published-format checkpoint
"""

from typing import TYPE_CHECKING

from .config import TrainConfig
from .loss import compute_loss
from .reference import fit_reference_energies

if TYPE_CHECKING:  # for type checkers and the API docs; at run time see __getattr__
    from .run import TrainResult, fit

__all__ = ["TrainConfig", "fit", "TrainResult", "compute_loss", "fit_reference_energies"]


def __getattr__(name: str):
    # Lightning is imported with the training loop, not with the config: `matris --help` and
    # `matris train --help` read the config's keys and should not wait seconds for Lightning.
    if name in ("fit", "TrainResult"):
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
