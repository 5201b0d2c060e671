"""The model cache: where downloads live, how they are verified, and name/URL/path resolution.

Layout under :func:`cache_dir`::

    models/NAME.pth.tar            registry models (NAME.pth.tar.part while downloading, .lock)
    urls/HASH-BASENAME             checkpoints given as URLs (HASH: sha256 of the URL, 16 hex)
    checksums.json                 sha256 recorded for files without a published hash
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import urllib.parse
import warnings
from pathlib import Path
from typing import Any, Callable

from .. import checkpoint_files, log
from ..errors import (
    CheckpointError,
    DownloadError,
    ModelUnavailableError,
    OfflineError,
    UnknownModelError,
    VerificationError,
)
from ..settings import cache_home, offline
from . import registry as _registry
from .registry import ModelEntry
from .transfer import DownloadSettings, UnreachableError, _stderr_is_tty, check_url, fetch_to_part, file_lock, part_path

RECORDS = "checksums.json"
_CHECKPOINT_SUFFIXES = (".pth", ".tar", ".pt", ".ckpt", ".bin")


# ---------------------------------------------------------------------------------------- places
def cache_dir() -> Path:
    """``$MATRIS_CACHE``, else ``$XDG_CACHE_HOME/matris``, else ``~/.cache/matris`` (not created)."""
    return cache_home()


def is_offline() -> bool:
    """Whether downloads are disabled (``MATRIS_OFFLINE`` set to 1/true/yes/on)."""
    return offline()


def cached_path(entry: ModelEntry) -> Path:
    """Where ``entry`` lives: its bundled file, or its place in the cache (which may not exist)."""
    if entry.bundled:
        return Path(entry.path)
    return cache_dir() / "models" / entry.cache_filename


def url_cache_path(url: str) -> Path:
    """The cache file of a checkpoint given by URL: sha256 of the URL (16 hex) + its basename."""
    basename = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name
    basename = re.sub(r"[^A-Za-z0-9._-]", "_", basename)[-100:].lstrip(".") or "checkpoint.pth.tar"
    return cache_dir() / "urls" / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{basename}"


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------- recorded hashes
def _record_key(path: Path) -> str:
    try:
        return path.resolve().relative_to(cache_dir().resolve()).as_posix()
    except ValueError:
        return str(path.resolve())


def read_records() -> dict[str, dict[str, Any]]:
    """The recorded hashes: cache-relative path → ``{"sha256", "size", "source"}``."""
    import json

    try:
        data = json.loads((cache_dir() / RECORDS).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _update_record(path: Path, sha: str | None, source: str | None) -> None:
    """Record (``sha`` given) or forget the hash of ``path``; read-modify-write under a lock so
    that processes caching different models don't lose each other's entries."""
    from ..atomic import write_json

    with file_lock(cache_dir() / (RECORDS + ".lock")):
        records = read_records()
        if sha is None:
            if records.pop(_record_key(path), None) is None:
                return
        else:
            records[_record_key(path)] = {"sha256": sha, "size": path.stat().st_size, "source": source}
        write_json(cache_dir() / RECORDS, records)


# ---------------------------------------------------------------------------------- verification
def verify_checkpoint(path: str | os.PathLike, entry: ModelEntry | None = None, label: str | None = None,
                      check: Callable[[Any, str], None] | None = None) -> str:
    """Check that ``path`` is what ``entry`` promises and return its sha256.

    Only published facts are checked: the size and sha256 of ``entry`` where it has them.
    Without a hash the file must load with ``torch.load(weights_only=True)`` in a layout the
    official loader reads (:func:`matris.checkpoint_files.read`) and pass ``check`` (given the
    :class:`~matris.checkpoint_files.CheckpointContents` and ``label``; :meth:`MatRIS.check_checkpoint`,
    which :meth:`MatRIS.load` and the CLI pass: the weights fit the architecture of the file's own
    config, strictly). ``entry=None`` checks only that. Raises :class:`VerificationError` naming
    ``label`` (default: the path), the expected and the actual value.
    """
    path = Path(path)
    label = label or str(path)
    if entry is not None and entry.size is not None and path.stat().st_size != entry.size:
        raise VerificationError(f"{label}: size mismatch: expected {entry.size:,} bytes, got {path.stat().st_size:,}")
    sha = sha256_file(path)
    if entry is not None and entry.sha256:
        if sha != entry.sha256.lower():
            raise VerificationError(f"{label}: sha256 mismatch: expected {entry.sha256.lower()}, got {sha}")
        return sha
    try:
        obj = checkpoint_files.load_file(path)
    except CheckpointError as exc:
        raise VerificationError(f"{label}: does not load with torch.load(weights_only=True) "
                                f"({str(exc.__cause__ or exc)[:200]})") from exc
    try:
        contents = checkpoint_files.unpack(obj, label)
        if check is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # unknown config keys: the strict state-dict match decides
                check(contents, label)
    except (CheckpointError, TypeError, ValueError) as exc:
        raise VerificationError(f"{label}: not a valid MatRIS checkpoint: {exc}") from None
    return sha


def _check_cached(path: Path, entry: ModelEntry | None, sources: tuple[str, ...], check=None) -> str | None:
    """``None`` if the cached ``path`` is intact, else why not. A file with a recorded hash is
    compared with it; a file without one (copied in by hand, records lost) is verified in full
    and then recorded."""
    if entry is not None and entry.size is not None and path.stat().st_size != entry.size:
        return f"size {path.stat().st_size:,} bytes, expected {entry.size:,}"
    if entry is not None and entry.sha256:
        actual = sha256_file(path)
        return None if actual == entry.sha256.lower() else f"sha256 {actual}, expected {entry.sha256.lower()}"
    record = read_records().get(_record_key(path))
    if record and record.get("source") in sources and record.get("sha256"):
        size = path.stat().st_size
        if record.get("size") not in (None, size):
            return f"size {size} bytes, recorded {record['size']}"
        actual = sha256_file(path)
        return None if actual == record["sha256"] else f"sha256 {actual}, recorded {record['sha256']}"
    try:
        sha = verify_checkpoint(path, entry, check=check)
    except VerificationError as exc:
        return str(exc)
    _update_record(path, sha, sources[0])
    return None


# -------------------------------------------------------------------------------------- fetching
def fetch(entry: ModelEntry | str, *, force: bool = False, progress: bool | None = None, check=None,
          settings: DownloadSettings | None = None) -> Path:
    """The local file of a registered model, downloading and verifying it if needed.

    A cached file is checked (sha256) first; a corrupted one is deleted and fetched again.
    ``force`` downloads again even if the cached file is intact. ``progress``: tqdm bar on
    stderr (``None``: when stderr is a terminal). Raises :class:`ModelUnavailableError` for a
    model without public URL, :class:`OfflineError` when it must be fetched but
    ``MATRIS_OFFLINE=1``, :class:`DownloadError` / :class:`VerificationError` otherwise.
    """
    if isinstance(entry, str):
        entry = _registry.REGISTRY.get(entry)
    if entry.bundled:
        return Path(entry.path)
    if entry.url is None:
        raise ModelUnavailableError(f"model {entry.name!r} cannot be downloaded: {entry.unavailable_reason}.")
    check_url(entry.url)
    return _fetch(entry.urls, cached_path(entry), entry, entry.name, force, progress, check, settings)


def fetch_url(url: str, *, force: bool = False, progress: bool | None = None, check=None,
              settings: DownloadSettings | None = None) -> Path:
    """The local copy of the checkpoint at ``url`` (https, or http to a loopback host), cached
    under :func:`url_cache_path` and verified as a MatRIS checkpoint that loads with
    ``weights_only=True`` (and passes ``check``, :func:`verify_checkpoint`); its sha256 is recorded
    and checked on later loads."""
    check_url(url)
    return _fetch((url,), url_cache_path(url), None, url, force, progress, check, settings)


def _fetch(urls: tuple[str, ...], path: Path, entry: ModelEntry | None, what: str, force: bool,
           progress: bool | None, check=None, settings: DownloadSettings | None = None) -> Path:
    if path.exists() and not force and _check_cached(path, entry, urls, check) is None:
        return path
    if is_offline():
        if force:
            raise OfflineError(f"cannot download {what} again: MATRIS_OFFLINE=1 disables downloads; unset it, or "
                               f"drop --force/force=True to use the cached copy. {available_offline()}")
        if path.exists():
            raise OfflineError(f"the cached {what} ({path}) is corrupt and MATRIS_OFFLINE=1 forbids fetching it "
                               f"again; unset MATRIS_OFFLINE to download it, or {_by_hand(urls, path)}. "
                               f"{available_offline()}")
        raise OfflineError(f"{what} is not in the cache ({path.parent}) and MATRIS_OFFLINE=1 disables downloads; "
                           f"unset MATRIS_OFFLINE to download it, or {_by_hand(urls, path)}. {available_offline()}")
    if progress is None:
        progress = _stderr_is_tty()
    lock = path.with_name(path.name + ".lock")
    try:
        with file_lock(lock, f"waiting for another process downloading {what} (lock {lock})" if progress else None):
            if path.exists():
                if not force:
                    problem = _check_cached(path, entry, urls, check)  # another process may have just fetched it
                    if problem is None:
                        return path
                    warnings.warn(f"cached {what} at {path} is corrupt ({problem}): deleting it and downloading it "
                                  "again", stacklevel=3)
                path.unlink()
                _update_record(path, None, None)
            return _download_any(urls, path, entry, what, progress, check, settings)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
            raise
        raise DownloadError(f"cannot write {what} to the cache at {path.parent} ({exc.strerror}); free some space or "
                            "set MATRIS_CACHE to a writable folder with room for the model") from exc


def _by_hand(urls: tuple[str, ...], path: Path) -> str:
    """How to install the file without our downloader."""
    return (f"fetch it by hand (a browser, or curl -L -o FILE URL) from {' or '.join(urls)}, save it as {path}, and "
            "set MATRIS_OFFLINE=1 so that matris uses that file without going to the network (it is verified when "
            "loaded)")


def _download_any(urls: tuple[str, ...], path: Path, entry: ModelEntry | None, what: str, progress: bool,
                  check=None, settings: DownloadSettings | None = None) -> Path:
    """Try each URL in turn (a mirror after the primary). The error lists every URL's failure
    and, unless every file arrived and failed verification, how to fetch the file by hand."""
    failures: list[DownloadError] = []
    for k, url in enumerate(urls):
        if k:  # a partial file of another source is not trusted
            part_path(path).unlink(missing_ok=True)
            if not isinstance(failures[-1], UnreachableError):  # no network: the one error at the end says it
                log.info(f"downloading {what} from {urls[k - 1]} failed; trying {url}")
        try:
            return _download_verified(url, path, entry, what, progress, check, settings)
        except DownloadError as exc:
            failures.append(exc)
    if all(isinstance(exc, UnreachableError) for exc in failures):
        raise UnreachableError(_no_network_message(urls, path, what, failures)) from None
    if all(isinstance(exc, VerificationError) for exc in failures):
        if len(failures) == 1:
            raise failures[0]
        raise VerificationError(" | ".join(map(str, failures))) from None
    text = str(failures[0]) if len(urls) == 1 else (
        f"could not download {what} from any of its {len(urls)} URLs: "
        + " | ".join(f"{url}: {exc}" for url, exc in zip(urls, failures)))
    raise DownloadError(f"{text} Or {_by_hand(urls, path)}.") from None


def _no_network_message(urls: tuple[str, ...], path: Path, what: str, failures: list[DownloadError]) -> str:
    """One line for a download that reached none of its servers: what failed, and how to use
    the model on a machine without network (a copy in the cache, MATRIS_OFFLINE=1)."""
    by_reason: dict[str, list[str]] = {}
    for exc in failures:
        hosts = by_reason.setdefault(getattr(exc, "why", "") or str(exc), [])
        if getattr(exc, "host", "") and exc.host not in hosts:
            hosts.append(exc.host)
    reasons = "; ".join(f"cannot reach {' or '.join(hosts)}: {why}" if hosts else why
                        for why, hosts in by_reason.items())
    how = (f"'matris download {what}', or by hand from {urls[0]}" if "://" not in what
           else f"e.g. curl -L -o FILE {what}")
    return (f"cannot download {what}: {reasons}. Without network, fetch the file on a machine that has it ({how}), "
            f"copy it to {path} (in the cache folder {cache_dir()}; MATRIS_CACHE moves it), and set MATRIS_OFFLINE=1 "
            "so that matris uses the cache without trying the network")


def _download_verified(url: str, path: Path, entry: ModelEntry | None, what: str, progress: bool,
                       check=None, settings: DownloadSettings | None = None) -> Path:
    """Download ``url`` to ``path.part``, verify it, then rename it to ``path``."""
    label = f"{path.name} (downloaded from {url})"

    def verify(part: Path) -> str:
        try:
            return verify_checkpoint(part, entry, label, check)
        except VerificationError:
            part.unlink(missing_ok=True)
            raise

    part, resumed = fetch_to_part(url, path, progress=progress, label=path.name, settings=settings)
    try:
        sha = verify(part)
    except VerificationError as exc:
        if not resumed:
            raise _failed_verification(exc, what) from None
        # The first bytes came from an earlier, interrupted run: maybe of an older file. Once more, from zero.
        part, _ = fetch_to_part(url, path, progress=progress, label=path.name, settings=settings)
        try:
            sha = verify(part)
        except VerificationError as exc2:
            raise _failed_verification(exc2, what) from None
    os.replace(part, path)
    _update_record(path, sha, url)
    return path


def _failed_verification(exc: VerificationError, what: str) -> VerificationError:
    """``exc`` with what to do added (the file is already deleted)."""
    again = f"matris download {what} --force" if "://" not in what else f"MatRIS.load({what!r})"
    return VerificationError(
        f"{exc}. The downloaded file failed verification and was deleted; nothing was cached. Try again "
        f"({again}); if it fails again the published file has changed or is damaged: update matris or report it."
    )


# ------------------------------------------------------------------------------------ resolution
def resolve(model: str | os.PathLike | None = None, *, force: bool = False, progress: bool | None = None,
            check=None, settings: DownloadSettings | None = None) -> Path:
    """The checkpoint file ``model`` names, fetched and verified (with ``check``, see
    :func:`verify_checkpoint`) if needed.

    ``model`` is ``None`` (the bundled model), a registry name (``-``/``_``, any case), an
    ``https://`` URL (``http://`` for loopback hosts only), or a path. A string that is
    neither a name nor an existing file raises :class:`UnknownModelError` (with a "did you
    mean") or, if it looks like a path, ``FileNotFoundError``. ``settings``: the download's
    timeout, retries and backoff (:class:`DownloadSettings`; default 30 s, 5, 1 s).
    """
    kind, target = locate(model)
    if kind == "url":
        return fetch_url(target, force=force, progress=progress, check=check, settings=settings)
    if kind == "entry":
        return fetch(target, force=force, progress=progress, check=check, settings=settings)
    return target


def locate(model: str | os.PathLike | None) -> tuple[str, Any]:
    """What ``model`` names, checked without the network and without torch: ``("path",
    Path)`` for the bundled model or a checkpoint file, ``("url", str)`` or ``("entry",
    ModelEntry)`` for what :func:`resolve` then fetches. Raises what :func:`resolve` raises
    for an unknown name, a missing path, a folder, an empty or non-torch file, a refused URL
    or a model without a public URL, so a command can check ``--model`` before its work."""
    if model is None:
        from ..bundled import DEMO_CHECKPOINT

        return "path", DEMO_CHECKPOINT
    if isinstance(model, os.PathLike):
        return "path", _existing_path(Path(model))
    text = str(model).strip()
    if not text:
        raise UnknownModelError(_registry.REGISTRY.unknown_message(text))
    if "://" in text or text.lower().startswith(("http:", "https:", "ftp:", "file:")):
        return "url", check_url(text)
    if not _looks_like_path(text):
        entry = _registry.REGISTRY.find(text)
        if entry is not None:
            if entry.bundled:
                return "path", Path(entry.path)
            if entry.url is None:
                raise ModelUnavailableError(f"model {entry.name!r} cannot be downloaded: {entry.unavailable_reason}.")
            return "entry", entry
        if not Path(text).exists():
            raise UnknownModelError(_registry.REGISTRY.unknown_message(text)
                                    + " (No checkpoint file of that name exists either.)")
    return "path", _existing_path(Path(text).expanduser())


def download(model: str, *, force: bool = False, progress: bool | None = None, check=None,
             settings: DownloadSettings | None = None) -> Path:
    """Fetch a registry model (or URL) into the cache and return its path (``matris download``)."""
    text = str(model).strip()
    if "://" in text:
        return fetch_url(text, force=force, progress=progress, check=check, settings=settings)
    return fetch(_registry.REGISTRY.get(text), force=force, progress=progress, check=check, settings=settings)


def _looks_like_path(text: str) -> bool:
    return ("/" in text or os.sep in text or text.startswith((".", "~"))
            or text.lower().endswith(_CHECKPOINT_SUFFIXES))


def _existing_path(path: Path) -> Path:
    """``path`` if it is a file that looks like a checkpoint (see :func:`matris.checkpoint_files.check_path`)."""
    from ..checkpoint_files import check_path

    return check_path(path, f", or a model name: {', '.join(_registry.REGISTRY.names())} (see 'matris models')")


def entry_for_file(path: str | os.PathLike) -> ModelEntry | None:
    """The registered model that the file at ``path`` is, or ``None``.

    Matched by place (the entry's cache file), by content (same size and sha256 as the
    entry's published hash, or as a download of it recorded in the cache; the hash is
    computed only when a size matches), then by the official file name (e.g.
    ``MatRIS_10M_OMAT.pth.tar``, as the official README links it). Lets a checkpoint loaded
    from a path get the registry's facts (its targets) when the file itself does not say.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        resolved = path.resolve()
    except OSError:
        return None
    entries = [e for e in _registry.REGISTRY if not e.bundled]
    for e in entries:
        if cached_path(e).resolve() == resolved:
            return e
    candidates = [(e, e.sha256.lower()) for e in entries if e.sha256 and e.size in (None, size)]
    for record in read_records().values():
        if record.get("size") == size and record.get("sha256"):
            candidates += [(e, record["sha256"]) for e in entries if record.get("source") in e.urls]
    if candidates:
        sha = sha256_file(path)
        for e, expected in candidates:
            if expected == sha:
                return e
    name = path.name.lower()
    return next((e for e in entries if e.filename and e.filename.lower() == name), None)


# --------------------------------------------------------------------------------------- listing
def model_info(entry: ModelEntry, count: Callable[[Path], int | None] | None = None) -> dict[str, Any]:
    """What ``matris models`` shows for ``entry``: registry fields plus cache state
    (``cached``, ``path``, ``size_bytes``; ``status`` is bundled / cached / not cached /
    unavailable). The file is not verified here. ``count``: the parameters of a checkpoint file,
    for a cached model whose entry does not say."""
    path = cached_path(entry)
    exists = path.is_file()
    num_params = entry.num_params
    if num_params is None and exists and count is not None:  # counted from the file at hand
        num_params = count(path)
    if entry.bundled:
        status = "bundled"
    elif exists:
        status = "cached"
    elif entry.url is None:
        status = "unavailable"
    else:
        status = "not cached"
    return {
        "name": entry.name,
        "official_key": entry.official_key,
        "aliases": list(entry.aliases),
        "description": entry.description,
        "functional": entry.functional,
        "targets": entry.targets,
        "num_params": num_params,
        "training_data": entry.training_data,
        "benchmark": entry.benchmark,
        "metrics": dict(entry.metrics),
        "license": entry.license,
        "url": entry.url,
        "mirrors": list(entry.mirrors),
        "figshare_id": entry.figshare_id,
        "filename": entry.cache_filename,
        "sha256": entry.sha256,
        "published_size_bytes": entry.size,
        "status": status,
        "cached": exists,
        "path": str(path),
        "size_bytes": path.stat().st_size if exists else None,
    }


def list_models(count: Callable[[Path], int | None] | None = None) -> list[dict[str, Any]]:
    """:func:`model_info` of every registered model, in registry order."""
    return [model_info(entry, count) for entry in _registry.REGISTRY]


def cached_models() -> list[tuple[str, Path]]:
    """(name, path) of every model available without network: bundled ones and cached files."""
    out = [(e.name, cached_path(e)) for e in _registry.REGISTRY if e.bundled or cached_path(e).is_file()]
    urls = cache_dir() / "urls"
    if urls.is_dir():
        out += [(p.name, p) for p in sorted(urls.iterdir())
                if p.is_file() and not p.name.endswith((".part", ".lock"))]
    return out


def available_offline() -> str:
    names = [f"{name} ({'bundled' if _is_bundled(name) else path})" for name, path in cached_models()]
    return "Available offline: " + (", ".join(names) if names else "none") + "."


def _is_bundled(name: str) -> bool:
    entry = _registry.REGISTRY.find(name)
    return entry is not None and entry.bundled


__all__ = [
    "cache_dir", "is_offline", "cached_path", "url_cache_path", "sha256_file", "read_records",
    "verify_checkpoint", "fetch", "fetch_url", "resolve", "locate", "download", "model_info", "list_models",
    "cached_models", "available_offline", "entry_for_file",
]
