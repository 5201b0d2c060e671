"""The package's messages: progress and notices through :mod:`logging` (logger ``"matris"``),
problems the caller should act on through :mod:`warnings`.

The ``matris`` logger writes INFO and above to stderr as ``matris: MESSAGE`` (as Lightning's
loggers do) unless the application configures logging: then its own handlers decide and the
logger propagates to them. Silence it with ``logging.getLogger("matris").setLevel(logging.WARNING)``.
It is a leaf module (standard library only), imported by the kernels and the core alike.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("matris")


class _Stderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is at each message (a test's capture, a notebook's
    stream), not on the one of import time."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def _configure() -> None:
    if logger.handlers:
        return
    if logging.getLogger().handlers:  # the application set up logging: its handlers decide
        return
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("matris: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


_configure()


def info(message: str) -> None:
    """A progress line or notice (nothing is wrong): ``matris: MESSAGE`` on stderr by default."""
    logger.info(message)
    for h in logger.handlers:
        h.flush()
