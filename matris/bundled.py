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
