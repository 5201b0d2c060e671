"""HTTP(S) downloads with resume, retries, timeouts and a cross-process lock (stdlib only).

Data is written to ``NAME.part`` beside the destination; the caller verifies it and renames
it, so a file under its final name is always complete. An interrupted download leaves the
``.part`` file, and the next attempt (in this run or a later one) asks the server for the
rest with an HTTP ``Range`` request.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .. import log
from ..errors import DownloadError, MatRISInputError

try:  # POSIX; elsewhere downloads run unlocked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
CHUNK = 1 << 20  # bytes read per call
# HTTP statuses worth retrying: the server or a proxy is busy or failed transiently.
RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
HTML_TYPES = ("text/html", "application/xhtml+xml")


@dataclass(frozen=True)
class DownloadSettings:
    """timeout: seconds for connecting and for each read; retries: attempts after the first
    (an attempt that got new bytes does not count); backoff: seconds before the first retry,
    doubled each time (1, 2, 4, ...)."""

    timeout: float = 30.0
    retries: int = 5
    backoff: float = 1.0

    def __post_init__(self):
        if not self.timeout > 0 or self.retries < 0 or self.backoff < 0:
            raise MatRISInputError(f"DownloadSettings needs timeout > 0 s, retries >= 0 and backoff >= 0 s; got "
                                   f"timeout={self.timeout!r}, retries={self.retries!r}, backoff={self.backoff!r}")


DEFAULTS = DownloadSettings()  # what a download without ``settings`` uses


def check_url(url: str) -> str:
    """Return ``url`` if downloads from it are allowed: ``https://``, or ``http://`` to a
    loopback host (127.0.0.1, ::1, localhost). Anything else raises :class:`DownloadError`."""
    parts = urllib.parse.urlsplit(str(url))
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme == "https" and host:
        return url
    if scheme == "http" and host in LOOPBACK_HOSTS:
        return url
    if scheme == "http":
        why = "plain http:// is refused (only loopback hosts 127.0.0.1, ::1 and localhost may use it); use https://"
    elif scheme == "file":
        why = "file:// URLs are not downloaded; give the file's path instead"
    elif scheme in ("https",):
        why = "the URL has no host"
    else:
        why = f"the {scheme or 'empty'} scheme is not supported; only https:// URLs are downloaded"
    raise DownloadError(f"refusing to download {url!r}: {why}")


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects (Figshare sends files from a storage host) only to allowed URLs."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check_url(urllib.parse.urljoin(req.full_url, newurl))
        return super().redirect_request(req, fp, code, msg, headers, newurl)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, waiting_message: str | None = None) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``path`` (created if missing, never deleted).

    Blocks while another process holds it, logging ``waiting_message`` first if
    given. The kernel drops the lock when its holder exits, so a killed download leaves no
    stale lock.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:  # "a": create without truncating
        if fcntl is None:  # pragma: no cover
            yield
            return
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting_message:
                log.info(waiting_message)
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class _Retryable(Exception):
    """A failure that another attempt may fix (a connection lost or timed out, a short body, 5xx)."""


class UnreachableError(DownloadError, ConnectionError):
    """The server cannot be reached at all: its host name does not resolve, or the connection
    is refused or has no route (no network, a firewall, a proxy that is down). Not retried:
    seconds later the answer is the same, and a user without network should hear it at once.
    ``host`` and ``why``: the server and the reason, for a message that joins several.

    A connection problem, not bad input: also a ``ConnectionError`` (an ``OSError``), so
    ``except OSError`` around a load catches it, as it catches the other failures of a network."""

    def __init__(self, message: str, host: str = "", why: str = ""):
        super().__init__(message)
        self.host, self.why = host, why


# errno of a connection that cannot be made (as opposed to one that was made and then failed)
_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL,
                       errno.ENETDOWN}


def unreachable_reason(exc: BaseException) -> str | None:
    """Why a request could not reach its server ("the host name does not resolve", ...), or
    ``None`` when it is another failure (a timeout, an HTTP error, a lost connection)."""
    reason = getattr(exc, "reason", exc) if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror):
        return "the host name does not resolve (no network or no DNS)"
    if isinstance(reason, ConnectionRefusedError):
        return "the connection was refused"
    if isinstance(reason, OSError) and reason.errno in _UNREACHABLE_ERRNOS:
        return f"no route to it ({os.strerror(reason.errno)})"
    return None


def part_path(dest: str | os.PathLike) -> Path:
    """Where the partial data of ``dest`` lives: ``NAME.part`` beside it."""
    dest = Path(dest)
    return dest.with_name(dest.name + ".part")


def fetch_to_part(url: str, dest: str | os.PathLike, *, progress: bool | None = None, label: str | None = None,
                  settings: DownloadSettings | None = None) -> tuple[Path, bool]:
    """Download ``url`` into ``part_path(dest)``, resuming what is already there.

    Returns ``(part, resumed)``: ``resumed`` says whether the final data include bytes
    received before this call's first request (from a ``Range`` resume of an earlier run).
    ``progress``: show a tqdm bar on stderr (``None``: only when stderr is a terminal).
    Lost connections, timeouts, short bodies, HTTP 408/429/5xx, and answers that carry no file
    (a 2xx other than 200/203/206 such as figshare's 202 browser check, an empty body, an
    HTML page) are retried ``settings.retries`` times with exponential backoff; such answers
    never touch ``part``. A server that cannot be reached at all (the host name does not
    resolve, the connection is refused: no network) raises :class:`UnreachableError` at once,
    and other HTTP errors :class:`DownloadError`. The caller must hold the lock of ``dest``.
    """
    check_url(url)
    settings = settings or DEFAULTS
    if progress is None:
        progress = _stderr_is_tty()
    part = part_path(dest)
    part.parent.mkdir(parents=True, exist_ok=True)
    opener = urllib.request.build_opener(_CheckedRedirects)
    start_size = part.stat().st_size if part.exists() else 0
    best = start_size  # largest .part seen: growth beyond it is progress
    failures, last_error = 0, None
    state = {"restarted": False}  # set once the bytes from before this call are dropped
    while True:
        try:
            _attempt(opener, url, part, settings.timeout, progress, label or Path(dest).name, state)
            return part, start_size > 0 and not state["restarted"]
        except _Retryable as exc:  # includes timeouts (socket.timeout is an OSError)
            last_error = exc
        size = part.stat().st_size if part.exists() else 0
        if size > best:  # this attempt got new bytes: a flaky link, not a dead one
            best, failures = size, 0
        else:
            failures += 1
        if failures > settings.retries:
            kept = (f": the {size} bytes received so far are kept in {part} and the download resumes from there"
                    if size else "")
            raise DownloadError(
                f"could not download {url}: {settings.retries + 1} attempts in a row failed, the last with "
                f"{last_error}. Check the network (or set MATRIS_OFFLINE=1 to use cached models only) and run "
                f"again{kept}."
            ) from None
        time.sleep(settings.backoff * 2 ** max(failures - 1, 0))


def _attempt(opener, url: str, part: Path, timeout: float, progress: bool, label: str, state: dict) -> None:
    """One request; sets ``state["restarted"]`` when it drops the bytes already in ``part``."""
    offset = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": _user_agent(), "Accept-Encoding": "identity"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = opener.open(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and offset:
            _, total = _content_range(exc.headers.get("Content-Range") if exc.headers else None)
            if total == offset:  # an earlier run got every byte but stopped before the rename
                return
            part.unlink(missing_ok=True)  # not a prefix the server can extend: start over
            state["restarted"] = True
            raise _Retryable(f"HTTP 416 for a resume from byte {offset}; restarting from zero") from exc
        if exc.code in RETRY_STATUS:
            raise _Retryable(f"HTTP {exc.code} {exc.reason}") from exc
        hint = " (the URL may be outdated: update matris or report it)" if exc.code in (403, 404, 410) else ""
        raise DownloadError(f"downloading {url} failed: HTTP {exc.code} {exc.reason}{hint}") from None
    except DownloadError:
        raise
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        why = unreachable_reason(exc)
        if why is not None:  # no network: retrying would only make the user wait
            host = urllib.parse.urlsplit(url).hostname or url
            raise UnreachableError(f"cannot reach {host}: {why}", host, why) from None
        raise _Retryable(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from exc

    with response:
        status = getattr(response, "status", 200)
        if status not in (200, 203, 206):
            # 202 Accepted (a browser check: figshare's web form answers some networks so), 204, ...:
            # a 2xx that carries no file. Nothing is written; another attempt may get the file.
            raise _Retryable(f"HTTP {status} {getattr(response, 'reason', '') or ''} (an answer without the file)")
        content_type = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type in HTML_TYPES:
            raise _Retryable(f"HTTP {status} with an HTML page (Content-Type {content_type}) instead of the file")
        length = response.headers.get("Content-Length")
        length = int(length) if length and length.isdigit() else None
        resuming = bool(offset) and status == 206
        if resuming:
            start, total = _content_range(response.headers.get("Content-Range"))
            if start != offset:  # a range we did not ask for: drop it and start over
                part.unlink(missing_ok=True)
                state["restarted"] = True
                raise _Retryable(f"server answered a resume from byte {offset} with range start {start}")
        else:  # 200: the whole file, whether or not we asked for a range
            total = length
        read = getattr(response, "read1", response.read)

        def next_chunk(done: int) -> bytes:
            try:  # read1: what has arrived (≤ CHUNK), so a timeout loses no received bytes
                return read(CHUNK)
            except (OSError, http.client.HTTPException) as exc:
                raise _Retryable(f"connection lost after {done} bytes ({type(exc).__name__}: {exc})") from exc

        # The first bytes decide whether this is the file at all, before anything on disk changes.
        chunk = next_chunk(offset if resuming else 0)
        if not chunk:
            raise _Retryable(f"HTTP {status} with an empty body")
        if not resuming and chunk.lstrip()[:1] == b"<":
            # a checkpoint starts with "PK" (zip) or a pickle opcode, never "<": a web page
            raise _Retryable(
                f"HTTP {status} with an HTML/XML page instead of the file (starts {chunk.lstrip()[:30]!r})")
        if not resuming:
            offset = 0
            state["restarted"] = True
        if total is None and length is not None:
            total = offset + length
        bar = _progress_bar(progress, label, total, offset)
        written = offset
        try:
            with open(part, "ab" if resuming else "wb") as fh:
                while chunk:
                    fh.write(chunk)
                    written += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
                    chunk = next_chunk(written)
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            if bar is not None:
                bar.close()
    if total is not None and written != total:
        if written > total:  # cannot be a prefix of the file: start over
            part.unlink(missing_ok=True)
            state["restarted"] = True
        raise _Retryable(f"HTTP {status}: connection closed after {written} of {total} bytes")


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """``bytes START-END/TOTAL`` → (START, TOTAL); unknown parts are ``None``."""
    _, _, rest = (value or "").partition(" ")
    span, _, total = rest.partition("/")
    start = span.split("-")[0].strip()
    return (int(start) if start.isdigit() else None), (int(total) if total.strip().isdigit() else None)


def _progress_bar(enabled: bool, label: str, total: int | None, initial: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
                file=sys.stderr, leave=True)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _user_agent() -> str:
    from .. import __version__

    return f"matris/{__version__} (+python-urllib)"

__all__ = ["DownloadSettings", "UnreachableError", "check_url", "file_lock", "fetch_to_part", "part_path",
           "unreachable_reason", "LOOPBACK_HOSTS"]
