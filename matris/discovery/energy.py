"""From a model's relaxed energies to formation energies and hull distances, as
matbench-discovery computes them.

1. :func:`mp2020_corrected_energies`: each WBM ``ComputedStructureEntry`` gets the model's
   energy and relaxed structure, then pymatgen's ``MaterialsProject2020Compatibility``
   (``clean=True``) applies the MP2020 anion and GGA+U corrections (they depend on the
   structure and on the DFT calculation's parameters, which the entry carries).
2. :func:`formation_energy_per_atom`: ``(E − Σ_el n_el · μ_el) / N`` with the MP elemental
   reference energies μ (matbench-discovery's ``get_e_form_per_atom``).
3. The predicted hull distance, either shifted from the DFT one (matbench-discovery's
   protocol: ``each_pred = each_true + e_form_pred − e_form_dft``, done in
   :mod:`matris.discovery.metrics`) or measured directly on a convex hull of given entries
   with :class:`HullReference`.

Energies are eV (totals) and eV/atom (per atom).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping

from ..errors import MatRISInputError, counted
from ..extras import require


def mp2020_corrected_energies(entries: Mapping[str, Any], relaxed: Mapping[str, tuple[float, Any]],
                              progress: bool = False) -> dict[str, float]:
    """MP2020-corrected total energies (eV) of the model's relaxed structures.

    Args:
        entries: material id → the DFT ``ComputedStructureEntry`` (object or dict) of that material.
        relaxed: material id → (model total energy, eV; relaxed pymatgen Structure).

    Returns material id → corrected energy; NaN where the compatibility scheme rejects the entry
    (pymatgen drops entries it cannot correct, e.g. an unsupported run type).
    """
    require("pymatgen", "discovery", "MP2020 corrections")
    from pymatgen.entries.compatibility import MaterialsProject2020Compatibility
    from pymatgen.entries.computed_entries import ComputedStructureEntry

    missing = [m for m in relaxed if m not in entries]
    if missing:
        raise MatRISInputError(
            f"no DFT computed structure entry for {counted(len(missing), 'relaxed material')} ({missing[:3]}…); "
            "MP2020 corrections "
            "need each material's DFT calculation parameters: give the WBM computed-structure-entries file that "
            "covers these ids"
        )
    batch = []
    for mid, (energy, structure) in relaxed.items():
        source = entries[mid]
        data = dict(source if isinstance(source, dict) else source.as_dict())
        data.setdefault("correction", 0.0)  # some published entry dicts lack these two keys
        data.setdefault("energy_adjustments", [])
        cse = ComputedStructureEntry.from_dict(data)  # a new object: the caller's entry is left alone
        if structure.composition.reduced_composition != cse.structure.composition.reduced_composition:
            raise MatRISInputError(
                f"{mid}: the relaxed structure ({structure.composition.formula}) and the DFT entry "
                f"({cse.structure.composition.formula}) are not the same material; the structures file and the "
                "entries file do not match"
            )
        cse._energy = float(energy)  # the uncorrected energy, as in matbench-discovery's join scripts
        cse._structure = structure
        cse.entry_id = mid
        batch.append(cse)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="pymatgen")  # oxidation-state guesses
        processed = MaterialsProject2020Compatibility().process_entries(batch, clean=True, verbose=progress)
    out = {mid: float("nan") for mid in relaxed}
    for cse in processed:
        out[cse.entry_id] = float(cse.energy)
    return out


def formation_energy_per_atom(energy: float, composition: Any, references: Mapping[str, float]) -> float:
    """Formation energy, eV/atom, of total energy ``energy`` (eV) for ``composition`` (pymatgen
    Composition or formula) against elemental reference energies (eV/atom)."""
    require("pymatgen", "discovery", "formation energies")
    from pymatgen.core import Composition

    comp = Composition(composition) if not hasattr(composition, "num_atoms") else composition
    missing = [str(el) for el in comp if str(el) not in references]
    if missing:
        raise MatRISInputError(f"no elemental reference energy for {', '.join(missing)} ({comp.formula}); give "
                               "elemental references that cover every element of the test set")
    if not math.isfinite(energy):
        return float("nan")
    return (energy - sum(comp[el] * references[str(el)] for el in comp)) / comp.num_atoms


class HullReference:
    """A convex hull of given entries (energies already corrected, eV) to measure predicted
    entries against.

    ``e_above_hull(composition, energy)`` is the signed distance to the hull, eV/atom
    (negative: below it, i.e. the prediction would pull the hull down);
    ``formation_energy(composition, energy)`` uses the hull's own elemental references.
    A pymatgen ``PhaseDiagram`` is built for up to ``patched_above`` elements, a
    ``PatchedPhaseDiagram`` (as for the MP hull in matbench-discovery) beyond.
    """

    def __init__(self, entries: list, patched_above: int = 6):
        require("pymatgen", "discovery", "the convex hull")
        from pymatgen.analysis.phase_diagram import PatchedPhaseDiagram, PhaseDiagram

        if not entries:
            raise MatRISInputError("the hull needs entries: give a file of pymatgen entries (--hull-entries)")
        elements = {el for e in entries for el in e.composition.elements}
        self.elements = {str(el) for el in elements}
        cls = PhaseDiagram if len(elements) <= patched_above else PatchedPhaseDiagram
        self.diagram = cls(entries)

    def _entry(self, composition, energy: float):
        require("pymatgen", "discovery", "hull distances")
        from pymatgen.analysis.phase_diagram import PDEntry
        from pymatgen.core import Composition

        comp = Composition(composition) if not hasattr(composition, "num_atoms") else composition
        outside = [str(el) for el in comp if str(el) not in self.elements]
        if outside:
            which = f"element {outside[0]} is" if len(outside) == 1 else f"elements {', '.join(outside)} are"
            raise MatRISInputError(f"{comp.formula}: {which} not in the hull entries; "
                                   "give hull entries of every element of the test set")
        return PDEntry(comp, float(energy))

    def e_above_hull(self, composition, energy: float) -> float:
        """Signed distance (eV/atom) of ``energy`` (eV, total) at ``composition`` from the hull."""
        if not math.isfinite(energy):
            return float("nan")
        _, e_hull = self.diagram.get_decomp_and_e_above_hull(self._entry(composition, energy), allow_negative=True)
        return float(e_hull)

    def formation_energy(self, composition, energy: float) -> float:
        """Formation energy (eV/atom) against the hull's lowest elemental entries."""
        if not math.isfinite(energy):
            return float("nan")
        return float(self.diagram.get_form_energy_per_atom(self._entry(composition, energy)))


__all__ = ["mp2020_corrected_energies", "formation_energy_per_atom", "HullReference"]
