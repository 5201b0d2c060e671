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

import contextlib
import contextvars
import shutil
from pathlib import Path
from typing import Iterable, Iterator

from . import log

# Whether the messages speak to a user of the ``matris`` command (set by its entry point) or of
# the Python API: each names the option the way its reader gives it, not both ways at once.
_COMMAND_LINE = contextvars.ContextVar("matris_command_line", default=False)


@contextlib.contextmanager
def command_line() -> Iterator[None]:
    """Within this, messages name options as command-line flags (``--overwrite``)."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def spell(flag: str, python: str) -> str:
    """``flag`` (``"--overwrite"``) under the ``matris`` command, ``python`` (``"overwrite=True"``)
    elsewhere: how a message names the one option its reader can give."""
    return flag if _COMMAND_LINE.get() else python


def config_key(key: str) -> str:
    """A training-config key as the reader gives it: ``--trainer.out_dir`` or ``trainer.out_dir``."""
    return spell(f"--{key}", key)


def overwrite() -> str:
    """The option that starts a job afresh, as the reader gives it."""
    return spell("--overwrite", "overwrite=True")


def notice(message: str) -> None:
    """One line on stderr: what a rerun found and what it does about it."""
    log.info(message)


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


__all__ = ["command_line", "config_key", "notice", "overwrite", "remove_outputs", "spell"]
