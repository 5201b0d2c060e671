"""What a checkpoint file must be, checked before torch reads it, with an error a user can act on.

A missing path, a folder, an empty file, random bytes, an HTML page saved in place of a
download, a truncated archive or a pickled Python object each get one line that names the
problem and the fix, instead of a torch or pickle message. :func:`check_path` imports
nothing heavy, so the command line checks ``--model PATH`` before it imports torch;
:func:`explain_load_error` turns what ``torch.load`` raised into such a line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import CheckpointError, MatRISInputError

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since PyTorch 1.6
# the legacy torch.save format: pickle protocol 2, then torch's magic number 0x1950a86a20f9469cfc6c
LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8"
SUFFIXES = (".pth.tar", ".pth", ".pt", ".tar", ".ckpt")
WHAT = "a MatRIS checkpoint (*.pth.tar: a published model, or one written by MatRIS.save or 'matris train')"


def check_path(path: str | os.PathLike, names_hint: str = "") -> Path:
    """``path`` if it is a file that starts like a ``torch.save`` file, else the error:
    ``FileNotFoundError`` (missing), :class:`MatRISInputError` (a folder), or
    :class:`CheckpointError` (empty, not a torch file). ``names_hint``: appended to the
    message for a missing path (e.g. the valid model names)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; give the path of {WHAT}, an https:// URL{names_hint}")
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.is_file() and p.name.lower().endswith(SUFFIXES))
        found = (f"it holds {', '.join(inside[:4])}{' ...' if len(inside) > 4 else ''}" if inside
                 else "it holds no *.pth.tar/*.pth/*.pt file")
        raise MatRISInputError(f"{path} is a folder, not a checkpoint file ({found}); give the path of the model "
                               f"file itself, e.g. {path / (inside[0] if inside else 'best_model.pth.tar')}")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise MatRISInputError(f"cannot read {path} ({exc.strerror}); check its permissions") from None
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes), not a checkpoint: an interrupted download or copy? Copy "
                              "or download it again ('matris download NAME' fetches a published model)")
    if not head.startswith((ZIP_MAGIC, LEGACY_MAGIC)):
        raise CheckpointError(f"{path} is not a PyTorch checkpoint ({_describe(head)}); give the path of {WHAT}")
    return path


def _describe(head: bytes) -> str:
    """What the first bytes of a non-torch file look like, for the message."""
    text = head.lstrip()
    if text[:1] == b"<":
        return "it is an HTML or XML page: a web page saved in place of the file? Download the file itself"
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        return f"it starts with the bytes {head[:8].hex(' ')}, while a torch.save file starts with PK (a zip archive)"
    first = decoded.splitlines()[0] if decoded.strip() else ""
    return f"it is a text file starting {first[:40]!r}, while a torch.save file is a zip archive"


def explain_load_error(path: str | os.PathLike, exc: BaseException) -> CheckpointError:
    """One-line :class:`CheckpointError` for what ``torch.load(path, weights_only=True)`` raised."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # torch colours part of its message
    if isinstance(exc, EOFError) or "central directory" in text or "PytorchStreamReader" in text:
        return CheckpointError(f"{path} is a truncated or damaged checkpoint (its archive is incomplete: an "
                               "interrupted download or copy?); copy or download it again")
    unsafe = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if unsafe:
        return CheckpointError(
            f"{path} holds a pickled Python object ({unsafe.group(1)}), not only weights, so it does not load with "
            "weights_only=True; save the model as a checkpoint instead: model.save(PATH), i.e. "
            "torch.save({'config': ..., 'state_dict': ...})")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    first = re.split(r"(?<=[.;])\s", first)[0][:200]
    return CheckpointError(f"cannot read {path} as a PyTorch checkpoint ({type(exc).__name__}: {first}); give the "
                           f"path of {WHAT}")


__all__ = ["check_path", "explain_load_error", "SUFFIXES"]
