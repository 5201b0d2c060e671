"""Energy conservation in NVE: the drift, separated from the steps MatRIS takes at its cutoffs
(the instrument of the NVE tests and of ``benchmarks/nve.py``).

The published MatRIS architecture is not smooth everywhere: its energy steps when a pair of
atoms crosses the atom-graph cutoff r_c, and energy and forces step when a pair crosses the
line-graph cutoff r_3 (see docs/contract.md, "Properties of the published architecture worth knowing"). In NVE these
steps appear as small jumps of the total energy on the steps where the graph changes. This
module records the total energy and the graph's bond counts at every step and splits the
energy change into the part made on steps where the graph changed and the rest, so that
the integrator's error and the architecture's steps can be measured separately.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from matris.graph.neighbors import half_neighbor_list
from matris.structures import to_system


@dataclass
class DriftReport:
    """Energy conservation of an NVE run (energies per atom).

    drift: slope of a linear fit of the total energy against time, meV/atom/ps.
    smooth_drift: the same after removing the energy changes on steps where the graph changed.
    crossings: steps on which a pair crossed r_c or r_3. crossing_energy: sum of the energy
    changes on those steps, meV/atom. max_crossing_jump: largest of them, meV/atom.
    max_smooth_step: largest energy change on any other step, meV/atom. span: max − min of the
    total energy, meV/atom.
    """

    steps: int
    time_ps: float
    drift: float
    smooth_drift: float
    crossings: int
    crossing_energy: float
    max_crossing_jump: float
    max_smooth_step: float
    span: float

    def to_dict(self) -> dict:
        return asdict(self)


class ConservationMonitor:
    """A callback for :func:`matris.simulate.md` that records what :class:`DriftReport` needs.

    Use as ``md(..., callback=monitor)``; then ``monitor.report(timestep_fs)``. The graph of a
    step is identified by its set of pairs (i, j, image) within r_c and the subset within r_3,
    from the same neighbour search as the model's graph, so a pair leaving while another
    enters still counts as a change.
    """

    def __init__(self, cutoff: float, three_body_cutoff: float):
        self.cutoff, self.three_body_cutoff = cutoff, three_body_cutoff
        self.energy: list[float] = []
        self.topology: list[tuple[int, int]] = []

    def __call__(self, atoms, step: int) -> None:
        i, j, n, d = half_neighbor_list(to_system(atoms), self.cutoff)
        # one orientation per pair: i < j, or for a self-image pair the image with n > 0
        flip = (i > j) | ((i == j) & (np.sign(n[:, 0] * 9 + n[:, 1] * 3 + n[:, 2]) < 0))
        i, j, n = np.where(flip, j, i), np.where(flip, i, j), np.where(flip[:, None], -n, n)
        keys = ((i * len(atoms) + j) * 256 + n[:, 0] + 128) * 65536 + (n[:, 1] + 128) * 256 + n[:, 2] + 128
        short = d <= self.three_body_cutoff
        self.topology.append((hash(np.sort(keys).tobytes()), hash(np.sort(keys[short]).tobytes())))
        self.energy.append((atoms.get_potential_energy() + atoms.get_kinetic_energy()) / len(atoms))

    def report(self, timestep_fs: float) -> DriftReport:
        e = np.array(self.energy) * 1e3  # meV/atom
        t = np.arange(len(e)) * timestep_fs / 1000  # ps
        de = np.diff(e)
        changed = np.array([a != b for a, b in zip(self.topology[:-1], self.topology[1:])], dtype=bool)
        smooth = np.concatenate([[0.0], np.cumsum(np.where(changed, 0.0, de))])
        return DriftReport(
            steps=len(e) - 1, time_ps=float(t[-1]), drift=float(np.polyfit(t, e, 1)[0]),
            smooth_drift=float(np.polyfit(t, smooth, 1)[0]), crossings=int(changed.sum()),
            crossing_energy=float(de[changed].sum()),
            max_crossing_jump=float(np.abs(de[changed]).max()) if changed.any() else 0.0,
            max_smooth_step=float(np.abs(de[~changed]).max()) if (~changed).any() else 0.0,
            span=float(np.ptp(e)),
        )
