"""Files shipped inside the package: the bundled model, its model card and an example structure.

The bundled model (``matris-demo``, alias ``demo``) is a small MatRIS (3 blocks, width 48,
0.46 M parameters) distilled from CHGNet 0.3.0 with this package's own training pipeline;
``MODEL_CARD`` says how it was made and how close it is to its teacher. It is the default
wherever no model is named: for demos, tests and quick starts. For science use matris-10m-oam.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
DEMO_CHECKPOINT = ASSETS / "matris-demo.pth.tar"
MODEL_CARD = ASSETS / "matris-demo.md"
EXAMPLE_STRUCTURE = ASSETS / "example_Si8.extxyz"
BUNDLED_NAMES = ("demo", "matris-demo")

DEFAULT_MODEL_NOTICE = (
    "no model named: using the bundled demo model matris-demo, a small model distilled from CHGNet for demos "
    f"and tests, not for science (its model card, with its errors: {MODEL_CARD}). Load a published model with "
    "MatRIS.load('matris-10m-oam') or --model matris-10m-oam; 'matris models' lists them all."
)
# Shown at most once per process (per Python session, per `matris` command run); the CLI turns
# it into a plain stderr line.
_notice = {"shown": False, "stderr": False}


def announce_default_model() -> None:
    """Say, once per process, that the bundled demo model stands in for an unnamed one: a
    ``UserWarning`` in Python, one plain line on stderr in the ``matris`` command. Later
    loads without a model in the same process say nothing."""
    if _notice["shown"]:
        return
    _notice["shown"] = True
    if _notice["stderr"]:
        from . import log

        log.info(f"note: {DEFAULT_MODEL_NOTICE}")
    else:
        import warnings

        warnings.warn(DEFAULT_MODEL_NOTICE, UserWarning, stacklevel=3)


def notices_to_stderr() -> None:
    """The ``matris`` command prints notices as plain stderr lines instead of warnings."""
    _notice["stderr"] = True
