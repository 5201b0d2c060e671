"""The registry of pretrained MatRIS models: names, download URLs and what a file must satisfy."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from ..errors import UnknownModelError

LICENSE = "BSD-3-Clause"
MATBENCH = "Matbench-Discovery (unique prototypes)"
# Published 10M architecture (spec): what a downloaded file's config must say.
CONFIG_10M = {"num_layers": 10, "three_body_cutoff": 4.5}
PARAMS_10M = 10_443_505


def normalize_name(name: str) -> str:
    """The lookup key of a model name: ``-`` and ``_`` are the same, case is ignored."""
    return str(name).strip().lower().replace("_", "-")


@dataclass(frozen=True)
class ModelEntry:
    """One pretrained model.

    name: canonical name (lower case, ``-``-separated); aliases: other accepted names;
    url: where the file is published (``None``: not public, or bundled); path: the file
    shipped inside the package (bundled models only); filename: the name of the cached
    file (default ``NAME.pth.tar``); sha256: the file's published hash, when there is one.
    Without a hash a download is accepted only if it loads with ``weights_only=True``, every
    key of ``expected_config`` matches its config and its parameter count equals
    ``num_params`` (``None``: not checked); its sha256 is then recorded in the cache and
    checked on later loads. metrics: benchmark numbers (see ``benchmark``), for display.
    """

    name: str
    description: str = ""
    url: str | None = None
    path: Path | None = None
    filename: str | None = None
    sha256: str | None = None
    num_params: int | None = None
    expected_config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    aliases: tuple[str, ...] = ()
    training_data: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict, hash=False)
    benchmark: str = ""
    license: str = LICENSE
    unavailable_reason: str = "it has no public download URL yet"

    @property
    def bundled(self) -> bool:
        """Whether the file ships inside the package (always available offline)."""
        return self.path is not None

    @property
    def cache_filename(self) -> str:
        return self.filename or f"{self.name}.pth.tar"


class Registry:
    """Model entries by canonical name; lookups accept aliases, ``-``/``_`` and any case."""

    def __init__(self, entries: Iterable[ModelEntry] = ()):
        self._entries: dict[str, ModelEntry] = {}
        self._keys: dict[str, str] = {}  # normalized name or alias → canonical name
        for entry in entries:
            self.register(entry)

    def register(self, entry: ModelEntry, replace: bool = False) -> ModelEntry:
        """Add ``entry``. A name or alias already taken by another entry is an error unless
        ``replace`` (then the old entry is removed first)."""
        keys = {normalize_name(k) for k in (entry.name, *entry.aliases)}
        clashes = {self._keys[k] for k in keys if k in self._keys}
        if clashes and not replace:
            raise ValueError(f"model name(s) of {entry.name!r} already registered by {sorted(clashes)}; "
                             "pass replace=True to override")
        for old in clashes:
            self.unregister(old)
        self._entries[entry.name] = entry
        for k in keys:
            self._keys[k] = entry.name
        return entry

    def unregister(self, name: str) -> ModelEntry:
        """Remove and return the entry that ``name`` (or one of its aliases) names."""
        entry = self.get(name)
        del self._entries[entry.name]
        self._keys = {k: v for k, v in self._keys.items() if v != entry.name}
        return entry

    def find(self, name: str) -> ModelEntry | None:
        """The entry ``name`` refers to, or ``None``."""
        canonical = self._keys.get(normalize_name(name))
        return None if canonical is None else self._entries[canonical]

    def get(self, name: str) -> ModelEntry:
        """The entry ``name`` refers to; an unknown name raises :class:`UnknownModelError`
        listing the valid names, with the closest match."""
        entry = self.find(name)
        if entry is None:
            raise UnknownModelError(self.unknown_message(name))
        return entry

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(normalize_name(name), list(self._keys), n=1, cutoff=0.6)
        hint = f" Did you mean {self._keys[close[0]]!r}?" if close else ""
        return (f"unknown model {name!r}.{hint} Valid names: {', '.join(self.names())} "
                "(- or _, any case; run 'matris models' for details), or give a checkpoint path or an https:// URL.")

    def names(self) -> list[str]:
        return list(self._entries)

    def __iter__(self) -> Iterator[ModelEntry]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None


def _default_entries() -> list[ModelEntry]:
    from ..bundled import BUNDLED_NAMES, DEMO_CHECKPOINT

    demo_aliases = tuple(dict.fromkeys(a for a in ("demo", *BUNDLED_NAMES)
                                       if normalize_name(a) != "matris-demo"))
    return [
        ModelEntry(
            name="matris-demo",
            description="small MatRIS distilled from CHGNet 0.3.0 — for demos, tests and quick starts; "
                        "for science use matris-10m-oam",
            path=DEMO_CHECKPOINT,
            aliases=demo_aliases,
            training_data="distilled from CHGNet 0.3.0",
        ),
        ModelEntry(
            name="matris-10m-oam",
            description="MatRIS-10M trained on MPtrj + OMat24 + sAlex (Figshare file 59142728)",
            url="https://figshare.com/ndownloader/files/59142728",
            num_params=PARAMS_10M,
            expected_config=CONFIG_10M,
            training_data="MPtrj + OMat24 + sAlex",
            metrics={"F1": 0.921, "kappa_SRME": 0.218, "RMSD": 0.0601},
            benchmark=MATBENCH,
        ),
        ModelEntry(
            name="matris-10m-mp",
            description="MatRIS-10M trained on MPtrj (Figshare file 59143058)",
            url="https://figshare.com/ndownloader/files/59143058",
            num_params=PARAMS_10M,
            expected_config=CONFIG_10M,
            training_data="MPtrj",
            metrics={"F1": 0.847, "kappa_SRME": 0.489, "RMSD": 0.0717},
            benchmark=MATBENCH,
        ),
        ModelEntry(
            name="matris-10m-omat",
            description="MatRIS-10M trained on OMat24; not published yet",
            num_params=PARAMS_10M,
            expected_config=CONFIG_10M,
            training_data="OMat24",
            unavailable_reason="its weights have not been published yet (no public download URL); "
                               "use matris-10m-oam or matris-10m-mp, or pass the path of a copy you have",
        ),
    ]


REGISTRY = Registry(_default_entries())


def register(entry: ModelEntry, replace: bool = False) -> ModelEntry:
    """Add ``entry`` to the global registry (see :meth:`Registry.register`)."""
    return REGISTRY.register(entry, replace=replace)


def unregister(name: str) -> ModelEntry:
    """Remove an entry from the global registry."""
    return REGISTRY.unregister(name)


def get_entry(name: str) -> ModelEntry:
    """The registered model ``name`` refers to (aliases, ``-``/``_`` and case accepted)."""
    return REGISTRY.get(name)


__all__ = ["ModelEntry", "Registry", "REGISTRY", "register", "unregister", "get_entry", "normalize_name"]
