"""MatRIS on a domain decomposition (LAMMPS across MPI ranks): each rank evaluates its own atoms,
bonds and angles and exchanges, inside every block, what the block reads from other ranks.

:mod:`matris.domain.evaluate` is the method (what is computed where, what is exchanged when);
:mod:`matris.domain.halo` the ghost atoms' identity across ranks and the exchanges themselves.
Tensors only: the LAMMPS pair style supplies the ranks' atoms and the exchanges;
:func:`matris.lammps.ranks.simulate` runs every rank in one process.
"""

from .evaluate import EXCHANGES, RankGraph, RankResult, Subdomain, build_graphs, evaluate
from .halo import Comm, forward_exchange

__all__ = ["EXCHANGES", "Comm", "RankGraph", "RankResult", "Subdomain", "build_graphs", "evaluate", "forward_exchange"]
