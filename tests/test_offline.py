"""No network: a model that must be downloaded fails at once (a host name that does not resolve
and a refused connection are not retried like an HTTP 503 or a 202), with one message that
names MATRIS_OFFLINE=1 and the cache file to put a copy fetched elsewhere in. Nothing here
leaves the machine: ``.invalid`` names never resolve (RFC 2606) and the port is closed."""

import socket
import time

import pytest

from matris import MatRIS
from matris import pretrained as pt
from matris.cli import main
from matris.errors import DownloadError, MatRISInputError
from matris.pretrained import transfer as dl


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: connecting is refused


@pytest.fixture
def unreachable(cache, monkeypatch):
    """A registered model whose URL does not resolve and whose mirror refuses connections, with
    the default retry settings (5 retries, 1 s backoff: a retried failure would take 31 s)."""
    monkeypatch.setattr(dl, "DEFAULTS", dl.DownloadSettings())
    attempts = []
    real = dl._attempt
    monkeypatch.setattr(dl, "_attempt", lambda opener, url, *a: attempts.append(url) or real(opener, url, *a))
    entry = pt.ModelEntry(name="test-offline", url="https://nonexistent.invalid/m.pth.tar",
                          mirrors=(f"http://127.0.0.1:{closed_port()}/m.pth.tar",), filename="M.pth.tar")
    pt.register(entry)
    yield entry, attempts
    pt.unregister(entry.name)


def test_no_network_fails_at_once_with_one_message(unreachable, cache):
    entry, attempts = unreachable
    start = time.perf_counter()
    with pytest.raises(pt.UnreachableError) as info:
        MatRIS.load("test-offline")
    assert time.perf_counter() - start < 5
    assert attempts == list(entry.urls)  # each URL once: no retries
    message = str(info.value)
    assert isinstance(info.value, DownloadError) and isinstance(info.value, MatRISInputError)
    # no network is a connection problem: `except OSError` / `except ConnectionError` catch it
    assert isinstance(info.value, ConnectionError) and isinstance(info.value, OSError)
    assert "cannot reach nonexistent.invalid: the host name does not resolve (no network or no DNS)" in message
    assert "cannot reach 127.0.0.1: the connection was refused" in message
    assert "MATRIS_OFFLINE=1" in message and str(cache / "models" / "M.pth.tar") in message
    assert "\n" not in message and not (cache / "models" / "M.pth.tar").exists()
    # one traceback in Python too: the failures behind the message are in it, not chained below it
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_no_network_from_the_command_line(unreachable, cache, capsys):
    start = time.perf_counter()
    assert main(["predict", "--model", "test-offline"]) == 2
    assert time.perf_counter() - start < 5
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("matris predict: error: cannot download test-offline"), err
    assert "MATRIS_OFFLINE=1" in lines[0] and "; trying http" not in err  # no "failed; trying the mirror" line


def test_errors_that_repeat_their_cause_do_not_chain_it():
    """A user's mistake reads as one traceback whose last line says what to do, not as the same
    cause chained several times above it."""
    from matris.devices import resolve_device
    from matris.extras import require

    with pytest.raises(MatRISInputError) as info:
        resolve_device("gpu:0")
    assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(MatRISInputError) as info:
        require("no_such_module_for_matris", "train", "a test feature")
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_url_that_does_not_resolve(cache):
    start = time.perf_counter()
    with pytest.raises(pt.UnreachableError, match="MATRIS_OFFLINE=1"):
        pt.fetch_url("https://nonexistent.invalid/model.pth.tar")
    assert time.perf_counter() - start < 5


def test_what_counts_as_unreachable():
    import errno
    import urllib.error

    assert dl.unreachable_reason(urllib.error.URLError(socket.gaierror(-2, "Name or service not known")))
    assert dl.unreachable_reason(urllib.error.URLError(ConnectionRefusedError(errno.ECONNREFUSED, "refused")))
    assert dl.unreachable_reason(OSError(errno.ENETUNREACH, "Network is unreachable"))
    # a timeout or a dropped connection may pass: those are retried
    assert dl.unreachable_reason(urllib.error.URLError(socket.timeout("timed out"))) is None
    assert dl.unreachable_reason(ConnectionResetError(errno.ECONNRESET, "reset")) is None
