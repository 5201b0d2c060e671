"""Measurements: median wall time of a call, MD speed, and peak memory of one benchmark row.

Times are wall-clock seconds from ``time.perf_counter``; on a GPU the device is
synchronised before each clock read, so queued kernels are counted. Peak memory is in GiB:
on CUDA it is ``torch.cuda.max_memory_allocated`` (reset at the start of each row: tensors
PyTorch allocated, not the driver's context); on a CPU it is the process's peak resident set
size (Linux ``VmHWM``, reset per row through ``/proc/self/clear_refs``; where that is not
possible, ``ru_maxrss``, the peak of the whole process so far).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

FS_PER_NS = 1e6
SECONDS_PER_DAY = 86400


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued GPU work on ``device`` (nothing on a CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    """Timed calls of one function.

    seconds: the median of ``times`` (s); first_s: the warm-up call (s), not in ``times``;
    times: every timed call (s). With ``long_call`` exceeded or the budget spent before any
    timed call, ``times`` is empty and ``seconds`` is the warm-up time.
    """

    seconds: float
    first_s: float
    times: list[float] = field(default_factory=list)


def median_time(fn: Callable[[], Any], repeat: int, device: torch.device | str | None = None,
                budget_s: float | None = None, long_call: float | None = None) -> Timing:
    """One warm-up call of ``fn``, then the median of up to ``repeat`` timed calls.

    ``budget_s`` (s) stops the timed calls once their total passes it (at least one is made);
    a warm-up longer than ``long_call`` (s) is reported alone (warm-up effects are then negligible).
    """
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    first = time.perf_counter() - t0
    if long_call is not None and first > long_call:
        return Timing(first, first)
    times: list[float] = []
    spent = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
        spent += times[-1]
        if budget_s is not None and spent > budget_s:
            break
    return Timing(statistics.median(times) if times else first, first, times)


def ns_per_day(steps_per_s: float, timestep_fs: float) -> float:
    """Simulated ns per day of wall time: steps/s × timestep (fs) × 86,400 s/day × 10⁻⁶ ns/fs."""
    return steps_per_s * timestep_fs * SECONDS_PER_DAY / FS_PER_NS


@dataclass
class MDSpeed:
    """NVE velocity-Verlet speed: ``steps`` steps in ``seconds`` (s) with ``timestep_fs`` (fs)."""

    steps: int
    seconds: float
    timestep_fs: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def ns_per_day(self) -> float:
        return ns_per_day(self.steps_per_s, self.timestep_fs)


def md_speed(atoms: Any, calculator: Any, steps: int, timestep_fs: float = 1.0, temperature_K: float = 300.0,
             seed: int = 0, device: torch.device | str | None = None) -> MDSpeed:
    """Time ``steps`` steps of ASE's ``VelocityVerlet`` on a copy of ``atoms``.

    Velocities are Maxwell–Boltzmann at ``temperature_K`` (K, seeded; zero total momentum,
    as ``matris md`` starts). The forces of the
    starting point are computed before the clock starts, so each timed step is exactly one
    force call plus the integrator's own work.
    """
    from ase import units
    from ase.md.verlet import VelocityVerlet

    from ..simulate.dynamics import thermalize

    atoms = atoms.copy()
    atoms.calc = calculator
    thermalize(atoms, temperature_K, np.random.default_rng(seed))
    dyn = VelocityVerlet(atoms, timestep=timestep_fs * units.fs)
    atoms.get_forces()
    synchronize(device)
    t0 = time.perf_counter()
    dyn.run(steps)
    synchronize(device)
    return MDSpeed(steps, time.perf_counter() - t0, timestep_fs)


GIB = 2**30


class PeakMemory:
    """Peak memory (GiB) between ``start()`` and ``peak_gb()``; ``kind`` says what is measured."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device or "cpu")
        if self.device.type == "cuda":
            self.kind = "CUDA max_memory_allocated"
        elif _vmhwm_kib() is not None and _reset_vmhwm():
            self.kind = "peak RSS of the process (reset per row)"
        else:
            self.kind = "peak RSS of the process so far (ru_maxrss)"

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.kind.endswith("(reset per row)"):
            _reset_vmhwm()

    def peak_gb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / GIB
        if self.kind.endswith("(reset per row)"):
            return (_vmhwm_kib() or 0) * 1024 / GIB
        return peak_rss_gb()


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far, GiB (Linux ``ru_maxrss`` is in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _vmhwm_kib() -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_vmhwm() -> bool:
    """Reset the peak RSS (Linux ≥ 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


__all__ = ["MDSpeed", "PeakMemory", "Timing", "md_speed", "median_time", "ns_per_day",
           "peak_rss_gb", "synchronize"]
