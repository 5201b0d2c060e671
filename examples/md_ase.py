"""Molecular dynamics with the MatRIS ASE calculator, written the way ASE scripts are.

    python examples/md_ase.py [checkpoint.pth.tar]

NVT (Langevin) of 64-atom Si at 300 K for 200 fs, logging to md_ase.log and writing a
trajectory, then NVE from the equilibrated state with the energy printed as it goes. The
bundled model, matris-demo (a small MatRIS distilled from CHGNet 0.3.0; its model card is
matris/assets/matris-demo.md), is used without an argument: the dynamics are stable, with the
errors of a small model (the model card gives them); for science pass a checkpoint of a
published model such as matris-10m-oam. ``matris.simulate.md`` and ``matris md`` do the same in one call,
with progress, restart files and resumption.
"""

import sys

import numpy as np
from ase import units
from ase.build import bulk
from ase.io.trajectory import Trajectory
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary
from ase.md.verlet import VelocityVerlet

from matris import MatRISCalculator

checkpoint = sys.argv[1] if len(sys.argv) > 1 else None

atoms = bulk("Si", "diamond", a=5.43, cubic=True).repeat(2)
atoms.calc = MatRISCalculator(checkpoint, device="auto", dtype="float32", compute_stress=False)
MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
Stationary(atoms)

# NVT: Langevin thermostat, 2 fs steps, friction 0.01/fs
dyn = Langevin(atoms, timestep=2 * units.fs, temperature_K=300, friction=0.01 / units.fs, fixcm=False,
               logfile="md_ase.log", rng=np.random.default_rng(1))
traj = Trajectory("md_ase.traj", "w", atoms)
dyn.attach(traj.write, interval=10)
dyn.run(100)
traj.close()
print(f"after NVT: T = {atoms.get_temperature():.1f} K")

# NVE from there: total energy should stay put (0.5 fs for a clean check)
nve = VelocityVerlet(atoms, timestep=0.5 * units.fs)


def report():
    epot, ekin = atoms.get_potential_energy() / len(atoms), atoms.get_kinetic_energy() / len(atoms)
    print(f"step {nve.nsteps:4d}  Epot {epot:.5f}  Ekin {ekin:.5f}  Etot {epot + ekin:.5f} eV/atom  "
          f"T {atoms.get_temperature():6.1f} K")


nve.attach(report, interval=20)
nve.run(100)
