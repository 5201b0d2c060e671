"""The registry of pretrained MatRIS models: names, download URLs and what a file must satisfy."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from ..errors import UnknownModelError
from ..targets import TARGETS

LICENSE = "BSD-3-Clause"
MATBENCH = "Matbench-Discovery (unique prototypes)"
FIGSHARE_API = "https://api.figshare.com/v2/file/download/{id}"
# The official MatRIS 1.0.0 package downloads the same files from its GitHub release: a mirror.
GITHUB_RELEASE = "https://github.com/HPC-AI-Team/MatRIS/releases/download/v1.0.0/{file}"


def figshare_url(file_id: int) -> str:
    """The download URL of a figshare file: the API form, which answers with the file (or a
    302 to its storage host); the ``figshare.com/ndownloader`` web form may answer a 202 page."""
    return FIGSHARE_API.format(id=int(file_id))


def normalize_name(name: str) -> str:
    """The lookup key of a model name: ``-`` and ``_`` are the same, case is ignored."""
    return str(name).strip().lower().replace("_", "-")


@dataclass(frozen=True)
class ModelEntry:
    """One pretrained model.

    name: canonical name (lower case, ``-``-separated); aliases: other accepted names (the
    official package's key among them); url: where the file is published (``None``: not
    public, or bundled); mirrors: other URLs of the same file, tried in order when ``url``
    fails; path: the file shipped inside the package (bundled models only); filename: the
    name of the cached file (default ``NAME.pth.tar``; published models keep the official
    file name, so a file fetched by hand is dropped into the cache under the name it came
    with).

    Verification uses published facts only: ``size`` (bytes) and ``sha256`` where they are
    known. Without a hash a download is accepted if it loads with ``weights_only=True`` into
    the architecture of its own stored config with a strict state-dict match; its sha256 is
    then recorded in the cache and checked on later loads. ``num_params`` is shown, never
    checked.

    targets: what the model was trained on: ``"efsm"`` (energy, forces, stress, magnetic
    moments) or ``"efs"`` (its magmom head is untrained, so magmoms are not offered).
    functional: the DFT functional of the training labels. metrics: benchmark numbers (see
    ``benchmark``), for display.
    """

    name: str
    description: str = ""
    url: str | None = None
    mirrors: tuple[str, ...] = ()
    path: Path | None = None
    filename: str | None = None
    sha256: str | None = None
    size: int | None = None
    num_params: int | None = None
    aliases: tuple[str, ...] = ()
    official_key: str | None = None
    figshare_id: int | None = None
    training_data: str = ""
    functional: str = ""
    targets: str = "efsm"
    metrics: Mapping[str, float] = field(default_factory=dict, hash=False)
    benchmark: str = ""
    license: str = LICENSE
    unavailable_reason: str = "it has no public download URL yet"

    def __post_init__(self) -> None:
        if self.targets not in TARGETS:
            raise ValueError(f"targets of {self.name!r} must be one of {TARGETS}, got {self.targets!r}")

    @property
    def urls(self) -> tuple[str, ...]:
        """Every download URL of the file, the primary first."""
        return ((self.url,) if self.url else ()) + tuple(self.mirrors)

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
            names = "a model name" if len(clashes) == 1 else "model names"
            raise ValueError(f"{names} of {entry.name!r} already registered by {sorted(clashes)}; "
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


def _published(name: str, key: str, file: str, figshare_id: int, **kw) -> ModelEntry:
    """An entry of the official MatRIS 1.0 release: figshare's API URL, the GitHub release as
    a mirror, the official key as an alias and the official file name in the cache."""
    return ModelEntry(name=name, official_key=key, aliases=(key,), figshare_id=figshare_id,
                      url=figshare_url(figshare_id), mirrors=(GITHUB_RELEASE.format(file=file),), filename=file, **kw)


def _default_entries() -> list[ModelEntry]:
    from ..bundled import BUNDLED_NAMES, DEMO_CHECKPOINT

    demo_aliases = tuple(dict.fromkeys(a for a in ("demo", *BUNDLED_NAMES)
                                       if normalize_name(a) != "matris-demo"))
    matpes = [
        ("matris-4m-matpes-pbe-v1", "matris_4m_matpes_pbev1", "MatRIS_4M_MatPES_PBEv1.pth.tar", 69575532,
         "MatPES-PBE 2025.1", "PBE"),
        ("matris-4m-matpes-pbe-v2", "matris_4m_matpes_pbev2", "MatRIS_4M_MatPES_PBEv2.pth.tar", 69575535,
         "MatPES-PBE 2025.2", "PBE"),
        ("matris-4m-matpes-r2scan-v1", "matris_4m_matpes_r2scanv1", "MatRIS_4M_MatPES_r2SCANv1.pth.tar", 69575538,
         "MatPES-r2SCAN 2025.1", "r2SCAN"),
        ("matris-4m-matpes-r2scan-v2", "matris_4m_matpes_r2scanv2", "MatRIS_4M_MatPES_r2SCANv2.pth.tar", 69576381,
         "MatPES-r2SCAN 2025.2", "r2SCAN"),
    ]
    return [
        ModelEntry(
            name="matris-demo",
            description="small MatRIS distilled from CHGNet 0.3.0 — for demos, tests and quick starts; "
                        "for science use a published model",
            path=DEMO_CHECKPOINT,
            aliases=demo_aliases,
            training_data="distilled from CHGNet 0.3.0",
            functional="PBE/PBE+U (via CHGNet)",
        ),
        _published(
            "matris-10m-oam", "matris_10m_oam", "MatRIS_10M_OAM.pth.tar", 59142728,
            description="MatRIS-10M pretrained on OMat24, fine-tuned on sAlex + MPtrj; the Matbench-Discovery model",
            # Size and hash pinned by an independent model hub; the count is what the official loader prints.
            size=42_273_174, sha256="c033abc53601a74f10d9b7fec0f658220c013c3b11d4d405f1d32136d4c2b067",
            num_params=10_443_505,
            training_data="OMat24 → sAlex + MPtrj", functional="PBE/PBE+U", targets="efsm",
            metrics={"F1": 0.921, "kappa_SRME": 0.218, "RMSD": 0.0601}, benchmark=MATBENCH,
        ),
        _published(
            "matris-10m-mp", "matris_10m_mp", "MatRIS_10M_MP.pth.tar", 59143058,
            description="MatRIS-10M trained on MPtrj (compliant Matbench-Discovery model)",
            training_data="MPtrj", functional="PBE/PBE+U", targets="efsm",
            metrics={"F1": 0.847, "kappa_SRME": 0.489, "RMSD": 0.0717}, benchmark=MATBENCH,
        ),
        _published(
            "matris-10m-omat", "matris_10m_omat", "MatRIS_10M_OMAT.pth.tar", 69575544,
            description="MatRIS-10M trained on OMat24 (no magnetic moments)",
            training_data="OMat24", functional="PBE/PBE+U", targets="efs",
        ),
        *(_published(name, key, file, fid, description=f"MatRIS-4M trained on {data} (no magnetic moments)",
                     training_data=data, functional=functional, targets="efs")
          for name, key, file, fid, data, functional in matpes),
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
