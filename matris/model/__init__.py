"""The MatRIS model (spec §3–§6)."""

from .config import MatRISConfig
from .model import MatRIS, ModelOutput

__all__ = ["MatRIS", "MatRISConfig", "ModelOutput"]
