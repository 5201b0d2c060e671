"""Training and fine-tuning of MatRIS with Lightning (``matris train``, ``matris finetune``).

    from matris.train import TrainConfig, fit
    config = TrainConfig.from_yaml("examples/configs/tiny.yaml")
    config.override("trainer.max_steps", 100)
    result = fit(config)          # result.best_model: a published-format checkpoint
"""

from .config import TrainConfig
from .loss import compute_loss
from .reference import fit_reference_energies
from .run import TrainResult, fit

__all__ = ["TrainConfig", "fit", "TrainResult", "compute_loss", "fit_reference_energies"]
