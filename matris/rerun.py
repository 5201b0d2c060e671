"""The one rule for jobs that find their own earlier results (``md``, ``relax``, ``train``, ...).

- finished results: the job says so in one line (what it found, where) and how to start
  afresh, and returns them as they are, marked as loaded (never recomputed numbers such as
  a speed of 0 steps/s);
- unfinished results: the job resumes and says so in one line;
- ``overwrite=True`` (command line ``--overwrite``) starts afresh; it removes only the files
  the job itself writes, never the rest of the folder.

The lines go to stderr with the prefix ``matris:`` like the package's other notices.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Iterable

OVERWRITE = "overwrite=True (--overwrite)"


def notice(message: str) -> None:
    """One line on stderr: what a rerun found and what it does about it."""
    print(f"matris: {message}", file=sys.stderr, flush=True)


def remove_outputs(paths: Iterable[str | Path]) -> list[Path]:
    """Remove the given files and folders (a job's own outputs) and nothing else; returns those removed.

    Each path is removed on its own, so a folder that holds other files too must not be
    passed: name the job's files in it instead."""
    removed = []
    for path in map(Path, paths):
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            continue
        removed.append(path)
    return removed


__all__ = ["OVERWRITE", "notice", "remove_outputs"]
