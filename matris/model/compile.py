"""The compilation defaults of the official MatRIS package, applied on import (``import
matris.model.compile``, as its scripts do) and by :meth:`matris.MatRIS.compile`.

Dynamic-shape compiled graphs treat equal sizes and storage offsets as independent (no "duck
shapes"), so an MD step in which two counts happen to coincide (atoms and angles of one chunk, two
index offsets) reuses the compiled graph instead of making a new one.
"""

from __future__ import annotations


def apply_defaults() -> None:
    """Set the process-wide ``torch.compile`` defaults above (idempotent)."""
    from torch.fx.experimental import _config as symbolic_config

    symbolic_config.use_duck_shape = False


apply_defaults()

__all__ = ["apply_defaults"]
