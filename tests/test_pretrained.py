"""Pretrained-model registry, verified downloads and the cache, against a local HTTP server.

Nothing here touches the network beyond 127.0.0.1, and every test uses its own cache folder.
"""

import hashlib
import json
import multiprocessing
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from matris import MatRIS, MatRISConfig
from matris import pretrained as pt
from matris.bundled import DEMO_CHECKPOINT
from matris.cli import main
from matris.errors import (
    DownloadError,
    MatRISInputError,
    ModelUnavailableError,
    OfflineError,
    UnknownModelError,
    VerificationError,
)

TINY = dict(num_layers=1, node_feat_dim=8, edge_feat_dim=8, three_body_feat_dim=8, mlp_hidden_dims=(8,))


# ------------------------------------------------------------------------------------ the server
class FileServer:
    """A Range-capable HTTP server on 127.0.0.1 with switches for failures.

    files: URL path → bytes. cut_after: close the connection after that many body bytes,
    once. corrupt: serve the bytes with some flipped. ignore_range: answer every request with
    200 and the whole file. fail_next: answer that many requests with 503. hold: an Event that
    body writes wait for. stall_once: send 100 bytes, then nothing for that many seconds, once.
    requests: (path, Range header or None) per GET; body_bytes: total body bytes sent.
    """

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.cut_after: int | None = None
        self.corrupt = False
        self.ignore_range = False
        self.fail_next = 0
        self.hold: threading.Event | None = None
        self.stall_once = 0.0
        self.requests: list[tuple[str, str | None]] = []
        self.body_bytes = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                server.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{path.lstrip('/')}"

    def gets(self, path: str) -> list[str | None]:
        """The Range headers of the GETs of ``path`` (None: no Range)."""
        return [r for p, r in self.requests if p == "/" + path.lstrip("/")]

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        rng = h.headers.get("Range")
        with self.lock:
            self.requests.append((h.path, rng))
            fail = self.fail_next > 0
            self.fail_next -= fail
        if fail:
            h.send_error(503, "busy")
            return
        data = self.files.get(h.path)
        if data is None:
            h.send_error(404, "not found")
            return
        if self.corrupt:
            data = bytes(b ^ 0xFF if i % 97 == 0 else b for i, b in enumerate(data))
        start = 0
        if rng and not self.ignore_range:
            start = int(rng.split("=")[1].split("-")[0])
            if start >= len(data):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(data)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            h.send_response(200)
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        body = data[start:]
        with self.lock:
            cut, self.cut_after = self.cut_after, None
            stall, self.stall_once = self.stall_once, 0.0
        if cut is not None:
            body = body[:cut]
            h.close_connection = True
        if stall:
            body = body[:100]
            h.wfile.write(body)
            h.wfile.flush()
            time.sleep(stall)
            h.close_connection = True
            with self.lock:
                self.body_bytes += len(body)
            return
        if self.hold is not None:
            h.wfile.write(body[:100])
            h.wfile.flush()
            self.hold.wait(30)
            h.wfile.write(body[100:])
        else:
            h.wfile.write(body)
        with self.lock:
            self.body_bytes += len(body)

    def close(self):
        if self.hold is not None:
            self.hold.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(bytes, parameter count) of a tiny published-format checkpoint."""
    torch.manual_seed(0)
    model = MatRIS(MatRISConfig(**TINY))
    path = model.save(tmp_path_factory.mktemp("ckpt") / "tiny.pth.tar")
    return path.read_bytes(), sum(p.numel() for p in model.parameters())


@pytest.fixture
def server(checkpoint):
    srv = FileServer()
    srv.files["/tiny.pth.tar"] = checkpoint[0]
    yield srv
    srv.close()


@pytest.fixture
def entry(server, checkpoint, cache):
    """A registry entry ("test-tiny") pointing at the local server, removed afterwards."""
    e = pt.ModelEntry(name="test-tiny", url=server.url("tiny.pth.tar"), num_params=checkpoint[1],
                      aliases=("tiny_alias",), training_data="random", metrics={"F1": 0.5})
    pt.register(e)
    yield e
    pt.unregister(e.name)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------- downloads
def test_fresh_download_is_cached_verified_and_recorded(entry, server, checkpoint, cache):
    path = pt.resolve("test-tiny")
    assert path == cache / "models" / "test-tiny.pth.tar"
    assert path.read_bytes() == checkpoint[0]
    assert not pt.part_path(path).exists()
    assert pt.read_records()["models/test-tiny.pth.tar"]["sha256"] == sha(checkpoint[0])
    model = MatRIS.load("TEST_TINY")  # from the cache: no second request
    assert sum(p.numel() for p in model.parameters()) == checkpoint[1]
    assert server.gets("tiny.pth.tar") == [None]


def test_resume_after_cut_connection_uses_range(entry, server, checkpoint):
    size = len(checkpoint[0])
    server.cut_after = 5000
    path = pt.resolve("test-tiny")
    assert path.read_bytes() == checkpoint[0]
    assert server.gets("tiny.pth.tar") == [None, "bytes=5000-"]
    assert server.body_bytes == size  # resumed, not downloaded twice


def test_resume_across_runs_from_part_file(entry, server, checkpoint, cache):
    part = pt.part_path(cache / "models" / "test-tiny.pth.tar")
    part.parent.mkdir(parents=True)
    part.write_bytes(checkpoint[0][:3000])  # left by an interrupted run
    assert pt.resolve("test-tiny").read_bytes() == checkpoint[0]
    assert server.gets("tiny.pth.tar") == ["bytes=3000-"]
    assert server.body_bytes == len(checkpoint[0]) - 3000


def test_server_ignoring_range_restarts_from_zero(entry, server, checkpoint):
    server.cut_after = 5000
    server.ignore_range = True
    path = pt.resolve("test-tiny")
    assert path.read_bytes() == checkpoint[0]  # the 200 body replaced the partial data
    assert server.gets("tiny.pth.tar") == [None, "bytes=5000-"]
    assert server.body_bytes == 5000 + len(checkpoint[0])


def test_stale_part_of_another_file_is_refetched_from_zero(entry, server, checkpoint, cache):
    part = pt.part_path(cache / "models" / "test-tiny.pth.tar")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 3000)  # not a prefix of the file: resuming yields a broken file
    assert pt.resolve("test-tiny").read_bytes() == checkpoint[0]
    assert server.gets("tiny.pth.tar") == ["bytes=3000-", None]


def test_stalled_transfer_times_out_and_resumes(entry, server, checkpoint, monkeypatch):
    server.stall_once = 1.5
    assert pt.resolve("test-tiny", settings=pt.DownloadSettings(timeout=0.3, backoff=0)).read_bytes() == checkpoint[0]
    assert server.gets("tiny.pth.tar") == [None, "bytes=100-"]


def test_transient_errors_are_retried(entry, server, checkpoint, capsys):
    server.fail_next = 2
    assert pt.resolve("test-tiny").read_bytes() == checkpoint[0]
    assert len(server.gets("tiny.pth.tar")) == 3
    server.fail_next = 10
    with pytest.raises(DownloadError, match="2 attempts in a row failed"):
        pt.resolve("test-tiny", force=True, settings=pt.DownloadSettings(retries=1, backoff=0))
    # the command's options are the same settings
    server.fail_next = 10
    assert main(["download", "test-tiny", "--force", "--retries", "1", "--timeout", "5", "--no-progress"]) != 0
    assert "2 attempts in a row failed" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [dict(timeout=0), dict(retries=-1), dict(backoff=-1.0)])
def test_download_settings_out_of_range_are_a_clear_error(bad):
    with pytest.raises(MatRISInputError, match="DownloadSettings needs timeout > 0 s"):
        pt.DownloadSettings(**bad)


def test_http_404_is_a_clear_error_without_retries(server, cache):
    with pytest.raises(DownloadError, match="HTTP 404"):
        pt.fetch_url(server.url("missing.pth.tar"))
    assert len(server.gets("missing.pth.tar")) == 1


def test_progress_bar_only_when_asked(entry, server, capsys):
    pt.resolve("test-tiny")
    assert capsys.readouterr().err == ""  # stderr is not a terminal under pytest
    pt.resolve("test-tiny", force=True, progress=True)
    assert "test-tiny.pth.tar" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- verification
def test_corrupted_cache_file_is_detected_and_fetched_again(entry, server, checkpoint):
    path = pt.resolve("test-tiny")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: only the hash can tell
    path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="corrupt"):
        again = pt.resolve("test-tiny")
    assert again.read_bytes() == checkpoint[0]
    assert len(server.gets("tiny.pth.tar")) == 2


def test_published_sha256_is_checked(server, checkpoint, cache):
    e = pt.register(pt.ModelEntry(name="test-hashed", url=server.url("tiny.pth.tar"), sha256=sha(checkpoint[0])))
    try:
        path = pt.resolve("test-hashed")
        path.write_bytes(path.read_bytes()[:-10])
        with pytest.warns(UserWarning, match="sha256"):
            assert pt.resolve("test-hashed").read_bytes() == checkpoint[0]
        server.corrupt = True
        with pytest.raises(VerificationError) as info:
            pt.resolve("test-hashed", force=True)
        msg = str(info.value)
        assert "sha256 mismatch" in msg and sha(checkpoint[0]) in msg and "--force" in msg
        assert not path.exists() and not pt.part_path(path).exists()
    finally:
        pt.unregister(e.name)


def test_download_failing_verification_leaves_no_file(entry, server, cache):
    server.corrupt = True
    with pytest.raises(VerificationError) as info:
        pt.resolve("test-tiny")
    msg = str(info.value)
    assert "test-tiny.pth.tar" in msg and server.url("tiny.pth.tar") in msg
    assert "weights_only=True" in msg and "deleted" in msg and "matris download test-tiny --force" in msg
    models = cache / "models"
    assert not (models / "test-tiny.pth.tar").exists() and not pt.part_path(models / "test-tiny.pth.tar").exists()


def test_verification_is_a_strict_load_of_the_files_own_config(server, checkpoint, cache, tmp_path):
    """No guessed config or parameter count: any architecture is accepted if its weights fit its
    own config; a state_dict that does not fit (here: one tensor removed) is refused."""
    url = server.url("tiny.pth.tar")
    pt.register(pt.ModelEntry(name="test-params", url=url, num_params=10_443_505))  # shown, never checked
    try:
        assert pt.resolve("test-params").read_bytes() == checkpoint[0]
        ckpt = torch.load(pt.resolve("test-params"), weights_only=True)
        del ckpt["state_dict"]["atom_embedding.embedding.weight"]
        torch.save(ckpt, tmp_path / "broken.pth.tar")
        server.files["/broken.pth.tar"] = (tmp_path / "broken.pth.tar").read_bytes()
        with pytest.raises(VerificationError, match="state_dict does not match its config.*atom_embedding"):
            pt.fetch_url(server.url("broken.pth.tar"), check=MatRIS.check_checkpoint)  # as MatRIS.load checks
        assert not pt.url_cache_path(server.url("broken.pth.tar")).exists()
        with pytest.raises(VerificationError, match="state_dict does not match its config.*atom_embedding"):
            MatRIS.load(server.url("broken.pth.tar"))
        assert not pt.url_cache_path(server.url("broken.pth.tar")).exists()
    finally:
        pt.unregister("test-params")


def test_url_is_cached_under_derived_name_and_verified(server, checkpoint, cache):
    url = server.url("tiny.pth.tar")
    model = MatRIS.load(url)
    path = pt.url_cache_path(url)
    assert path.parent == cache / "urls" and path.name.endswith("-tiny.pth.tar") and path.is_file()
    assert sum(p.numel() for p in model.parameters()) == checkpoint[1]
    MatRIS.load(url)
    assert len(server.gets("tiny.pth.tar")) == 1
    server.files["/junk.pth.tar"] = b"PK not a checkpoint"
    with pytest.raises(VerificationError, match="weights_only=True"):
        MatRIS.load(server.url("junk.pth.tar"))
    assert not pt.url_cache_path(server.url("junk.pth.tar")).exists()


# ------------------------------------------------------------------------------ offline and locks
def test_offline_mode(entry, server, checkpoint, cache, monkeypatch):
    pt.resolve("test-tiny")
    pt.register(pt.ModelEntry(name="test-other", url=server.url("tiny.pth.tar")))
    try:
        monkeypatch.setenv("MATRIS_OFFLINE", "1")
        with pytest.raises(OfflineError) as info:
            pt.resolve("test-other")
        msg = str(info.value)
        assert "MATRIS_OFFLINE" in msg and "test-tiny" in msg and "matris-demo (bundled)" in msg
        n = len(server.requests)
        assert sum(p.numel() for p in MatRIS.load("test-tiny").parameters()) == checkpoint[1]
        assert MatRIS.load("demo") is not None
        assert len(server.requests) == n
    finally:
        pt.unregister("test-other")


def _child(name: str, started, results) -> None:
    """A second process resolving ``name`` (the registry entry is inherited through fork)."""
    started.set()
    try:
        results.put(str(pt.resolve(name)))
    except BaseException as exc:  # noqa: BLE001 - report instead of dying silently
        results.put(f"error: {type(exc).__name__}: {exc}")


def test_two_processes_download_once(entry, server, checkpoint, cache):
    server.hold = threading.Event()  # the first transfer stalls until both processes are running
    ctx = multiprocessing.get_context("fork")  # forked: no second torch import, so the test stays fast
    results = ctx.Queue()
    started = [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=_child, args=("test-tiny", ev, results)) for ev in started]
    try:
        for p, ev in zip(procs, started):
            p.start()
            assert ev.wait(30)
        deadline = time.time() + 30
        while not server.requests and time.time() < deadline:  # one holds the lock and is downloading
            time.sleep(0.02)
        time.sleep(1.0)  # the other now waits on the lock (without one, it would send its own GET here)
    finally:
        server.hold.set()
    outs = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    path = cache / "models" / "test-tiny.pth.tar"
    assert outs == [str(path)] * 2
    assert path.read_bytes() == checkpoint[0]
    assert len(server.gets("tiny.pth.tar")) == 1  # the second process used the finished file


# ------------------------------------------------------------------------------ names and URLs
def test_published_registry():
    names = pt.REGISTRY.names()
    assert names[:4] == ["matris-demo", "matris-10m-oam", "matris-10m-mp", "matris-10m-omat"]
    oam, mp, omat = (pt.get_entry(n) for n in names[1:4])
    assert oam.url == "https://api.figshare.com/v2/file/download/59142728"
    assert mp.url == "https://api.figshare.com/v2/file/download/59143058"
    assert omat.url == "https://api.figshare.com/v2/file/download/69575544"
    for e in (oam, mp, omat):
        assert e.license == "BSD-3-Clause"
    assert oam.num_params == 10_443_505 and mp.num_params is None and omat.num_params is None  # no guesses
    assert oam.metrics == {"F1": 0.921, "kappa_SRME": 0.218, "RMSD": 0.0601}
    assert mp.metrics == {"F1": 0.847, "kappa_SRME": 0.489, "RMSD": 0.0717}
    assert pt.get_entry("demo").bundled and pt.get_entry("demo").path == DEMO_CHECKPOINT


@pytest.mark.parametrize("alias", ["matris_10m_oam", "MATRIS-10M-OAM", "Matris_10m_Oam", " matris-10m-oam "])
def test_name_aliases(alias):
    assert pt.get_entry(alias).name == "matris-10m-oam"


@pytest.mark.parametrize("alias", ["demo", "DEMO", "matris-demo", "matris_demo", "Matris_Demo"])
def test_bundled_names_resolve_offline(alias, cache, monkeypatch):
    monkeypatch.setenv("MATRIS_OFFLINE", "1")
    assert pt.resolve(alias) == DEMO_CHECKPOINT
    assert pt.resolve(None) == DEMO_CHECKPOINT


def test_unknown_name_suggests_the_closest(cache):
    with pytest.raises(UnknownModelError) as info:
        MatRIS.load("matris-10m-oma")
    msg = str(info.value)
    assert "Did you mean 'matris-10m-oam'" in msg or "Did you mean 'matris-10m-omat'" in msg
    assert all(n in msg for n in ("matris-demo", "matris-10m-oam", "matris-10m-mp", "matris-10m-omat"))
    assert isinstance(info.value, FileNotFoundError)  # what a missing checkpoint always raised
    with pytest.raises(UnknownModelError, match="Did you mean 'matris-10m-mp'"):
        pt.resolve("matris_10M_MPP")


def test_missing_path_error_is_helpful(tmp_path, cache):
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*matris-10m-oam"):
        MatRIS.load(tmp_path / "nope.pth.tar")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        MatRIS.load(str(tmp_path / "nope.pth.tar"))
    assert pt.resolve(str(DEMO_CHECKPOINT)) == DEMO_CHECKPOINT


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x.pth.tar", "file:///etc/passwd", "http://example.com/x.pth.tar",
                                 "http://10.0.0.1/x.pth.tar", "gopher://x/y"])
def test_refused_url_schemes(url, cache):
    with pytest.raises(DownloadError, match="refusing to download"):
        MatRIS.load(url)
    assert not cache.exists()


def test_allowed_urls():
    for url in ("https://figshare.com/ndownloader/files/1", "http://127.0.0.1:8000/a", "http://[::1]:8/a",
                "http://localhost/a"):
        assert pt.check_url(url) == url


def test_model_without_url_has_a_clear_error(cache):
    pt.register(pt.ModelEntry(name="test-private", unavailable_reason="its weights have not been published yet"))
    try:
        with pytest.raises(ModelUnavailableError, match="test-private.*not been published"):
            MatRIS.load("test_private")
    finally:
        pt.unregister("test-private")


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("MATRIS_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert pt.cache_dir() == tmp_path / "home" / ".cache" / "matris"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pt.cache_dir() == tmp_path / "xdg" / "matris"
    monkeypatch.setenv("MATRIS_CACHE", str(tmp_path / "mine"))
    assert pt.cache_dir() == tmp_path / "mine"


# ------------------------------------------------------------------------------------------- CLI
@pytest.fixture
def cli(monkeypatch):
    """``matris`` with only the subcommands under test: building the others' options imports Lightning."""
    import matris.cli

    monkeypatch.setattr(matris.cli, "SUBCOMMANDS", {k: matris.cli.SUBCOMMANDS[k] for k in ("models", "download")})
    return main


def test_cli_models_lists_cache_state(entry, cli, capsys, cache):
    assert cli(["models"]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out and "10,443,505" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("matris-", "test-"))}
    assert "0.921" in rows["matris-10m-oam"] and "efsm" in rows["matris-10m-oam"]
    assert "r2SCAN" in rows["matris-4m-matpes-r2scan-v2"] and " efs " in rows["matris-4m-matpes-r2scan-v2"]
    assert rows["test-tiny"].endswith("not cached") and rows["matris-demo"].endswith("bundled")
    assert cli(["download", "tiny_alias"]) == 0
    path = cache / "models" / "test-tiny.pth.tar"
    assert capsys.readouterr().out.strip() == str(path)
    assert cli(["models", "--json"]) == 0
    listing = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    assert listing["test-tiny"]["cached"] and listing["test-tiny"]["path"] == str(path)
    assert listing["test-tiny"]["size_bytes"] == path.stat().st_size
    assert listing["matris-10m-omat"]["status"] == "not cached"
    assert listing["matris-demo"]["status"] == "bundled"


def test_cli_download_errors_exit_2(entry, server, cli, capsys, cache):
    pt.register(pt.ModelEntry(name="test-private", unavailable_reason="its weights have not been published yet"))
    try:
        assert cli(["download", "test-private"]) == 2
    finally:
        pt.unregister("test-private")
    assert "not been published" in capsys.readouterr().err
    assert cli(["download", "matris-10m-oma"]) == 2
    assert "Did you mean" in capsys.readouterr().err
    assert cli(["download", "test-tiny", "--force"]) == 0
    assert cli(["download", "test-tiny", "--force"]) == 0
    assert len(server.gets("tiny.pth.tar")) == 2
