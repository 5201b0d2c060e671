"""Parity with the reference implementation: the error of every fixture structure, as a table.

    python -m benchmarks.parity [--json out.json]
    python -m benchmarks.parity --json benchmarks/results/parity.json > benchmarks/results/parity.log

For each folder of tests/fixtures/official-v0.9 (the v0.9 checkpoints and the reference
implementation's outputs), evaluates every structure alone in the folder's dtype and
prints max |Δ| of energy per atom (eV/atom), forces (eV/Å), stress (GPa), magnetic
moments (μB), and the directed-edge and angle counts against the reference's.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from ase.io import read

from benchmarks.common import ROOT
from matris import GraphBatch, MatRIS
from matris.structures import to_system

FIXTURES = ROOT / "tests" / "fixtures" / "official-v0.9"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="write the errors to this JSON file")
    args = p.parse_args(argv)
    rows = []
    print(f"{'folder':22s} {'structure':20s} {'|ΔE|/atom':>9s} {'max|ΔF|':>9s} {'max|Δσ|':>9s} {'max|Δm|':>9s} "
          f"{'edges':>11s} {'angles':>11s}")
    for folder in sorted(d.name for d in FIXTURES.iterdir() if d.is_dir()):
        ref = json.loads((FIXTURES / folder / "reference.json").read_text())
        dtype = getattr(torch, ref["dtype"])
        model = MatRIS.from_checkpoint(FIXTURES / folder / "checkpoint.pth.tar").to(dtype)
        for atoms, r in zip(read(FIXTURES / folder / "structures.extxyz", ":"), ref["structures"]):
            g = GraphBatch.from_systems([to_system(atoms)], model.cutoff, model.three_body_cutoff, dtype=dtype)
            out = model(g)
            row = dict(
                folder=folder, structure=r["name"], dtype=ref["dtype"],
                energy_per_atom=abs(out.energy_per_atom.item() - r["energy_per_atom"]),
                forces=float(np.abs(out.forces.numpy() - np.asarray(r["forces"])).max()),
                stress=float(np.abs(out.stress[0].numpy() - np.asarray(r["stress_GPa"])).max()),
                magmoms=float(np.abs(out.magmoms.numpy() - np.asarray(r["magmoms"])).max()),
                edges=(2 * g.num_bonds, r["n_directed_edges"]), angles=(g.num_angles, r["n_angles"]),
            )
            rows.append(row)
            print(f"{folder:22s} {r['name']:20s} {row['energy_per_atom']:9.1e} {row['forces']:9.1e} "
                  f"{row['stress']:9.1e} {row['magmoms']:9.1e} {'%d/%d' % row['edges']:>11s} "
                  f"{'%d/%d' % row['angles']:>11s}")
    if args.json:
        from benchmarks.common import provenance, write_json

        meta = provenance(argv, "the fixture checkpoints of tests/fixtures/official-v0.9")
        write_json(args.json, {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
