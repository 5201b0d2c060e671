"""Training and fine-tuning of MatRIS with Lightning (``matris train``, ``matris finetune``).

    from matris.train import TrainConfig, fit
    config = TrainConfig.from_yaml("examples/configs/tiny.yaml")
    config.override("trainer.max_steps", 100)
    result = fit(config)          # result.best_model: a published-format checkpoint
"""

from typing import TYPE_CHECKING

from .config import TrainConfig

if TYPE_CHECKING:  # for type checkers and the API docs; at run time see __getattr__
    from .loss import compute_loss
    from .reference import fit_reference_energies
    from .run import TrainResult, fit

__all__ = ["TrainConfig", "fit", "TrainResult", "compute_loss", "fit_reference_energies"]


_LAZY = {"fit": ".run", "TrainResult": ".run", "compute_loss": ".loss", "fit_reference_energies": ".reference"}


def __getattr__(name: str):
    # Lightning (and torch) are imported with the training loop, not with the config: `matris
    # train --help` reads the config's keys and should not wait seconds for them.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
