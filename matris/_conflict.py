"""The official MatRIS project on PyPI (distribution ``matris``) installs a ``matris/`` folder
too: installed in the same environment as ``matris-mlip``, the two overwrite each other's files.

:func:`check` finds that case without importing anything heavy (no ``importlib.metadata``,
which alone costs ~20 ms): it lists the folders of ``sys.path`` for a ``matris-*.dist-info``
and reads its author. Old installs of this package under the name ``matris`` (0.1.0, author
"matris developers") are not the official project and pass.
"""

from __future__ import annotations

import os
import re
import sys

#: the authors this package has published under; any other ``matris`` distribution is the official one
OURS = ("matris developers", "the matris developers")
FIX = "pip uninstall -y matris matris-mlip && pip install matris-mlip"

# matris-1.0.0.dist-info (not matris_mlip-0.2.0.dist-info: wheel names normalise '-' to '_')
_DIST_INFO = re.compile(r"^matris-(\d[^-]*)\.dist-info$", re.IGNORECASE)


def official_distribution(paths: list[str] | None = None) -> tuple[str, str] | None:
    """(version, folder of its dist-info) of the official ``matris`` distribution on ``paths``
    (default ``sys.path``), or None when it is not installed."""
    for entry in sys.path if paths is None else paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # zip files, missing folders
            continue
        for name in names:
            match = _DIST_INFO.match(name)
            if match and _author(os.path.join(entry or ".", name, "METADATA")) not in OURS:
                return match.group(1), os.path.join(entry or ".", name)
    return None


def _author(metadata: str) -> str:
    """The ``Author:`` header of a METADATA file ("" when it has none or cannot be read)."""
    try:
        with open(metadata, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():  # the headers end at the first blank line
                    break
                if line.lower().startswith("author:"):
                    return line.split(":", 1)[1].strip().lower()
    except OSError:
        pass
    return ""


def check() -> None:
    """Raise ImportError (one line: the problem and the fix) when the official ``matris``
    distribution is installed next to this package."""
    found = official_distribution()
    if found is not None:
        version, where = found
        raise ImportError(
            f"the official MatRIS package 'matris' {version} ({where}) is installed in this environment next to "
            f"'matris-mlip'; both install the folder matris/ and overwrite each other's files: {FIX}"
        )
