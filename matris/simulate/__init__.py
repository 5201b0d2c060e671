"""Simulations with MatRIS: relaxation, molecular dynamics, equation of state, phonons, and
batched relaxation/MD of many structures on one device through torch-sim.

Every function takes ASE Atoms or pymatgen Structures and defaults to the bundled model.
The batched path needs the optional ``torch-sim-atomistic`` package (``pip install
'matris-mlip[sim]'``) and is imported only when used; phonons need phonopy (``pip install
'matris-mlip[phonons]'``), loaded when :func:`phonons` runs.
"""

from .dynamics import MDResult, md
from .eos import EOSResult, equation_of_state
from .phonon import PhononResult, phonons
from .relaxation import RelaxResult, relax

__all__ = [
    "relax", "RelaxResult", "md", "MDResult", "equation_of_state", "EOSResult", "phonons", "PhononResult",
    "relax_batch", "md_batch", "BatchMDResult", "MatRISModel",
]

_BATCHED = ("relax_batch", "md_batch", "BatchMDResult", "MatRISModel")


def __getattr__(name):
    # torch-sim is optional: load the batched path only when it is asked for
    if name in _BATCHED:
        from . import batched

        return getattr(batched, name)
    raise AttributeError(f"module 'matris.simulate' has no attribute {name!r}")
