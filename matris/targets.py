"""What a model was trained to predict: ``"efsm"`` (energy, forces, stress, magnetic moments)
or ``"efs"`` (no magnetic moments: the magmom head of such a checkpoint is untrained).

Forces and stress are derivatives of the energy, so every model predicts ``e``, ``f`` and
``s``; the only optional target is ``m``. Kept free of torch: the registry uses it too.
"""

from __future__ import annotations

from .errors import MatRISInputError

TARGETS = ("efs", "efsm")
DEFAULT_TARGETS = "efsm"


def normalize_targets(targets: str, source: str = "targets") -> str:
    """``"efs"`` or ``"efsm"`` from any order, case and separators (``"e,f,s,m"``, ``"EFSM"``)."""
    letters = set(str(targets).lower()) - {",", " ", "_", "-"}
    for name in TARGETS:
        if letters == set(name):
            return name
    raise MatRISInputError(f"{source}: targets {targets!r} is not supported; use 'efs' (energy, forces, stress) or "
                           "'efsm' (and magnetic moments)")


__all__ = ["TARGETS", "DEFAULT_TARGETS", "normalize_targets"]
