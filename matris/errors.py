"""Exceptions raised by matris for problems a user can cause."""

from __future__ import annotations


class MatRISInputError(ValueError):
    """A structure or argument that MatRIS cannot evaluate.

    The message names the structure (by index and, where known, its name), the problem
    and how to fix it.
    """


class CheckpointError(ValueError):
    """A checkpoint file that is not in the published MatRIS format."""
