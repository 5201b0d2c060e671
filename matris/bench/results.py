"""What a benchmark measured: one :class:`BenchRow` per model and structure, and the models' status."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OK = "ok"
OUT_OF_MEMORY = "out of memory"
TOO_SLOW = "over --max-seconds"
SKIPPED = "skipped"
ERROR = "error"


@dataclass
class ModelStatus:
    """One potential of the run.

    key: adapter name ("matris", "chgnet", ...); label: what tables show; status: "ok",
    "not installed" or "failed to load"; reason: why it was skipped (with the pip command
    where installing is the fix); device, dtype: what it ran with; parameters: its count.
    """

    key: str
    label: str
    status: str
    reason: str = ""
    variant: str | None = None
    device: str | None = None
    dtype: str | None = None
    parameters: int | None = None


@dataclass
class BenchRow:
    """One model on one structure. Times in seconds, memory in GiB.

    status: "ok", "out of memory", "over --max-seconds" (the warm-up call alone took
    longer; ``efs_s`` is then that one call), "skipped" (a smaller structure ran out of
    memory or time) or "error" (``note`` says what). efs_s: median time of one
    energy + forces (+ stress where the cell has a volume) calculator call, graph
    construction included; graph_s: median time of the graph construction alone (None where
    the package does not expose it); atoms_per_s = atoms / efs_s. md_steps: velocity-Verlet
    steps timed (fewer than asked when the row's time budget ran short); md_steps_per_s and
    ns_per_day (= steps/s × timestep_fs × 86,400 × 10⁻⁶). peak_memory_gb: see
    ``BenchResult.meta["memory"]``. time_ratio and md_ratio: this model's time per call and
    per MD step divided by MatRIS's on the same structure (> 1: MatRIS is faster).
    """

    model: str
    label: str
    structure: str
    atoms: int
    status: str = OK
    properties: str = "E+F+S"
    efs_s: float | None = None
    graph_s: float | None = None
    atoms_per_s: float | None = None
    repeats: int = 0
    md_steps: int = 0
    md_s: float | None = None
    md_steps_per_s: float | None = None
    ns_per_day: float | None = None
    timestep_fs: float = 1.0
    peak_memory_gb: float | None = None
    time_ratio: float | None = None
    md_ratio: float | None = None
    note: str = ""

    @property
    def graph_share(self) -> float | None:
        """graph_s / efs_s (the graph's share of a call)."""
        return None if self.graph_s is None or not self.efs_s else self.graph_s / self.efs_s


@dataclass
class BenchResult:
    """A whole run: ``meta`` (versions, device, threads, settings, what ``peak_memory_gb``
    measures), the ``models`` in column order (MatRIS first) and the ``rows`` in run order."""

    meta: dict[str, Any]
    models: list[ModelStatus] = field(default_factory=list)
    rows: list[BenchRow] = field(default_factory=list)

    def row(self, model: str, structure: str) -> BenchRow | None:
        """The row of adapter ``model`` (e.g. "matris") on ``structure`` (e.g. "Si 64")."""
        return next((r for r in self.rows if r.model == model and r.structure == structure), None)

    def structures(self) -> list[tuple[str, int]]:
        """(name, atoms) of every structure, in run order."""
        seen: dict[str, int] = {}
        for r in self.rows:
            seen.setdefault(r.structure, r.atoms)
        return list(seen.items())

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for r in self.rows:
            d = asdict(r)
            d["graph_share"] = r.graph_share
            rows.append(d)
        return {"meta": self.meta, "models": [asdict(m) for m in self.models], "rows": rows}


__all__ = ["BenchResult", "BenchRow", "ERROR", "ModelStatus", "OK", "OUT_OF_MEMORY", "SKIPPED", "TOO_SLOW"]
