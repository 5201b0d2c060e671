"""The MatRIS model (spec §3–§6).

:class:`MatRISConfig` is plain Python; :class:`MatRIS` and :class:`ModelOutput` (torch) load on
first access, so reading a config (``matris train --help`` lists the config keys) does not
import torch.
"""

from typing import TYPE_CHECKING

from ..settings import RunOptions
from .config import MatRISConfig

if TYPE_CHECKING:  # for type checkers and the API docs; at run time see __getattr__
    from .model import MatRIS, ModelOutput

__all__ = ["MatRIS", "MatRISConfig", "ModelOutput", "RunOptions"]


def __getattr__(name: str):
    if name in ("MatRIS", "ModelOutput"):
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
