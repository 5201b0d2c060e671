"""Live progress of a simulation: steps/s, ns/day, temperature and energy on one line."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Prints ``step / total, time, T, E, steps/s, ns/day, ETA`` at most every ``every_s`` seconds.

    On a terminal the line is redrawn in place; elsewhere (a log file) each update is a line.
    ``timestep_fs`` turns steps/s into ns/day.
    """

    def __init__(self, total: int, timestep_fs: float, start: int = 0, every_s: float = 2.0,
                 stream: TextIO | None = None, label: str = "md"):
        self.total, self.timestep_fs, self.start, self.every_s = total, timestep_fs, start, every_s
        self.stream = stream or sys.stderr
        self.label = label
        self.t0 = time.perf_counter()
        self.last = -float("inf")
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def rates(self, step: int) -> tuple[float, float]:
        """(steps/s, ns/day) since the start of this run segment."""
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        steps_per_s = (step - self.start) / elapsed
        return steps_per_s, steps_per_s * self.timestep_fs * 86400 * 1e-6

    def update(self, step: int, temperature: float, energy: float, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        steps_per_s, ns_day = self.rates(step)
        left = (self.total - step) / steps_per_s if steps_per_s > 0 else float("nan")
        line = (f"{self.label} step {step:>9d}/{self.total}  t {step * self.timestep_fs / 1000:9.3f} ps  "
                f"T {temperature:8.1f} K  E {energy:14.5f} eV  {steps_per_s:7.2f} steps/s  {ns_day:8.4f} ns/day  "
                f"ETA {_duration(left)}")
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
