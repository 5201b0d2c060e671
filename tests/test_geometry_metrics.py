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


def _perturbed_set():
    """20 (ML, DFT) pairs: Si, SrTiO3, CsCl and NaCl with one atom moved 0, 0.005, 0.01, 0.05, 0.2 Å."""
    from ase.build import bulk
    from pymatgen.io.ase import AseAtomsAdaptor

    def si(d):
        a = bulk("Si", "diamond", a=5.43)
        a.positions[0, 0] += d
        return AseAtomsAdaptor.get_structure(a)

    def sto(d):
        s = Structure(Lattice.cubic(3.905), ["Sr", "Ti", "O", "O", "O"],
                      [[0, 0, 0], [0.5, 0.5, 0.5], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
        s.translate_sites([1], [d / 3.905, 0, 0], frac_coords=True)
        return s

    def nacl(d):
        a = bulk("NaCl", "rocksalt", a=5.64)
        a.positions[1, 2] += d
        return AseAtomsAdaptor.get_structure(a)

    refs, preds = {}, {}
    for name, f in {"Si": si, "SrTiO3": sto, "CsCl": cscl, "NaCl": nacl}.items():
        for d in (0.0, 0.005, 0.01, 0.05, 0.2):
            refs[f"{name}_{d}"], preds[f"{name}_{d}"] = f(0.0), f(d)
    return preds, refs


@pytest.mark.slow
def test_symmetry_fractions_equal_the_benchmarks_own_code():
    """The values the benchmark's get_sym_info_from_structs + pred_vs_ref_struct_symmetry +
    calc_geo_opt_metrics (matbench-discovery @ 2c7f9fc4, moyopy) give on these 20 pairs; spglib
    (the package before) gave symmetry_match 0.25 and n_sym_ops_mae 30 at symprec 1e-2."""
    pytest.importorskip("moyopy")
    preds, refs = _perturbed_set()
    assert symmetry(preds["Si_0.01"], 1e-2) == (74, 8) and symmetry(preds["NaCl_0.01"], 1e-2) == (225, 48)
    assert symmetry(preds["NaCl_0.01"], 1e-5) == (107, 8)
    expected = {1e-2: (0.45, 0.55, 0.0, 22.0), 1e-5: (0.2, 0.8, 0.0, 32.0)}
    for symprec, (match, decrease, increase, mae) in expected.items():
        m = geo_opt_metrics(preds, refs, symprec)
        assert (m["symmetry_match"], m["symmetry_decrease"], m["symmetry_increase"]) == pytest.approx(
            (match, decrease, increase), abs=1e-15)
        assert m["n_sym_ops_mae"] == mae and m["n_structures"] == 20
        assert m["RMSD"] == pytest.approx(0.009892601794264499, rel=1e-9)
