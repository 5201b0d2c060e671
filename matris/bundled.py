"""Files shipped inside the package: a demo checkpoint and an example structure.

The demo checkpoint is a 2-block, width-32 MatRIS in the published format with random
(perturbed) weights, the one the parity fixtures were computed with: it exercises every
code path but its numbers are not physics. For science, load a published checkpoint.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
DEMO_CHECKPOINT = ASSETS / "matris-demo-tiny.pth.tar"
EXAMPLE_STRUCTURE = ASSETS / "example_Si8.extxyz"
BUNDLED_NAMES = ("demo", "matris-demo-tiny")
