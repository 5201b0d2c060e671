"""Make the official-1.0 parity fixture of the published architecture (tests/fixtures/official-v1.0/).

    python -m benchmarks.official_fixture --site SITE     # or SITE from $MATRIS_OFFICIAL_SITE

A small model of the published family (``MatRISConfig.published_10m`` at 2 blocks of width 32,
energy head (64, 32, 32); random weights, seed 0, LayerNorm affine parts perturbed) is saved in
the published layout. Three rattled structures (Si8, MgO rocksalt, a triclinic Li-Fe-O-P cell)
are written to extxyz and read back, so both implementations see the same rounded positions.
The official MatRIS 1.0.0 (``benchmarks/official.py``: the PyPI wheel in a process of its own)
evaluates them in float64; ``reference.json`` keeps its energies (eV), forces (eV/Å) and stress
(eV/Å³, Voigt), with the command and the official version. The official code has no float64 path
of its own: the worker casts the model and builds its graph tensors in float64 from the same
inputs (see ``benchmarks/official.py``), so the numbers are the official formulas in float64.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from benchmarks.common import ROOT, write_json
from benchmarks.official import OfficialWorker, save_official_checkpoint

FOLDER = ROOT / "tests" / "fixtures" / "official-v1.0" / "small_published_float64"
CONFIG = dict(num_layers=2, node_feat_dim=32, edge_feat_dim=32, three_body_feat_dim=32, mlp_hidden_dims=(64, 32, 32))


def structures():
    from ase import Atoms
    from ase.build import bulk

    si = bulk("Si", "diamond", a=5.43, cubic=True)
    si.rattle(0.05, seed=1)
    mgo = bulk("MgO", "rocksalt", a=4.21)
    mgo.rattle(0.08, seed=2)
    rng = np.random.default_rng(3)
    cell = np.diag([4.6, 5.1, 4.9]) + rng.normal(scale=0.3, size=(3, 3))
    frac = rng.random((8, 3))
    mixed = Atoms("LiFeO4PO", scaled_positions=frac, cell=cell, pbc=True)
    # push apart atoms closer than 1.2 Å (keep the cell physical enough for a smooth basis)
    for _ in range(50):
        d = mixed.get_all_distances(mic=True) + np.eye(len(mixed)) * 10
        i, j = np.unravel_index(np.argmin(d), d.shape)
        if d[i, j] > 1.2:
            break
        mixed.positions[j] += rng.normal(scale=0.5, size=3)
    return [si, mgo, mixed]


def main(argv=None) -> int:
    from ase.io import read, write

    from matris import MatRIS, MatRISConfig

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", default=None,
                   help="the unpacked official MatRIS 1.0.0 wheel (default: $MATRIS_OFFICIAL_SITE)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = MatRIS(MatRISConfig.published_10m(**CONFIG))
    with torch.no_grad():  # LayerNorm starts at w = 1, b = 0: give the affine parts values
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    FOLDER.mkdir(parents=True, exist_ok=True)
    checkpoint = save_official_checkpoint(model, FOLDER / "checkpoint.pth.tar")
    write(FOLDER / "structures.extxyz", structures())
    atoms = read(FOLDER / "structures.extxyz", ":")
    out = {"command": "python -m benchmarks.official_fixture", "dtype": "float64",
           "config": MatRISConfig.published_10m(**CONFIG).to_dict(), "structures": []}
    with OfficialWorker(site=args.site) as official:
        info = official.load(checkpoint, mode="torch", activation_checkpoint=False, dtype="float64", threads=2)
        out["official"] = {"version": info.get("matris"), "params_printed": info.get("params")}
        for a in atoms:
            r = official.evaluate(a)
            out["structures"].append({"formula": a.get_chemical_formula(), "energy_eV": float(r["energy"]),
                                      "forces_eV_per_A": np.asarray(r["forces"]).tolist(),
                                      "stress_eV_per_A3": np.asarray(r["stress"]).tolist()})
    write_json(FOLDER / "reference.json", out)
    print(f"wrote {FOLDER.relative_to(ROOT)} ({len(atoms)} structures, official {out['official']['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
