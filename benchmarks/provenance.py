"""What every results JSON records about its run: commit, command, machine, versions, model."""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def provenance(argv: list[str] | None = None, model_name: str | None = None, model_path: str | os.PathLike | None = None
               ) -> dict:
    """``{"commit", "dirty", "command", "machine", "python", "torch", "model", "model_sha256"}``
    for a result file: the numbers can be traced back to the code, the model and the call."""
    import torch

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    out = {
        "commit": git("rev-parse", "HEAD") or None,
        # result files (benchmarks/results/, written while the run goes on) do not make the code dirty
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")),
        "command": shlex.join(["python", str(script), *map(portable, sys.argv[1:] if argv is None else argv)]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_description(),
    }
    if model_name or model_path:
        out["model"] = model_name or str(model_path)
    if model_path:
        digest = hashlib.sha256(Path(model_path).read_bytes()).hexdigest()
        out["model_sha256"] = digest
    return out


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
