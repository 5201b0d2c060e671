"""Run a benchmark: every model on every structure, in one process, smallest structures first.

For each structure (ascending atom count) every model is measured in turn, MatRIS first:

1. energy + forces (+ stress where the cell has a volume) through the model's ASE
   calculator: one warm-up call, then the median of ``repeat`` calls; atoms/s = atoms /
   median time. Where the package exposes it, the graph construction alone is timed the
   same way ("graph", part of the call).
2. MD speed: ``md_steps`` NVE velocity-Verlet steps (``timestep_fs``, default 1 fs) from a
   Maxwell–Boltzmann start at 300 K → steps/s and ns/day.
3. peak memory of the row (see :class:`matris.bench.measure.PeakMemory`).

A row whose warm-up call alone takes longer than ``max_seconds`` is recorded as
"over --max-seconds"; one that runs out of memory as "out of memory". Either way the larger
structures are skipped for that model. The timed calls and MD steps of a row stop early
when the row has used ``max_seconds`` (MD then runs fewer steps, recorded in the row).
Ratios are each model's time divided by MatRIS's on the same structure.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..errors import MatRISInputError, is_out_of_memory
from .measure import PeakMemory, md_speed, median_time
from .results import ERROR, OK, OUT_OF_MEMORY, SKIPPED, TOO_SLOW, BenchResult, BenchRow, ModelStatus
from .runners import COMPARISONS, MatRISRunner, NotAvailable, Runner, comparison
from .structures import DEFAULT_SIZES, BenchStructure, from_objects, read_bench_structures, standard_structures


@dataclass
class BenchConfig:
    """What to measure.

    model: the MatRIS model (checkpoint path, model name, a :class:`MatRIS`, or None for the
    bundled demo model). compare: other potentials, ``NAME`` or ``NAME:VARIANT`` (chgnet,
    sevennet, mace, mattersim); None: every one that is installed; empty: none. sizes:
    standard structure sizes in atoms (multiples of 8), of each of ``families`` ("si",
    "mgo"), up to ``max_atoms``. files: structure files (frame ``index`` of each). repeat:
    timed calls per row (median). md_steps: velocity-Verlet steps per row (0: no MD);
    timestep_fs (fs), temperature_K (K) of the start. device: "cpu", "cuda", "cuda:N" or
    "auto"; dtype: MatRIS's precision ("float32"/"float64"; MACE follows it, the others use
    their own). max_seconds: time budget of one row (s).
    """

    model: Any = None
    compare: Sequence[str] | None = None
    sizes: Sequence[int] = DEFAULT_SIZES
    families: Sequence[str] = ("si",)
    max_atoms: int | None = 8192
    files: Sequence[str] = ()
    index: str = "-1"
    repeat: int = 3
    md_steps: int = 20
    timestep_fs: float = 1.0
    temperature_K: float = 300.0
    device: str = "auto"
    dtype: str = "float32"
    max_seconds: float = 600.0
    seed: int = 0
    log: Callable[[str], None] | None = field(default=None, repr=False)

    def check(self) -> None:
        """Raise :class:`MatRISInputError` for settings that cannot be run."""
        if not isinstance(self.repeat, int) or self.repeat < 1:
            raise MatRISInputError(f"repeat must be an integer ≥ 1 (timed calls per row), got {self.repeat!r}")
        if not isinstance(self.md_steps, int) or self.md_steps < 0:
            raise MatRISInputError(f"md_steps must be an integer ≥ 0 (0: no MD), got {self.md_steps!r}")
        for name in ("timestep_fs", "max_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise MatRISInputError(f"{name} must be a positive number, got {value!r}")
        if self.max_atoms is not None and self.max_atoms < 1:
            raise MatRISInputError(f"max_atoms must be ≥ 1 (or None for no limit), got {self.max_atoms!r}")
        if self.compare is not None and isinstance(self.compare, str):
            raise MatRISInputError(f"compare must be a list of model names, got the string {self.compare!r}; "
                                   f"write [{self.compare!r}]")


def run_bench(config: BenchConfig | None = None, structures: Sequence[Any] = ()) -> BenchResult:
    """Measure MatRIS and the comparison models on the configured structures plus ``structures``
    (ASE Atoms or pymatgen Structures/Molecules). Returns a :class:`BenchResult`; bad
    settings or inputs raise :class:`MatRISInputError` (or ``FileNotFoundError``) before
    anything is timed."""
    from ..calculator import resolve_device

    config = config or BenchConfig()
    config.check()
    log = config.log or (lambda line: None)
    device = resolve_device(config.device)
    items = _structures(config, structures)
    others = _comparisons(config.compare)

    reference = MatRISRunner(config.model)
    reference.load(device, config.dtype)
    runners: list[Runner] = [reference]
    models = [ModelStatus(reference.key, reference.label, OK, **_described(reference))]
    for runner in others:
        try:
            runner.load(device, config.dtype)
        except NotAvailable as exc:
            models.append(ModelStatus(runner.key, runner.label, exc.status, exc.reason, variant=runner.variant))
            log(f"{runner.label}: skipped ({exc.status}): {exc.reason}")
            continue
        runners.append(runner)
        models.append(ModelStatus(runner.key, runner.label, OK, **_described(runner)))

    memory = PeakMemory(device)
    result = BenchResult(meta=_meta(config, device, memory), models=models)
    result.meta["load_average_start"] = _load_average()
    blocked: dict[str, str] = {}
    for item in items:
        for runner in runners:
            row = _measure(runner, item, config, memory, blocked)
            result.rows.append(row)
            log(_progress_line(row))
    _ratios(result, reference.key)
    result.meta["load_average_end"] = _load_average()
    return result


def _load_average() -> float | None:
    """The 1-minute load average (processes wanting a CPU), where the OS reports it."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _structures(config: BenchConfig, objects: Sequence[Any]) -> list[BenchStructure]:
    items = standard_structures(config.sizes, config.families, config.max_atoms) if config.sizes else []
    items += read_bench_structures(config.files, config.index) if config.files else []
    items += from_objects(objects) if objects else []
    if not items:
        raise MatRISInputError("nothing to benchmark: no standard sizes at or below max_atoms, no structure files "
                               "and no structures; give --sizes 8 64 ... or --structures FILE ...")
    seen: dict[str, int] = {}
    for item in items:  # unique names: rows are looked up by them
        seen[item.name] = seen.get(item.name, 0) + 1
        if seen[item.name] > 1:
            item.name = f"{item.name} #{seen[item.name]}"
    return sorted(items, key=lambda s: s.num_atoms)


def _comparisons(compare: Sequence[str] | None) -> list[Runner]:
    if compare is None:
        return [cls() for cls in COMPARISONS.values()]
    runners = []
    for spec in compare:
        if str(spec).split(":")[0].strip().lower() == "matris":
            raise MatRISInputError("MatRIS is always measured (choose it with --model); --compare names the other "
                                   f"potentials: {sorted(COMPARISONS)}")
        runner = comparison(spec)
        if all(r.label != runner.label for r in runners):
            runners.append(runner)
    return runners


def _described(runner: Runner) -> dict:
    return {"variant": runner.variant, "device": str(runner.device), "dtype": runner.dtype,
            "parameters": runner.parameters}


def _measure(runner: Runner, item: BenchStructure, config: BenchConfig, memory: PeakMemory,
             blocked: dict[str, str]) -> BenchRow:
    row = BenchRow(runner.key, runner.label, item.name, item.num_atoms, timestep_fs=config.timestep_fs,
                   properties="E+F+S" if item.has_volume else "E+F")
    if runner.key in blocked:
        row.status, row.note = SKIPPED, blocked[runner.key]
        return row
    from ase.calculators.calculator import all_changes

    properties = ["energy", "forces"] + (["stress"] if item.has_volume else [])
    atoms = item.atoms.copy()
    atoms.calc = None
    device = runner.device
    start = time.perf_counter()
    memory.start()
    try:
        calc = runner.calculator()
        calc.results = {}

        def call() -> None:
            calc.calculate(atoms, properties, all_changes)

        timing = median_time(call, config.repeat, device, budget_s=config.max_seconds, long_call=config.max_seconds)
        missing = [p for p in properties if p not in calc.results]
        if missing:
            raise RuntimeError(f"its calculator returned no {', '.join(missing)}")
        row.efs_s, row.repeats = timing.seconds, len(timing.times)
        row.atoms_per_s = item.num_atoms / timing.seconds
        if not timing.times:
            row.status = TOO_SLOW
            row.note = f"one call took {timing.first_s:.1f} s > --max-seconds {config.max_seconds:g}"
            blocked[runner.key] = f"{item.name} ({item.num_atoms} atoms) was over --max-seconds"
            return row
        build = runner.graph_builder()
        if build is not None:
            row.graph_s = median_time(lambda: build(atoms), config.repeat, device).seconds
        if config.md_steps:
            left = config.max_seconds - (time.perf_counter() - start)
            steps = min(config.md_steps, int(left / timing.seconds) - 1)
            if steps >= 1:
                speed = md_speed(atoms, runner.md_calculator(), steps, config.timestep_fs, config.temperature_K,
                                 config.seed, device)
                row.md_steps, row.md_s = speed.steps, speed.seconds
                row.md_steps_per_s, row.ns_per_day = speed.steps_per_s, speed.ns_per_day
                if steps < config.md_steps:
                    row.note = f"MD: {steps} of {config.md_steps} steps (--max-seconds)"
            else:
                row.note = "MD skipped: no time left within --max-seconds"
    except Exception as exc:  # noqa: BLE001 - one failing row must not end the benchmark
        if is_out_of_memory(exc):
            row.status, row.note = OUT_OF_MEMORY, f"{type(exc).__name__}: {_short(exc)}"
            blocked[runner.key] = f"{item.name} ({item.num_atoms} atoms) ran out of memory"
            if device is not None and device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            row.status, row.note = ERROR, f"{type(exc).__name__}: {_short(exc)}"
        row.efs_s = row.atoms_per_s = row.graph_s = None
        row.md_steps, row.md_s, row.md_steps_per_s, row.ns_per_day = 0, None, None, None
    finally:
        row.peak_memory_gb = memory.peak_gb()
    return row


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ratios(result: BenchResult, reference: str) -> None:
    for row in result.rows:
        ref = result.row(reference, row.structure)
        if ref is None or ref.status != OK or row.status != OK:
            continue
        if row.efs_s and ref.efs_s:
            row.time_ratio = row.efs_s / ref.efs_s
        if row.md_steps_per_s and ref.md_steps_per_s:
            row.md_ratio = ref.md_steps_per_s / row.md_steps_per_s


def _meta(config: BenchConfig, device: torch.device, memory: PeakMemory) -> dict[str, Any]:
    from .. import __version__

    if device.type == "cuda":
        hardware = torch.cuda.get_device_name(device)
    else:
        hardware = platform.processor() or platform.machine()
    return {
        "matris": __version__, "torch": torch.__version__, "python": sys.version.split()[0],
        "platform": platform.platform(), "hardware": hardware, "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(), "device": str(device), "dtype": config.dtype,
        "repeat": config.repeat, "md_steps": config.md_steps, "timestep_fs": config.timestep_fs,
        "temperature_K": config.temperature_K, "max_seconds": config.max_seconds,
        "memory": memory.kind, "memory_unit": "GiB", "time_unit": "s",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.argv[0]) or "python", *sys.argv[1:]]),
        "commit": _git_commit(), **_model_identity(config.model),
    }


def _git_commit() -> str | None:
    """The commit of the matris source tree the run used (None outside a git checkout)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _model_identity(model: Any) -> dict[str, Any]:
    """``{"model", "model_sha256"}`` of the MatRIS model benchmarked (a file or name; an
    in-memory MatRIS object has no file to hash)."""
    if model is not None and not isinstance(model, (str, os.PathLike)):
        return {"model": type(model).__name__, "model_sha256": None}
    from ..pretrained.cache import resolve, sha256_file

    try:
        path = resolve(model)
    except Exception:  # noqa: BLE001 - the runner reports an unloadable model itself
        return {"model": str(model), "model_sha256": None}
    return {"model": "matris-demo" if model is None else str(model), "model_sha256": sha256_file(path)}


def _progress_line(row: BenchRow) -> str:
    if row.status != OK:
        return f"{row.label:28s} {row.structure:16s} {row.status}: {row.note}"
    md = f", MD {row.md_steps_per_s:.2f} steps/s" if row.md_steps_per_s else ""
    return f"{row.label:28s} {row.structure:16s} {1e3 * row.efs_s:10.1f} ms  {row.atoms_per_s:10.1f} atoms/s{md}"


__all__ = ["BenchConfig", "run_bench"]
