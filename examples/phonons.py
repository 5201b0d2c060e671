"""Phonons of diamond Si with phonopy and MatRIS forces: band structure, DOS, thermal properties.

    python examples/phonons.py [checkpoint.pth.tar]

Relaxes the 2-atom primitive cell tightly first (phonons need a minimum), then uses a
2×2×2 supercell (16 atoms). Writes phonons-Si.png and phonopy_params.yaml. With the bundled
model, matris-demo (distilled from CHGNet 0.3.0; model card: matris/assets/matris-demo.md), the
bands show the workflow at a small model's accuracy; for science pass a published model.
"""

import sys

import torch
from ase.build import bulk

from matris import MatRIS
from matris.simulate import phonons, relax

model = MatRIS.load(sys.argv[1] if len(sys.argv) > 1 else None, dtype=torch.float64)  # clean force constants
relaxed = relax(bulk("Si", "diamond", a=5.43), fmax=0.005, model=model).atoms
result = phonons(relaxed, supercell=2, mesh=20, t_max=1000, model=model, plot="phonons-Si.png",
                 save="phonopy_params.yaml")
print(f"frequencies {result.min_frequency:.3f} … {result.band['frequencies'].max():.3f} THz; "
      f"imaginary modes: {result.has_imaginary}")
t = result.thermal
for k in range(0, len(t["temperatures"]), 20):
    print(f"T {t['temperatures'][k]:6.0f} K  F {t['free_energy'][k]:8.3f} kJ/mol  S {t['entropy'][k]:7.3f} J/K/mol  "
          f"Cv {t['heat_capacity'][k]:7.3f} J/K/mol")
print("plot: phonons-Si.png")
