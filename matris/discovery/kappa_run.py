"""``matris discovery kappa``: the κ task over a structure file, sharded and resumable.

The input is the benchmark's format: unit cells (the files ``discovery relax`` reads, e.g. the
PhononDB extxyz) whose ``info`` holds ``material_id``, ``fc2_supercell``, ``fc3_supercell`` (3 or
9 integers) and ``q_mesh`` (3 integers). Each structure of the shard runs
:func:`matris.discovery.kappa.thermal_conductivity`; its result (or the reason it failed) is
one line of ``DIR/shard-I-of-N.jsonl``, written and fsynced as soon as it is done, so a killed
run loses at most the structure in progress and a rerun continues (:mod:`.store`). A failure of
one structure (phono3py, out of memory) is recorded with its reason and the run goes on;
κ_SRME counts it as 2. A structure with imaginary modes or whose relaxation changed its space
group is a line with NaN κ and no mode κ (the benchmark does not compute its κ): SRD −2, SRME 2.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..errors import MatRISInputError
from .kappa import KappaProtocol, thermal_conductivity
from .kappa_metrics import KappaRecord, kappa_metrics
from .shards import Shard, shard_positions
from .store import ShardLog, check_manifest, read_records

INFO_KEYS = ("material_id", "fc2_supercell", "fc3_supercell", "q_mesh")


@dataclass
class KappaLine:
    """One material's line in a κ shard file. kappa ``[T, 6]`` W/(m·K); mode_kappa
    ``[T, q, b, 3]`` (the diagonal components, all κ_SRME reads); weights ``[q]``."""

    KIND: ClassVar[str] = "κ"
    material_id: str
    kappa: list | None = None
    mode_kappa: list | None = None
    weights: list | None = None
    has_imaginary: bool | None = None
    spg_initial: int | None = None
    spg_final: int | None = None
    relax_steps: int | None = None
    n_displacements: int | None = None
    method: str | None = None  # phono3py's transport type (None: κ not computed)
    reached_max_steps: bool | None = None
    seconds: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        import json

        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict) -> "KappaLine":
        if "material_id" not in data:
            raise ValueError("no material_id")
        return cls(**{k: data[k] for k in data if k in cls.__dataclass_fields__})

    def record(self) -> KappaRecord | None:
        """The metrics' view of this line (None for a failed material)."""
        if not self.ok:
            return None
        return KappaRecord(kappa=np.asarray(self.kappa, dtype=float),
                           mode_kappa=None if self.mode_kappa is None else np.asarray(self.mode_kappa, dtype=float),
                           weights=None if self.weights is None else np.asarray(self.weights, dtype=float),
                           has_imaginary=bool(self.has_imaginary),
                           spg_initial=self.spg_initial, spg_final=self.spg_final)


def read_unit_cells(path: str | Path) -> list:
    """The unit cells of ``path`` (any file :func:`.readers.read_structures` reads, ids unique)
    with the κ task's ``info`` keys, or an error naming what is missing."""
    from .readers import read_structures as index

    source = index(path)
    frames = source.load(range(len(source)))
    for k, atoms in enumerate(frames):
        if "q_mesh" not in atoms.info and "q_point_mesh" in atoms.info:  # the benchmark's newer name
            atoms.info["q_mesh"] = atoms.info["q_point_mesh"]
        missing = [key for key in INFO_KEYS[1:] if key not in atoms.info]
        if missing:
            raise MatRISInputError(f"{path}, structure {k} ({atoms.get_chemical_formula()}): info lacks "
                                   f"{', '.join(missing)}; each unit cell needs {', '.join(INFO_KEYS[1:])} (and an id: "
                                   "material_id, else its name)")
    return frames


def run_shard(structures: str | Path, out_dir: str | Path, model, model_name: str, shard: Shard,
              protocol: KappaProtocol | None = None, dtype: str = "float64", limit: int | None = None,
              retry_failed: bool = False) -> dict:
    """κ of the shard's structures into ``out_dir`` (module docstring); returns counts."""
    protocol = protocol or KappaProtocol()
    frames = read_unit_cells(structures)[:limit]
    ids = [str(a.info["material_id"]) for a in frames]
    check_manifest(out_dir, {"task": "kappa", "model": model_name, "dtype": dtype, "shards": shard.count,
                             "structures": str(Path(structures).name), "limit": limit, "n_structures": len(ids),
                             "protocol": {k: list(v) if isinstance(v, tuple) else v
                                          for k, v in asdict(protocol).items() if k != "batch_size"},
                             "material_ids": ids})
    mine = shard_positions(ids, [len(a) for a in frames], shard)
    done = failed = skipped = 0
    with ShardLog(out_dir, shard, retry_failed=retry_failed, record_type=KappaLine) as log:
        for k in mine:
            atoms, mid = frames[k], ids[k]
            if mid in log.done:
                skipped += 1
                continue
            t0 = time.perf_counter()
            try:
                r = thermal_conductivity(atoms, model, np.asarray(atoms.info["fc2_supercell"]).reshape(-1),
                                         np.asarray(atoms.info["fc3_supercell"]).reshape(-1),
                                         tuple(int(n) for n in np.asarray(atoms.info["q_mesh"]).reshape(-1)),
                                         protocol)
                rec = r.record
                line = KappaLine(mid, kappa=np.asarray(rec.kappa).tolist(),
                                 mode_kappa=None if rec.mode_kappa is None
                                 else np.asarray(rec.mode_kappa)[..., :3].tolist(),
                                 weights=None if rec.weights is None else np.asarray(rec.weights).tolist(),
                                 has_imaginary=rec.has_imaginary, spg_initial=rec.spg_initial,
                                 spg_final=rec.spg_final, relax_steps=r.relax_steps,
                                 n_displacements=r.n_displacements, method=r.method,
                                 reached_max_steps=r.reached_max_steps,
                                 seconds={**r.seconds, "total": time.perf_counter() - t0})
                done += 1
            except Exception as exc:  # noqa: BLE001  one structure's failure is recorded, the run goes on
                line = KappaLine(mid, error=f"{type(exc).__name__}: {exc}"[:500],
                                 seconds={"total": time.perf_counter() - t0})
                failed += 1
            log.append(line)
    return {"computed": done, "failed": failed, "skipped": skipped, "shard": str(shard), "path": str(log.path)}


def read_results(folder: str | Path) -> dict[str, KappaLine]:
    """Every line of every shard file of a κ run folder (material id → line)."""
    folder = Path(folder)
    files = sorted(folder.glob("shard-*.jsonl"))
    if not files:
        raise MatRISInputError(f"{folder} has no shard-*.jsonl files: it is not the --out folder of "
                               "'matris discovery kappa'")
    return {line.material_id: line for f in files for line in read_records(f, record_type=KappaLine)}


def read_reference(path: str | Path) -> tuple[dict[str, KappaRecord], dict[str, int]]:
    """The benchmark's DFT κ file (``phonondb_pbe_103_kappa_no_nac``: a pandas JSON table, one
    row per ``material_id``) as records and space groups. Columns, as the benchmark names them:
    ``kappa_tot_rta`` ``[T, 6]``; the mode resolution as ``mode_kappa_tot_rta`` ``[T, q, b, 6]`` or
    ``mode_kappa_tot_avg`` ``[T, q, b]``; ``mode_weights`` ``[q]``; optionally ``spg_num``."""
    from .readers import iter_records

    rows = list(iter_records(path))
    columns = set(rows[0]) if rows else set()
    modes = next((c for c in ("mode_kappa_tot_rta", "mode_kappa_tot_avg") if c in columns), None)
    missing = sorted({"material_id", "kappa_tot_rta", "mode_weights"} - columns)
    missing += [] if modes else ["mode_kappa_tot_rta or mode_kappa_tot_avg"]
    if missing:
        raise MatRISInputError(f"{path} is not a κ reference table: it lacks {', '.join(missing)} (columns: "
                               f"{', '.join(sorted(map(str, columns)))})")
    records, spg = {}, {}
    for row in rows:
        key = row["material_id"]
        mode = np.asarray(row[modes], dtype=float)
        if modes == "mode_kappa_tot_avg":  # already the diagonal's mean: as three equal components
            mode = np.repeat(mode[..., None], 3, axis=-1)
        records[str(key)] = KappaRecord(kappa=np.atleast_2d(np.asarray(row["kappa_tot_rta"], dtype=float)),
                                        mode_kappa=mode, weights=np.asarray(row["mode_weights"], dtype=float))
        if row.get("spg_num") is not None:
            spg[str(key)] = int(row["spg_num"])
    return records, spg


def load_pair(pred_dir: str | Path, true: str | Path) -> tuple[dict, dict, dict]:
    """The records of the run in ``pred_dir`` (successful materials only), those of the reference
    (another run's folder, or the benchmark's DFT κ file: :func:`read_reference`) and the
    reference's space groups."""
    preds = read_results(pred_dir)
    if Path(true).is_file():
        trues, spg = read_reference(true)
    else:
        lines = read_results(true)
        bad = [k for k, line in lines.items() if not line.ok]
        if bad:
            raise MatRISInputError(f"the reference {true} has failed materials ({', '.join(bad[:5])}); a reference "
                                   "must be complete")
        trues = {k: line.record() for k, line in lines.items()}
        spg = {k: line.spg_initial for k, line in lines.items()}
    return {k: line.record() for k, line in preds.items() if line.ok}, trues, spg


def compare(pred_dir: str | Path, true: str | Path) -> dict:
    """κ_SRME, κ_SRE and κ_SRD of the run in ``pred_dir`` against a reference over its materials
    (:func:`load_pair`); failed or missing predictions count as failures."""
    return kappa_metrics(*load_pair(pred_dir, true))
