"""Graph-cache build rate: structures/s of ``matris.data.build_or_load`` on one core.

    python -m benchmarks.cache_build --json benchmarks/results/cache_build_cpu.json

Writes a synthetic extxyz of rattled 32-atom cells with labels (diamond Si and rock-salt
MgO, r_c = 6 Å, r_3 = 4 Å as in the training configs), then times a cold build of the
packed cache with and without stored angles (data.cache_angles) with one intra-op thread.
The JSON records the commit, the command, the machine and the torch version.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import provenance, write_json
from matris.data import build_or_load


def write_dataset(path: Path, n: int, seed: int = 0) -> None:
    from ase.build import bulk
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.io import write

    rng = np.random.default_rng(seed)
    frames = []
    for k in range(n):
        atoms = (bulk("Si", "diamond", a=5.43, cubic=True) if k % 2 else bulk("MgO", "rocksalt", a=4.21, cubic=True))
        atoms = atoms.repeat((2, 2, 1))  # 32 atoms
        atoms.rattle(0.05, seed=int(rng.integers(1 << 30)))
        atoms.calc = SinglePointCalculator(atoms, energy=-4.0 * len(atoms), forces=np.zeros((len(atoms), 3)),
                                           stress=np.zeros(6))
        frames.append(atoms)
    write(path, frames, format="extxyz")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--structures", type=int, default=2000)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.extxyz"
        write_dataset(data, args.structures)
        for store_angles in (True, False):
            t0 = time.perf_counter()
            ds = build_or_load(data, 6.0, 4.0, cache_dir=Path(tmp) / f"cache-{store_angles}", progress=False,
                               store_angles=store_angles)
            seconds = time.perf_counter() - t0
            size = sum(f.stat().st_size for f in ds.directory.rglob("*") if f.is_file())
            rows.append({"store_angles": store_angles, "structures": len(ds), "atoms_per_structure": 32,
                         "seconds": seconds, "structures_per_s": len(ds) / seconds, "bytes": size,
                         "kB_per_structure": size / len(ds) / 1e3})
            print(f"cache_angles={str(store_angles):5s}: {len(ds)} structures in {seconds:6.1f} s = "
                  f"{len(ds) / seconds:6.0f} structures/s (one core), {size / len(ds) / 1e3:6.1f} kB per structure")
    result = {"meta": {**provenance(argv), "threads": 1}, "rows": rows}
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
