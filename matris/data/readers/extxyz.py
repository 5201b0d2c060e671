"""Extended XYZ (``.extxyz``/``.xyz``) by byte offsets: one line-scanning pass indexes the
frames, so a record range seeks to its first frame and ASE parses only the frames asked for."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import MatRISInputError
from .ase_files import _sample_from_atoms, _unreadable
from .common import BadRecord, Sample, _broken, _label_options, _record

_OFFSETS: dict[tuple[str, int, int], tuple[np.ndarray, str | None]] = {}  # small per-process memo


def _extxyz_offsets(p: Path) -> tuple[np.ndarray, str | None]:
    """Byte offsets of the frames of an (ext)xyz file, from one line-scanning pass.

    Returns ``(offsets, problem)``: ``offsets[k]`` is where frame k starts and
    ``offsets[-1]`` where the last complete frame ends (``len(offsets) - 1`` frames).
    ``problem`` describes a broken frame right after them (a count line that is not a
    number, or a file that ends inside a frame), else None. Like ASE, a blank line ends the
    frames; legacy ``VEC`` lines after the atoms belong to the frame. Memoised per
    (path, size, mtime), so workers of one process scan a file once.
    """
    st = p.stat()
    memo_key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if memo_key in _OFFSETS:
        return _OFFSETS[memo_key]
    from itertools import islice

    offsets = [0]
    problem = None
    pos = 0
    with open(p, "rb") as f:
        while True:
            line = f.readline()
            head = line.strip()
            if not head:
                break
            try:
                n_atoms = int(head)
                if n_atoms < 0:
                    raise ValueError(n_atoms)
            except ValueError:
                found = head[:60].decode(errors="replace")
                problem = f"expected the atom-count line of a frame at byte {pos}, found {found!r}"
                break
            lengths = list(map(len, islice(f, n_atoms + 1)))  # comment line + atom lines
            if len(lengths) < n_atoms + 1:
                problem = (f"the file ends inside the frame: {n_atoms} atoms announced, "
                           f"{max(len(lengths) - 1, 0)} atom lines found (truncated)")
                break
            pos += len(line) + sum(lengths)
            while f.peek(8)[:8].lstrip().startswith(b"VEC"):
                pos += len(f.readline())
            offsets.append(pos)
    result = (np.asarray(offsets, dtype=np.int64), problem)
    if len(_OFFSETS) >= 8:
        _OFFSETS.pop(next(iter(_OFFSETS)))
    _OFFSETS[memo_key] = result
    return result


def _extxyz_frames(p: Path, index: str | int = ":") -> range:
    """The frame numbers ``index`` selects, a broken frame after the complete ones included."""
    from ase.io.formats import string2index

    offsets, problem = _extxyz_offsets(p)
    frames = range(len(offsets) - 1 + (problem is not None))
    try:
        sel = string2index(index) if isinstance(index, str) else index
        return frames[sel] if isinstance(sel, slice) else range(frames[sel], frames[sel] + 1)
    except (ValueError, IndexError, TypeError) as e:
        raise MatRISInputError(f"{p}: index={index!r} does not select frames of its {len(frames)} ({e}); give an "
                               "int or a slice string like '0:10' or '::2'.") from e


_EXTXYZ_CHUNK = 1 << 22  # bytes of frames parsed per ASE call


def _iter_extxyz(p: Path, frames: range, first: int, on_error: str,
                 options: dict[str, Any]) -> Iterator[Sample | BadRecord]:
    """Records ``first, first + 1, ...`` of an extxyz file: its frames ``frames`` (file frame numbers)."""
    import ase.io

    keys, factor, tracker = _label_options(p, options)
    offsets, problem = _extxyz_offsets(p)
    n_frames = len(offsets) - 1
    if n_frames == 0 and problem is None and first == 0:
        raise MatRISInputError(f"{p}: the file is empty (no frames); give an extxyz file with at least one structure.")
    n_read = 0
    j = 0  # position in frames; record number first + j
    with open(p, "rb") as f:
        while j < len(frames):
            frame = frames[j]
            if frame == n_frames:  # the broken frame after the complete ones
                yield _broken(first + j, on_error, _unreadable(p, EOFError(problem), first + j))
                j += 1
                continue
            last = j + 1  # one chunk: consecutive whole frames, up to _EXTXYZ_CHUNK bytes (at least one)
            while (last < len(frames) and frames[last] == frames[last - 1] + 1 and frames[last] < n_frames
                   and offsets[frames[last] + 1] - offsets[frame] <= _EXTXYZ_CHUNK):
                last += 1
            f.seek(int(offsets[frame]))
            text = f.read(int(offsets[frames[last - 1] + 1] - offsets[frame])).decode("utf-8", errors="replace")
            parsed = ase.io.iread(io.StringIO(text), index=":", format="extxyz")
            while j < last:
                k = first + j
                try:
                    atoms = next(parsed)
                    error = None
                except StopIteration:  # cannot happen with a consistent index; treat as broken
                    atoms, error = None, EOFError("frame missing from its byte slice")
                except Exception as e:  # noqa: BLE001 - the frame's error, reported below
                    atoms, error = None, e
                j += 1
                if error is not None:
                    yield _broken(k, on_error, _unreadable(p, error, k))
                    break  # restart ASE at the next frame
                yield _record(k, on_error, _sample_from_atoms, atoms, p, k, factor, tracker, keys)
                n_read += 1
    tracker.check(p, n_read)
