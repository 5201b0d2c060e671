"""Matbench-Discovery's geometry-optimisation metrics (matris.discovery.geometry) against values
computed by hand: the normalised RMSD after the best translation, the unmatched penalty and the
symmetry fractions."""

import numpy as np
import pytest

pytest.importorskip("pymatgen")
from pymatgen.core import Lattice, Structure  # noqa: E402

from matris.discovery.geometry import geo_opt_metrics, structure_rmsd, symmetry  # noqa: E402


def cscl(shift=0.0, a=3.0):
    return Structure(Lattice.cubic(a), ["Cs", "Cl"], [[shift / a, 0, 0], [0.5, 0.5, 0.5]])


def test_rmsd_by_hand():
    assert structure_rmsd(cscl(), cscl()) == pytest.approx(0.0, abs=1e-12)
    # Cs moved 0.1 Å along x: the best translation moves both atoms by 0.05 Å, so each is
    # 0.05 Å off; divided by the free length per atom (27/2)^(1/3) Å
    assert structure_rmsd(cscl(0.1), cscl()) == pytest.approx(0.05 / (27 / 2) ** (1 / 3), rel=1e-6)
    # ASE Atoms are accepted
    from pymatgen.io.ase import AseAtomsAdaptor

    assert structure_rmsd(AseAtomsAdaptor.get_atoms(cscl(0.1)), cscl()) == pytest.approx(
        structure_rmsd(cscl(0.1), cscl()), abs=1e-12)
    # different compositions cannot be mapped: the benchmark's penalty
    other = Structure(Lattice.cubic(3.0), ["Na", "Cl"], [[0, 0, 0], [0.5, 0.5, 0.5]])
    assert structure_rmsd(other, cscl()) == 1.0


def test_symmetry_fractions_by_hand():
    assert symmetry(cscl()) == (221, 48)
    lowered = cscl(0.3)  # Cs off the cube corner along x: tetragonal P4mm, 8 operations
    spg, ops = symmetry(lowered)
    assert spg != 221 and ops < 48
    refs = {"a": cscl(), "b": cscl(), "c": lowered}
    preds = {"a": cscl(), "b": lowered, "c": cscl(), "extra": cscl()}  # "extra": no reference, not counted
    m = geo_opt_metrics(preds, refs)
    assert m["n_structures"] == 3
    assert m["symmetry_match"] == pytest.approx(1 / 3) and m["symmetry_decrease"] == pytest.approx(1 / 3)
    assert m["symmetry_increase"] == pytest.approx(1 / 3)
    assert m["n_sym_ops_mae"] == pytest.approx(2 * (48 - ops) / 3)
    assert m["RMSD"] == pytest.approx(np.mean([m["per_material"][k]["rmsd"] for k in refs]))
    assert geo_opt_metrics({}, refs)["n_structures"] == 0
