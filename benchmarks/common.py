"""What the benchmark scripts share: timing, a process's resident memory, this machine's GEMM
rate, what a result file records about its run, atomic JSON writing, and both sides of the
worker protocol (a model in a process of its own, often under another environment's Python).

    from benchmarks.common import provenance, write_json, peak_rss_gb, gemm_rate

The scripts run as modules from the repository's root (``python -m benchmarks.peers ...``) and
import this one as ``benchmarks.common``. Only the standard library is imported at module level
(torch inside the functions that need it): the workers ``benchmarks/peer_worker.py`` and
``benchmarks/official_api_worker.py`` run under other environments' Pythons, where neither this
checkout nor our ``matris`` can be imported, and load this file by its location.

Sections: loading a file as a module; timing; memory; the GEMM rate; provenance; JSON; workers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import re
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent  # benchmarks/
ROOT = HERE.parent  # the checkout


# ----------------------------------------------------------------------------- loading
def load_module(name: str, path: str | os.PathLike):
    """The Python file (or package: a folder with ``__init__.py``) at ``path``, imported under
    ``name`` and registered in ``sys.modules``, without touching ``sys.path``: a peer's builder
    module (``benchmarks/peer_models/``), or a package from a checkout of another project."""
    path = Path(path)
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


# ----------------------------------------------------------------------------- timing
def timed(fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, float]:
    """``(fn(*args, **kwargs), its wall time in seconds)`` (``time.perf_counter``)."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def summarize(samples: list[float]) -> dict:
    """``{"median", "min", "max", "n", "samples"}`` of timed rounds."""
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples),
            "samples": samples}


def synchronize(device) -> None:
    """Wait for the GPU work queued on ``device`` (a ``torch.device`` or its name; nothing on a CPU),
    so that a clock read after it counts that work."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- memory
def _status_kib(field: str, pid: int | None) -> int | None:
    """A ``kB`` field of ``/proc/PID/status`` (``VmRSS``, ``VmHWM``), None where there is none."""
    try:
        with open(f"/proc/{pid or 'self'}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_bytes(pid: int | None = None) -> int:
    """Resident memory of this process (or of process ``pid``) now, bytes (Linux ``VmRSS``)."""
    kib = _status_kib("VmRSS", pid)
    if kib is None:
        raise RuntimeError(f"no VmRSS in /proc/{pid or 'self'}/status (Linux only, and the process must exist)")
    return kib * 1024


def peak_rss_bytes(pid: int | None = None) -> int:
    """Peak resident memory of this process (or of ``pid``) so far, bytes: Linux ``VmHWM`` (the
    peak of this program's image, from its start); for this process where /proc has none,
    ``ru_maxrss``."""
    kib = _status_kib("VmHWM", pid)
    if kib is not None:
        return kib * 1024
    if pid is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status (Linux only, and the process must exist)")


def rss_gb(pid: int | None = None) -> float:
    """:func:`rss_bytes` in GiB (2³⁰ bytes), NaN where it cannot be read."""
    try:
        return rss_bytes(pid) / 2**30
    except RuntimeError:
        return float("nan")


def peak_rss_gb(pid: int | None = None) -> float:
    """:func:`peak_rss_bytes` in GiB (2³⁰ bytes), NaN where it cannot be read."""
    try:
        return peak_rss_bytes(pid) / 2**30
    except (RuntimeError, ImportError):
        return float("nan")


# ----------------------------------------------------------------------------- the GEMM rate
def gemm_gflops(m: int, k: int, n: int, reps: int) -> float:
    """float32 GFLOP/s of ``torch.mm`` on this machine, on torch's current threads: an ``m × k`` by
    ``k × n`` product (``x @ w.T``, ``w`` stored ``n × k`` as ``nn.Linear`` keeps it), operands
    warm in cache: the median of ``reps`` calls after three untimed ones."""
    import torch

    x, w, out = torch.randn(m, k), torch.randn(n, k), torch.empty(m, n)
    for _ in range(3):
        torch.mm(x, w.T, out=out)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(x, w.T, out=out)
        times.append(time.perf_counter() - start)
    return 2 * m * k * n / statistics.median(times) / 1e9


def gemm_rate(threads: int | None = None) -> dict:
    """This machine's float32 GEMM rate (the floor every timing stands on), on ``threads`` threads
    (``torch.set_num_threads``; None: as they are): a 1,024³ product and the MatRIS-shaped
    4,096 × 128 → 256 (angle rows by width, to twice the width), by :func:`gemm_gflops`."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    return {"gflops_1024cubed": gemm_gflops(1024, 1024, 1024, 10),
            "gflops_4096x128x256": gemm_gflops(4096, 128, 256, 50), "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------- provenance
def git(*args: str) -> str:
    """``git ARGS`` in this checkout, its output stripped ("" without git or outside a repository)."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def commit() -> str | None:
    """This checkout's commit (``git rev-parse HEAD``), None without one."""
    return git("rev-parse", "HEAD") or None


def portable(arg: str) -> str:
    """A command-line argument as a result file records it: a path inside this checkout relative
    to it, any other absolute path by its name (a venv's interpreter as ``VENV/bin/python``), so a
    result names no one machine's directories. ``--opt=/path`` forms too."""
    opt, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    if not eq:
        opt, value = "", arg
    if not value.startswith("/"):
        return arg
    path = Path(value)
    try:
        short = str(path.resolve().relative_to(ROOT))
    except ValueError:
        short = f"{path.parents[1].name}/bin/{path.name}" if path.parent.name == "bin" and len(path.parents) > 2 \
            else path.name
    return opt + eq + short


def command(argv: list[str] | None = None) -> str:
    """How this run was started, as a result file records it: ``python -m benchmarks.NAME ARGS``
    for a benchmark script (``python SCRIPT ARGS`` otherwise), every path portable (:func:`portable`).
    ``argv``: the arguments a script's ``main(argv)`` was given (default ``sys.argv[1:]``)."""
    script = Path(sys.argv[0]).resolve()
    if script.parent == HERE and script.suffix == ".py":
        head = ["python", "-m", f"benchmarks.{script.stem}"]
    else:
        head = ["python", portable(str(script))]
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(head + [portable(str(a)) for a in args])


def command_now(recorded: str) -> str:
    """A command a result file recorded, as it is run now: ``python -m benchmarks.NAME ARGS`` (the
    form of older results) as ``python -m benchmarks.NAME ARGS``, absolute paths by their portable
    names (:func:`portable`); anything else as recorded."""
    text = re.sub(r"^python benchmarks/(\w+)\.py\b", r"python -m benchmarks.\1", recorded)
    if re.search(r"(^|[\s=])/", text):
        try:
            text = shlex.join(portable(word) for word in shlex.split(text))
        except ValueError:  # not shell words after all
            pass
    return text


def lscpu_model() -> str | None:
    """``lscpu``'s "Model name" (the name the guide asks beside every timing), None without lscpu."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return None
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            return value.strip()
    return None


def cpu_description() -> dict:
    """The CPU's model name and the widest vector instruction set it has (``"AVX-512"``,
    ``"AVX2+FMA"``, ``"AVX"``, ``"SSE4.2"``, or the machine name elsewhere): CPU timings depend on it,
    and the fused kernels' code paths too."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    for isa, needs in (("AVX-512", {"avx512f"}), ("AVX2+FMA", {"avx2", "fma"}), ("AVX", {"avx"}),
                       ("SSE4.2", {"sse4_2"})):
        if needs <= flags:
            return {"model": model, "isa": isa}
    return {"model": model, "isa": platform.machine()}


def provenance(argv: list[str] | None = None, model_name: str | None = None,
               model_path: str | os.PathLike | None = None) -> dict:
    """``{"commit", "dirty", "command", "machine", "python", "torch", "cpu", "model", "model_sha256"}``
    for a result file: the numbers can be traced back to the code, the model and the call."""
    import torch

    out = {
        "commit": commit(),
        # result files (benchmarks/results/, written while the run goes on) do not make the code dirty
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")),
        "command": command(argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_description(),
    }
    if model_name or model_path:
        out["model"] = model_name or str(model_path)
    if model_path:
        out["model_sha256"] = hashlib.sha256(Path(model_path).read_bytes()).hexdigest()
    return out


# ----------------------------------------------------------------------------- JSON
def write_json(path: str | os.PathLike, data: Any, indent: int | None = 1, **dumps) -> Path:
    """Write ``data`` to ``path`` as JSON (``json.dumps`` keywords in ``dumps``: ``default=str``,
    ``ensure_ascii=False``), atomically: into a new file beside it, then renamed over it, so a reader
    (or a run stopped half-way) never sees a partial file. Folders on the way are made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=indent, **dumps) + "\n"
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        # O_EXCL on a fresh name; mode 0o666 under the umask, as any file the user writes
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


# ----------------------------------------------------------------------------- workers
# A worker is a process of its own that holds one model (or one package's objects) and answers
# requests: one JSON object a line on its stdin, one JSON answer a line on its stdout
# ({"ok": true, ...} or {"ok": false, "error": ..., "traceback": ...}); whatever else it prints goes
# to its stderr. Its first answer (the "hello") comes unasked, once it is ready. {"cmd": "quit"}
# (or the end of its stdin) ends it. The parent side is Worker, the worker's side serve().

ENVS_VARIABLE = "MATRIS_PEERS_ENVS"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")


def envs_folder(folder: str | os.PathLike | None = None) -> Path:
    """The folder of the models' environments (``DIR/<env>/bin/python``): ``folder`` (the option
    ``--envs DIR``), else ``$MATRIS_PEERS_ENVS``; neither is an error that names both."""
    folder = folder or os.environ.get(ENVS_VARIABLE)
    if not folder:
        raise SystemExit(f"where are the models' environments? pass --envs DIR or set ${ENVS_VARIABLE} "
                         "(DIR/<env>/bin/python each; python -m benchmarks.peers --setup all makes them)")
    return Path(folder)


def env_python(envs: str | os.PathLike, env: str) -> Path:
    """The interpreter of environment ``env`` under ``envs``: ``envs/env/bin/python``."""
    return Path(envs) / env / "bin" / "python"


def worker_env(**extra: str) -> dict:
    """Our environment variables for a worker, without ``PYTHONPATH`` and ``PYTHONHOME`` (the
    worker sees neither this checkout nor the caller's paths), unbuffered, no user site; ``extra``
    on top."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONNOUSERSITE="1", PYTHONUNBUFFERED="1", **extra)
    return env


class WorkerError(RuntimeError):
    """A worker answered a request with an error (``traceback``: the worker's), or it exited."""

    def __init__(self, message: str, traceback: str | None = None):
        super().__init__(message)
        self.traceback = traceback


class Worker:
    """The parent's side of a worker process (see the section's comment).

    ``cmd`` starts it (a foreign environment's worker script as ``[python, "-I", script, ...]``:
    isolated mode keeps this checkout off its ``sys.path``); ``name`` prefixes its errors;
    ``stderr``: where its output goes (a file, ``subprocess.DEVNULL``; None: ours); ``cwd``: its
    working folder (default: the temporary folder, away from this checkout); ``env``: default
    :func:`worker_env`. ``max_rss_gb`` stops it once its resident memory passes that (the machine
    must stay usable), ``timeout_s`` once it has run that long; ``stopped`` then says why, and
    ``max_seen_gb`` is the most resident memory the guard saw. ``hello``: its first answer. Use as
    a context manager, or call :meth:`close`.
    """

    def __init__(self, cmd: list, *, name: str = "worker", stderr=None, cwd: str | os.PathLike | None = None,
                 env: dict | None = None, max_rss_gb: float | None = None, timeout_s: float | None = None):
        self.name = name
        self.stopped: str | None = None
        self.max_seen_gb = 0.0
        cmd = [str(c) for c in cmd]
        if os.sep in cmd[0]:  # an interpreter given relative to our folder, not the worker's
            cmd[0] = os.path.abspath(cmd[0])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, text=True, bufsize=1, cwd=cwd or tempfile.gettempdir(),
                                     env=worker_env() if env is None else env)
        if max_rss_gb or timeout_s:
            threading.Thread(target=self._guard, args=(max_rss_gb, timeout_s), daemon=True).start()
        try:
            self.hello = self._read()
        except BaseException:
            self.close()
            raise

    def _guard(self, limit_gb: float | None, timeout_s: float | None) -> None:
        start = time.monotonic()
        while self.proc.poll() is None:
            rss = rss_gb(self.proc.pid)
            if rss == rss:  # not NaN: the process is still there
                self.max_seen_gb = max(self.max_seen_gb, rss)
            if limit_gb and rss > limit_gb:
                self.stopped = f"stopped at {rss:.1f} GB resident (limit {limit_gb:g} GB, --max-rss-gb)"
            elif timeout_s and time.monotonic() - start > timeout_s:
                self.stopped = f"no answer within {timeout_s:.0f} s"
            if self.stopped:
                self.proc.kill()
                return
            time.sleep(0.1)

    def _why(self) -> str:
        return f"; {self.stopped}" if self.stopped else ""

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                code = self.proc.wait()
                raise WorkerError(f"{self.name}: the worker exited (code {code}){self._why()}; see its log")
            if line.startswith("{"):
                reply = json.loads(line)
                if not reply.get("ok"):
                    raise WorkerError(f"{self.name}: {reply.get('error', 'unknown error')}", reply.get("traceback"))
                return reply

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, cmd: str, **req) -> dict:
        """Send request ``cmd`` (its fields in ``req``) and return the answer; an error answer or a
        worker that is gone raises :class:`WorkerError`."""
        if not self.alive():
            raise WorkerError(f"{self.name}: the worker has exited (code {self.proc.returncode}){self._why()}")
        self.proc.stdin.write(json.dumps({"cmd": cmd, **req}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """Ask the worker to quit and wait for it (killed after 30 s)."""
        if self.alive():
            try:
                self.proc.stdin.write('{"cmd": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def set_threads(threads: int) -> None:
    """The worker's side: the same thread count for every framework a model may use (the
    variables before any import of theirs), and torch's where torch is installed."""
    for var in THREAD_VARIABLES:
        os.environ[var] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    try:
        import torch
    except ImportError:  # a TensorFlow model's environment
        return
    torch.set_num_threads(threads)


def serve(start: Callable[[], dict], handlers: dict[str, Callable[..., dict]]) -> int:
    """The worker's side of the protocol, until ``quit`` or the end of stdin: ``start()`` makes
    the worker ready and gives its hello; each request ``{"cmd": C, **fields}`` is answered with
    ``handlers[C](**fields)``. Every answer carries the worker's ``rss_gb`` and ``peak_rss_gb``
    after it; an exception is answered as an error (``start``'s ends the worker, exit code 1).
    Only the answers reach the real stdout: whatever the packages print, from Python or C, goes
    to stderr."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(obj: dict) -> None:
        protocol.write(json.dumps(obj) + "\n")
        protocol.flush()

    def answer(obj: dict) -> None:
        reply({"ok": True, **obj, "rss_gb": rss_gb(), "peak_rss_gb": peak_rss_gb()})

    def failure(exc: BaseException) -> None:
        reply({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})

    try:
        answer(start())
    except Exception as exc:  # noqa: BLE001 - the parent records the reason
        failure(exc)
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            cmd = req.pop("cmd")
            if cmd == "quit":
                reply({"ok": True})
                return 0
            if cmd not in handlers:
                raise ValueError(f"unknown request {cmd!r}; this worker answers {', '.join(handlers)}")
            answer(handlers[cmd](**req))
        except Exception as exc:  # noqa: BLE001 - the parent records the reason
            failure(exc)
    return 0
