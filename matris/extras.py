"""Optional dependencies: the extras of the ``matris-mlip`` distribution and one clear error
when the package a feature needs is missing.

The core (prediction, the ASE calculator, relaxation, MD) needs torch, numpy, ase and vesin;
everything else is an extra (pyproject.toml lists what each one installs)::

    pip install 'matris-mlip[train]'     # Lightning training and fine-tuning
    pip install 'matris-mlip[all]'       # everything
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ._version import DISTRIBUTION
from .errors import MissingExtraError


def install_hint(extra: str) -> str:
    """The pip command that installs ``extra``: ``pip install 'matris-mlip[extra]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def require(module: str, extra: str, feature: str, package: str | None = None) -> ModuleType:
    """Import ``module`` (e.g. ``"lightning.pytorch"``) for ``feature`` (e.g. "training"), or
    raise :class:`MissingExtraError` in one line that names the package and the extra.

    ``package`` is the name pip knows the module by, where it differs (``ase-db-backends``
    for ``ase_db_backends``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        name = package or module.split(".")[0]
        missing = (getattr(exc, "name", None) or module).split(".")[0]
        if missing not in (module.split(".")[0], name):
            # the package is there but one of its own dependencies is not: the extra reinstalls both
            what = f"the {name} package, whose dependency {missing} is not installed"
        else:
            what = f"the {name} package, which is not installed"
        raise MissingExtraError(f"{feature} needs {what}: {install_hint(extra)}") from None


__all__ = ["DISTRIBUTION", "install_hint", "require"]
