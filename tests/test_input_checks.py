"""Users' input mistakes that must not pass silently (issue 46, items 4 and 8).

Partial occupancies (a CIF site of Fe 0.5 + Ni 0.5, which ASE reads as one element) are an error
naming the site, from Python and from every command that reads structure files, unless the user
opts in with ``majority_species`` / ``--majority-species``. Structures that are almost surely a
mistake (atoms far closer than any real crystal has them, a periodic cell whose atoms see no
neighbour within the cutoff, a relaxation that changes the volume by more than a factor 1.5)
run, with a MatRISInputWarning that names the numbers and the threshold, once per structure.
The overlap error prints enough digits that the distance never reads as the limit.
"""

import glob
import warnings
from pathlib import Path

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk, molecule
from ase.io import read

from matris import AtomicSystem, GraphBatch
from matris.calculator import MatRISCalculator
from matris.cli import main
from matris.errors import MatRISInputError, MatRISInputWarning
from matris.graph.system import MIN_DISTANCE, distinct_digits, overlap_error
from matris.simulate.relaxation import VOLUME_FACTOR, RelaxResult, volume_warnings
from matris.structure_files import read_frames
from matris.structures import implausibilities, to_system, warn_implausible

ROOT = Path(__file__).parent.parent
CUTOFF = 6.0  # Å, that of the fixture models


def cif(rows: str, a: float = 3.56, group: str = "P 1") -> str:
    return f"""data_test
_cell_length_a {a}
_cell_length_b {a}
_cell_length_c {a}
_cell_angle_alpha 90
_cell_angle_beta 90
_cell_angle_gamma 90
_symmetry_space_group_name_H-M '{group}'
loop_
_atom_site_label
_atom_site_type_symbol
_atom_site_fract_x
_atom_site_fract_y
_atom_site_fract_z
_atom_site_occupancy
{rows}"""


FENI = cif("""Fe1 Fe 0.0 0.0 0.0 0.5
Ni1 Ni 0.0 0.0 0.0 0.5
Fe2 Fe 0.5 0.5 0.0 1.0
Fe3 Fe 0.5 0.0 0.5 1.0
Fe4 Fe 0.0 0.5 0.5 1.0
""")
LI_VACANCY = cif("Li1 Li 0 0 0 0.5\nO1 O 0.5 0.5 0.5 1.0\n", a=3.0)
NACL = cif("Na1 Na 0 0 0 1.0\nCl1 Cl 0.5 0.5 0.5 1.0\n", a=5.64, group="F m -3 m")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    (d / "feni.cif").write_text(FENI)
    (d / "li.cif").write_text(LI_VACANCY)
    (d / "nacl.cif").write_text(NACL)
    Atoms("Si", cell=[1.5] * 3, pbc=True).write(d / "si_cube.extxyz")
    return d


def one_line(capsys, command: str, kind: str = "error") -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("matris: note:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"matris {command}: {kind}: "), lines[0]
    return lines[0]


# --------------------------------------------------------------------------- partial occupancies
def test_partial_occupancy_is_an_error_naming_the_site(files):
    with pytest.raises(MatRISInputError) as info:
        read_frames(files / "feni.cif")
    text = str(info.value)
    assert "feni.cif has partial occupancies: atom 0 (CIF site Fe1) is Fe 0.5 + Ni 0.5" in text
    assert "1 of 4 atoms" in text and "OrderDisorderedStructureTransformation" in text
    assert "--majority-species" in text and "\n" not in text
    with pytest.raises(MatRISInputError, match=r"atom 0 \(CIF site Li1\) is Li 0.5 \+ vacancy 0.5"):
        read_frames(files / "li.cif")


def test_majority_species_is_an_explicit_opt_in(files):
    with pytest.warns(MatRISInputWarning, match=r"1 of 4 atoms sit on partially occupied sites .*Fe 0.5 \+ Ni 0.5"):
        (atoms,) = read_frames(files / "feni.cif", majority_species=True)
    assert len(atoms) == 4 and "occupancy" not in atoms.info  # ordered now: no warning downstream
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert implausibilities(to_system(atoms), CUTOFF) == []


def test_ordered_cif_with_occupancies_reads_silently(files):
    with warnings.catch_warnings():
        warnings.simplefilter("error", MatRISInputWarning)
        (atoms,) = read_frames(files / "nacl.cif")
    assert atoms.get_chemical_formula() == "Cl4Na4"


def test_ase_atoms_with_partial_occupancies_warn(files):
    """Atoms the user read with ase.io.read themselves: ASE dropped a species; say so."""
    atoms = read(files / "feni.cif")
    with pytest.warns(MatRISInputWarning, match=r"atoms.info\['occupancy'\] holds partial occupancies .*atom 0"):
        warn_implausible(atoms, CUTOFF)


def test_disordered_pymatgen_structure_is_an_error():
    from pymatgen.core import Lattice, Structure

    s = Structure(Lattice.cubic(3.56), [{"Fe": 0.5, "Ni": 0.5}, "Fe"], [[0, 0, 0], [0.5, 0.5, 0]])
    with pytest.raises(MatRISInputError, match=r"structure \(Fe1.5Ni0.5\) is disordered: site 0 is Fe 0.5 \+ "
                                               r"Ni 0.5 .*OrderDisorderedStructureTransformation"):
        to_system(s)


@pytest.mark.parametrize("command", ["predict", "relax", "md", "eos", "phonons"])
def test_every_command_refuses_partial_occupancies(command, files, tmp_path, capsys):
    argv = [command, str(files / "feni.cif")] + ([] if command == "predict" else ["--out-dir", str(tmp_path)])
    if command == "md":
        argv = [command, str(files / "feni.cif"), "--trajectory", str(tmp_path / "t.extxyz"), "--steps", "1"]
    assert main(argv) == 2
    line = one_line(capsys, command)
    assert "atom 0 (CIF site Fe1) is Fe 0.5 + Ni 0.5" in line and "--majority-species" in line


@pytest.mark.filterwarnings("always::matris.errors.MatRISInputWarning")  # shown, as a user sees it
def test_predict_with_majority_species(files, capsys):
    assert main(["predict", str(files / "feni.cif"), "--majority-species"]) == 0
    err = capsys.readouterr().err
    assert "matris predict: warning: " in err and "--majority-species: each holds its majority species" in err


# ------------------------------------------------------------------------------ plausibility
def test_atom_in_a_tiny_cube_warns_with_the_numbers():
    (problem,) = implausibilities(to_system(Atoms("Si", cell=[1.5] * 3, pbc=True)), CUTOFF)
    assert "atom 0 and a periodic image of itself (Si–Si) are 1.500 Å apart, below 1.554 Å" in problem
    assert "0.7 × the sum of their covalent radii" in problem and "3.38 Å³ per atom" in problem


def test_isolated_atoms_in_a_periodic_cell_warn():
    atoms = Atoms("Si2", positions=[[0, 0, 0], [7, 7, 7]], cell=[14] * 3, pbc=True)
    (problem,) = implausibilities(to_system(atoms), CUTOFF)
    assert "no atom has a neighbour" in problem and "cutoff of 6 Å" in problem
    atoms.pbc = False  # two atoms in vacuum, meant as such: nothing to say
    assert implausibilities(to_system(atoms), CUTOFF) == []


def _real_crystals():
    """Real crystals, high-pressure phases included, that must never warn."""
    diamond_1tpa = bulk("C", "diamond", a=3.567 * 0.84)  # ~1 TPa: V/V0 ≈ 0.6
    cs_100gpa = bulk("Cs", "fcc", a=(4 * 20.0) ** (1 / 3))  # ~20 Å³/atom, V/V0 ≈ 0.17
    fe_core = bulk("Fe", "hcp", a=2.12, c=2.12 * 1.6)  # Earth's inner core, ~6.6 Å³/atom
    hydrogen = Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.74]], cell=[2.0, 2.0, 2.0], pbc=True)  # dense H2
    na_hp4 = bulk("Na", "fcc", a=(4 * 11.5) ** (1 / 3))  # Na near 200 GPa
    n2 = Atoms("N2", positions=[[0, 0, 0], [0, 0, 1.10]], cell=[3.5, 3.5, 3.5], pbc=True)  # N≡N, 0.77× the radii
    water = molecule("H2O")
    water.center(vacuum=4.0)
    water.pbc = True
    yield from [("Si", bulk("Si", "diamond", a=5.43)), ("NaCl", bulk("NaCl", "rocksalt", a=5.64)),
                ("diamond 1 TPa", diamond_1tpa), ("Cs 100 GPa", cs_100gpa), ("Fe core", fe_core),
                ("dense H2", hydrogen), ("Na 200 GPa", na_hp4), ("solid N2", n2), ("water in a box", water)]
    for path in sorted(glob.glob(str(ROOT / "tests/fixtures/**/*.extxyz"), recursive=True)
                       + glob.glob(str(ROOT / "matris/assets/*.extxyz"))):
        for k, atoms in enumerate(read(path, ":")):
            yield f"{Path(path).relative_to(ROOT)}[{k}]", atoms


def test_real_crystals_and_all_fixtures_never_warn():
    for name, atoms in _real_crystals():
        assert implausibilities(to_system(atoms), CUTOFF) == [], name


def test_calculator_warns_once_per_structure(model64, monkeypatch):
    """Checked on the first call and again only for a new composition or periodicity: MD steps
    pay a comparison of two byte strings, not a neighbour search."""
    import matris.structures as structures

    calls = []
    real = structures.implausibilities
    monkeypatch.setattr(structures, "implausibilities", lambda *a, **k: calls.append(1) or real(*a, **k))
    atoms = Atoms("Si", cell=[1.5] * 3, pbc=True)
    atoms.calc = MatRISCalculator(model64)
    with pytest.warns(MatRISInputWarning, match="1.500 Å apart") as record:
        atoms.get_potential_energy()
        for step in range(3):
            atoms.positions += 0.01
            atoms.cell *= 1.01
            atoms.get_potential_energy()
    assert len(record) == 1 and len(calls) == 1
    big = Atoms("Si2", positions=[[0, 0, 0], [7, 7, 7]], cell=[14] * 3, pbc=True)
    big.calc = atoms.calc
    with pytest.warns(MatRISInputWarning, match="no atom has a neighbour"):
        big.get_potential_energy()
    assert len(calls) == 2


def test_sensible_structures_run_without_warnings(model64):
    si = bulk("Si", "diamond", a=5.43)
    si.calc = MatRISCalculator(model64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MatRISInputWarning)
        si.get_potential_energy()
        model64.predict([si, bulk("Cu", "fcc", a=3.61)])


def test_predict_warns_and_can_be_told_not_to(model64):
    cube = Atoms("Si", cell=[1.5] * 3, pbc=True)
    with pytest.warns(MatRISInputWarning, match=r"structure 1 \(Si\): atom 0 and a periodic image"):
        model64.predict([bulk("Si", "diamond", a=5.43), cube])
    with warnings.catch_warnings():
        warnings.simplefilter("error", MatRISInputWarning)
        model64.predict([cube], warn_inputs=False)


@pytest.mark.filterwarnings("always::matris.errors.MatRISInputWarning")  # shown, as a user sees it
def test_cli_prints_the_warning_as_one_line(files, capsys):
    assert main(["predict", str(files / "si_cube.extxyz")]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("matris predict: warning: ")]
    assert len(lines) == 1 and "Warning:" not in err, err
    assert "(si_cube): atom 0 and a periodic image of itself (Si–Si) are 1.500 Å apart" in lines[0]


def test_large_volume_change_in_a_relaxation_warns():
    start = Atoms("Si", cell=[1.5] * 3, pbc=True, info={"name": "cube"})
    end = Atoms("Si", cell=[1.5 * 4.65 ** (1 / 3)] * 3, pbc=True)
    with pytest.warns(MatRISInputWarning, match=r"structure \(cube\): the relaxation changed the volume by \+365 %, "
                                                r"from 3.375 Å³ to 15.69 Å³"):
        (message,) = volume_warnings(start, end)
    assert f"more than a factor of {VOLUME_FACTOR}" in message
    fine = Atoms("Si", cell=[1.5 * 1.4 ** (1 / 3)] * 3, pbc=True)
    assert volume_warnings(start, fine) == []
    result = RelaxResult(structure=end, atoms=end, energy=0.0, energy_per_atom=0.0, forces=np.zeros((1, 3)),
                         stress=None, fmax=0.0, steps=1, converged=True, warnings=[message])
    assert result.to_dict()["warnings"] == [message]


def test_relax_reports_the_volume_change(model64, monkeypatch):
    """The fixture model grows the 1.5 Å cube by ~28 %: a limit of 1.1 shows the wiring."""
    from matris.simulate import relax, relaxation

    monkeypatch.setattr(relaxation, "VOLUME_FACTOR", 1.1)
    with pytest.warns(MatRISInputWarning) as record:
        r = relax(Atoms("Si", cell=[1.5] * 3, pbc=True), model=model64, steps=60)
    assert r.atoms.get_volume() / 3.375 > 1.1
    assert len(r.warnings) == 1 and "from 3.375 Å³" in r.warnings[0] and "more than a factor of 1.1" in r.warnings[0]
    assert r.to_dict()["warnings"] == r.warnings
    assert [str(w.message) for w in record].count(r.warnings[0]) == 1  # also warned, once
    assert relax(bulk("Si", "diamond", a=5.43), model=model64, steps=2).warnings == []


# ------------------------------------------------------------------------------ overlap message
@pytest.mark.parametrize("d", [0.0, 0.05, 0.0999, 0.09999, 0.09999999, 0.1 - 1e-12])
def test_the_overlap_message_never_reads_as_the_limit(d):
    text = distinct_digits(d, MIN_DISTANCE)
    assert float(text) < MIN_DISTANCE and text != f"{MIN_DISTANCE:.{len(text.split('.')[1])}f}"
    message = str(overlap_error("structure 0", 0, 1, d))
    assert f"atoms 0 and 1 are {text} Å apart, closer than 0.1 Å" in message


def test_every_builder_gives_the_same_overlap_message():
    from matris.data.packing import _prepare
    from matris.simulate.inputs import check_structure

    system = AtomicSystem([[0, 0, 0], [0.09999, 0, 0]], np.eye(3) * 5, True, [14, 14], "pair")
    with pytest.raises(MatRISInputError, match=r"atoms 0 and 1 are 0\.09999 Å apart, closer than 0\.1 Å"):
        GraphBatch.from_systems([system], 5.0, 3.0)
    atoms = Atoms("Si2", positions=system.positions, cell=system.cell, pbc=True)
    with pytest.raises(MatRISInputError, match=r"0\.09999 Å apart, closer than 0\.1 Å"):
        check_structure(atoms)

    class Sample:
        pass

    sample = Sample()
    sample.system = system
    with pytest.raises(MatRISInputError, match=r"0\.09999 Å apart, closer than 0\.1 Å"):
        _prepare(sample, 0, 5.0, 3.0)
    pytest.importorskip("vesin_torch")
    import torch

    with pytest.raises(MatRISInputError, match=r"structure 0 \(pair\): atoms 0 and 1 are 0\.09999 Å apart"):
        GraphBatch.from_tensors(torch.tensor(system.positions), torch.tensor(system.cell)[None], torch.tensor([True]),
                                torch.tensor([14, 14]), [2], 5.0, 3.0, names=["pair"])



# ------------------------------------------------------------------- NaN and infinite input
# Issue 60, item 4: a NaN or infinite position or lattice vector is the same one-line
# MatRISInputError at every entry point, raised before any neighbour search (the neighbour-list
# library fails on it with a RuntimeError, and a NaN cell crashed the calculator's plausibility
# check with a floating-point trap).
FINITE_HINT = "positions and the cell must be finite numbers — check how the structure was made."


def _si8(bad: str | None = None) -> Atoms:
    atoms = bulk("Si", "diamond", a=5.43, cubic=True)
    if bad == "nan position":
        atoms.positions[0, 0] = np.nan
    elif bad == "inf position":
        atoms.positions[1, 2] = np.inf
    elif bad == "nan cell":
        cell = np.array(atoms.cell)
        cell[1, 1] = np.nan
        atoms.set_cell(cell, scale_atoms=False)
    return atoms


NON_FINITE = {
    "nan position": "atom 0 has a NaN or infinite position (nan, 0.0, 0.0) Å",
    "inf position": "atom 1 has a NaN or infinite position (1.3575, 1.3575, inf) Å",
    "nan cell": "lattice vector b of the cell is NaN or infinite (0.0, nan, 0.0) Å",
}


@pytest.fixture(scope="module")
def demo():
    from matris import MatRIS

    return MatRIS.load("matris-demo")  # the bundled demo model: small, offline


@pytest.fixture
def no_neighbour_search(monkeypatch):
    """Any neighbour search fails the test: the check must come before all of them."""
    import vesin

    class NoSearch:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a neighbour search ran on non-finite input")

    monkeypatch.setattr(vesin, "NeighborList", NoSearch)


def _non_finite(run, who: str | tuple[str, ...], bad: str) -> str:
    with pytest.raises(MatRISInputError) as info:
        run()
    text = str(info.value)
    assert isinstance(info.value, ValueError)
    assert text in [f"{w}: {NON_FINITE[bad]}; {FINITE_HINT}" for w in ((who,) if isinstance(who, str) else who)], text
    assert "\n" not in text
    return text


@pytest.mark.parametrize("bad", list(NON_FINITE))
def test_non_finite_input_in_predict(bad, demo, no_neighbour_search):
    _non_finite(lambda: demo.predict(_si8(bad)), "structure 0 (Si8)", bad)
    good = Atoms("Si2", positions=[[0, 0, 0], [1.36, 1.36, 1.36]], cell=np.eye(3) * 5.43, pbc=True)
    _non_finite(lambda: demo.predict([good, _si8(bad)], warn_inputs=False), "structure 1 (Si8)", bad)


@pytest.mark.parametrize("bad", list(NON_FINITE))
def test_non_finite_input_in_the_calculator(bad, demo, no_neighbour_search):
    """Before the calculator's plausibility check: its neighbour search must not meet the NaN."""
    atoms = _si8(bad)
    atoms.calc = MatRISCalculator(demo)
    _non_finite(atoms.get_potential_energy, "structure (Si8)", bad)


def test_positions_that_turn_nan_after_a_good_call(demo):
    """A run that diverges (same composition: the plausibility check is not repeated) meets the
    same error in the graph builder."""
    atoms = _si8()
    atoms.calc = MatRISCalculator(demo)
    assert np.isfinite(atoms.get_potential_energy())
    atoms.positions[0, 0] = np.nan
    _non_finite(atoms.get_forces, ("structure (Si8)", "structure 0 (Si8)"), "nan position")


@pytest.mark.parametrize("bad", list(NON_FINITE))
def test_non_finite_input_in_relax_and_md(bad, demo, no_neighbour_search):
    from matris.simulate import md, relax

    _non_finite(lambda: relax(_si8(bad), model=demo, steps=1), "structure (Si8)", bad)
    _non_finite(lambda: relax(_si8(bad), model=demo, steps=1, relax_cell=False), "structure (Si8)", bad)
    _non_finite(lambda: md(_si8(bad), model=demo, steps=1), "structure (Si8)", bad)


def test_a_nan_in_a_non_periodic_cell_row_is_an_error_too(demo, no_neighbour_search):
    """The model shifts every bond by image · cell, so a NaN row gave NaN energies and forces."""
    atoms = _si8("nan cell")
    atoms.pbc = [True, False, True]
    _non_finite(lambda: demo.predict(atoms), "structure 0 (Si8)", "nan cell")


@pytest.mark.parametrize("bad", list(NON_FINITE))
def test_non_finite_input_in_torch_sim(bad, demo, no_neighbour_search):
    ts = pytest.importorskip("torch_sim")
    import torch

    from matris.simulate import md_batch, relax_batch
    from matris.simulate.batched import MatRISModel

    model = MatRISModel(demo, device="cpu")
    state = ts.io.atoms_to_state([_si8(bad)], torch.device("cpu"), model.dtype)
    _non_finite(lambda: model(state), "structure 0 (Si8)", bad)
    # the bad structure second in the batch: its own index and its own atom numbering
    state = ts.io.atoms_to_state([bulk("Cu", "fcc", a=3.61), _si8(bad)], torch.device("cpu"), model.dtype)
    _non_finite(lambda: model(state), "structure 1 (Si8)", bad)
    _non_finite(lambda: relax_batch([_si8(bad)], model=model, steps=1), "structure 0 (Si8)", bad)
    _non_finite(lambda: md_batch([_si8(bad)], model=model, steps=1), "structure 0 (Si8)", bad)


def test_the_torch_sim_check_costs_one_reduction_when_all_is_finite(demo):
    pytest.importorskip("torch_sim")
    import torch

    from matris.simulate.batched import check_finite_state

    positions = torch.zeros(4, 3)
    cell = torch.eye(3)[None].repeat(2, 1, 1) * 4
    numbers, index = torch.tensor([14, 14, 29, 29]), torch.tensor([0, 0, 1, 1])
    check_finite_state(positions, cell, numbers, index)  # fine: nothing raised
    positions[3, 1] = -np.inf
    with pytest.raises(MatRISInputError, match=r"^structure 1 \(Cu2\): atom 1 has a NaN or infinite position "
                                               r"\(0\.0, -inf, 0\.0\) Å"):
        check_finite_state(positions, cell, numbers, index)
