"""Atomic file writes: a file is written beside its destination and renamed, so a reader (or a
run killed half-way) never sees a partial file under the real name."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; it replaces ``path`` when the block succeeds.

    The temporary file keeps ``suffix`` (default: the destination's suffix) so writers that pick a
    format from the name still work. On any error it is deleted and ``path`` is untouched.
    ``fsync`` flushes the file to disk before the rename (for checkpoints that must survive a crash).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_unique(path.parent, f".{path.name}.", suffix or path.suffix or ".tmp")
    try:
        yield Path(tmp)
        if fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _create_unique(folder: Path, prefix: str, suffix: str) -> Path:
    """Create a new empty file with a random name. Unlike ``tempfile.mkstemp`` (mode 0600), its
    permissions follow the umask, like any file the user writes, so results stay readable by the group."""
    for _ in range(100):
        candidate = folder / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            with open(candidate, "x"):
                return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {folder}")


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | os.PathLike, data: Any, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON to ``path`` atomically."""
    return write_text(path, json.dumps(data, indent=indent))


__all__ = ["atomic_path", "write_text", "write_json"]
