"""Quickstart: energy, forces, stress and magnetic moments with MatRIS.

    python examples/quickstart.py [checkpoint.pth.tar]

Without an argument it uses the bundled model, matris-demo (distilled from CHGNet 0.3.0; model
card: matris/assets/matris-demo.md): numbers for checking an installation; for science pass a
published model.
"""

import sys

import numpy as np
from ase.build import bulk, molecule
from pymatgen.core import Lattice, Structure

from matris import MatRIS, MatRISCalculator

checkpoint = sys.argv[1] if len(sys.argv) > 1 else None
model = MatRIS.load(checkpoint)  # float32 on the CPU; MatRIS.load(path, device="cuda", dtype=torch.float64)
print(f"model: {model.config.num_layers} blocks, width {model.config.node_feat_dim}, "
      f"r_c {model.cutoff} Å, r_3 {model.three_body_cutoff} Å, {model.num_parameters():,} parameters")

# 1. ASE calculator, as in any ASE script
atoms = bulk("Si", "diamond", a=5.43, cubic=True)
atoms.rattle(0.05, seed=1)
atoms.calc = MatRISCalculator(model)
print("Si8 energy (eV):", atoms.get_potential_energy())
print("max |F| (eV/Å):", np.linalg.norm(atoms.get_forces(), axis=1).max())
print("stress (eV/Å³, Voigt):", atoms.get_stress())

# 2. Batched prediction over ASE Atoms and pymatgen Structures together
nacl = Structure.from_spacegroup("Fm-3m", Lattice.cubic(5.64), ["Na", "Cl"], [[0, 0, 0], [0.5, 0.5, 0.5]])
structures = [atoms, nacl, molecule("H2O"), bulk("Cu", "fcc", a=3.6)]
for pred in model.predict(structures, batch_size=4):
    pressure = "—" if pred.stress is None else f"{-np.trace(pred.stress) / 3:.3f} GPa"
    print(f"{pred.name:8s} E/atom {pred.energy_per_atom:9.4f} eV   P {pressure}")
