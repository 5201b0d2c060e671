"""Exceptions raised by matris for problems a user can cause."""

from __future__ import annotations


class MatRISInputError(ValueError):
    """A structure or argument that MatRIS cannot evaluate.

    The message names the structure (by index and, where known, its name), the problem
    and how to fix it.
    """


class MatRISInputWarning(UserWarning):
    """A structure MatRIS can evaluate but that is almost surely not what the user meant:
    atoms far closer than bonded atoms ever are, a periodic cell whose atoms see no neighbour
    within the model's cutoff, a relaxation that changed the volume by a large factor, or ASE
    Atoms that carry partial occupancies. The message names the numbers and the threshold;
    silence it with ``warnings.filterwarnings("ignore", category=MatRISInputWarning)``."""


class MemoryLimitError(MatRISInputError):
    """A structure that needs more memory than the stated limit (``memory_limit``) even at the
    lowest memory level, refused before the call starts. The message names its atoms and angles,
    the memory it needs and the limit."""


class CheckpointError(ValueError):
    """A checkpoint file that is not in the published MatRIS format."""


class UnknownModelError(MatRISInputError, FileNotFoundError):
    """A model name that is neither in the registry nor an existing file.

    The message lists the valid names and the closest match. It is also a
    ``FileNotFoundError``, as a missing checkpoint path always was.
    """


class DownloadError(MatRISInputError):
    """A pretrained model that could not be fetched: a refused URL, a network or HTTP error,
    or a downloaded file that failed its integrity check (:class:`VerificationError`)."""


class VerificationError(DownloadError):
    """A downloaded or cached checkpoint whose sha256, config or parameter count is not what
    was expected. The message names the file, the expected and the actual values."""


class ModelUnavailableError(DownloadError):
    """A registered model that has no public download URL (yet)."""


class OfflineError(DownloadError):
    """A model that is not cached while downloads are disabled (``MATRIS_OFFLINE=1``).
    The message lists the models that are available offline."""


class MissingExtraError(MatRISInputError, ImportError):
    """An optional dependency that is not installed. The message names the feature, the
    package and the extra that installs it (``pip install 'matris-mlip[train]'``). It is also an
    ``ImportError``, as the failed import always was."""


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``"1 structure"``, ``"3 structures"``: a count with its noun in the right number, for
    messages (``plural`` where adding "s" is wrong: ``counted(2, "batch", "batches")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` means the host or the device ran out of memory: ``MemoryError``, PyTorch's
    ``OutOfMemoryError`` (CUDA), a ``RuntimeError`` of its CPU allocator (no torch import here), or
    a call refused by its stated limit (:class:`MemoryLimitError`: a batch of structures then splits
    as for the others)."""
    if isinstance(exc, (MemoryError, MemoryLimitError)) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate" in text
                                              or "failed to allocate" in text)
