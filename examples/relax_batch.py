"""Relax many structures together on one device with torch-sim (pip install 'matris-mlip[sim]').

    python examples/relax_batch.py [n_structures] [device]

Builds n (default 32) rattled, strained Si cells and relaxes them all in one batch with
torch-sim's FIRE + Fréchet cell filter, the batched twin of ``matris.simulate.relax``;
converged structures leave the batch as they finish. On a GPU use device "cuda" and
hundreds of structures. ``matris relax FILES --batch`` does the same from the command line.
"""

import sys
import time

from ase.build import bulk

from matris.simulate import relax_batch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 32
device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
structures = []
for k in range(n):
    atoms = bulk("Si", "diamond", a=5.43 * (1 + 0.01 * (k % 5 - 2)), cubic=True)
    atoms.rattle(0.05, seed=k)
    structures.append(atoms)

t0 = time.perf_counter()
results = relax_batch(structures, fmax=0.05, steps=500, device=device)
elapsed = time.perf_counter() - t0
print(f"{n} structures in {elapsed:.1f} s ({n / elapsed:.2f} structures/s on {device}); "
      f"{sum(r.converged for r in results)} converged")
for k, r in enumerate(results[:5]):
    print(f"  {k}: E {r.energy_per_atom:.5f} eV/atom, fmax {r.fmax:.4f} eV/Å, V {r.atoms.get_volume():.2f} Å³")
