"""Relax a structure with the Matbench-Discovery protocol (FIRE + FrechetCellFilter, fmax 0.05).

    python examples/relax.py [structure-file] [checkpoint.pth.tar]

Without arguments it relaxes a strained, rattled 8-atom Si cell with the bundled demo
model, matris-demo (distilled from CHGNet 0.3.0; model card: matris/assets/matris-demo.md): it
shows the workflow; for science pass a published model. Any file ASE reads works;
pymatgen Structures are accepted too and come back as Structures.
"""

import sys

from ase.build import bulk
from ase.io import read

from matris.simulate import relax

if len(sys.argv) > 1:
    atoms = read(sys.argv[1])
else:
    atoms = bulk("Si", "diamond", a=5.43, cubic=True)
    atoms.rattle(0.05, seed=1)
    atoms.set_cell(atoms.cell * 1.03, scale_atoms=True)  # 3% too large
checkpoint = sys.argv[2] if len(sys.argv) > 2 else None

result = relax(atoms, fmax=0.05, steps=500, model=checkpoint, trajectory="relax.extxyz")
print(f"converged: {result.converged} after {result.steps} steps, fmax {result.fmax:.4f} eV/Å")
print(f"energy: {result.energies[0]:.5f} → {result.energy:.5f} eV ({result.energy_per_atom:.5f} eV/atom)")
print(f"volume: {atoms.get_volume():.3f} → {result.atoms.get_volume():.3f} Å³")
print("trajectory (every step): relax.extxyz")
