"""Lightning for the training modules, imported in one place: without it (the ``train`` extra
is not installed) the import fails in one line that names the extra."""

from ..extras import require

L = require("lightning", "train", "training (matris train, finetune, data build)")

from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint, TQDMProgressBar  # noqa: E402
from lightning.pytorch.plugins.io import TorchCheckpointIO  # noqa: E402
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only  # noqa: E402

__all__ = ["L", "Callback", "LearningRateMonitor", "ModelCheckpoint", "TQDMProgressBar", "TorchCheckpointIO",
           "rank_zero_info", "rank_zero_only"]
