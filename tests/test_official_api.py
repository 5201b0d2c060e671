"""The official MatRIS 1.0 API (issue 60): its scripts' calls give our numbers, exactly.

Each official entry point (``matris.applications``, the official model surface) is checked in
float64 against our own API on the same model, so a mistake in the thin layer (a sign, a unit, an
edge numbering, a task's keys) fails here; the side-by-side comparison with the official package
itself is ``benchmarks/official_api.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import pickle
import warnings

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule

from matris import MatRIS, MatRISConfig
from matris.calculator import MatRISCalculator as OurCalculator
from matris.graph import GraphBatch, RadiusGraph
from matris.graph.radiusgraph import batch_to_graph, graphs_to_batch
from matris.structures import to_system

SMALL = dict(num_layers=2, node_feat_dim=16, edge_feat_dim=16, three_body_feat_dim=16, mlp_hidden_dims=(16, 16))
HAVE_PYMATGEN = importlib.util.find_spec("pymatgen") is not None
HAVE_TORCH_SIM = importlib.util.find_spec("torch_sim") is not None


def _model(**overrides) -> MatRIS:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(17)
        model = MatRIS(**{**SMALL, **overrides})
        if model.reference_energy is not None:
            torch.nn.init.normal_(model.reference_energy.fc.weight, std=1.0)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small model with reference energies saved the official way, and the model."""
    model = _model(reference_energy="fitted")
    path = tmp_path_factory.mktemp("official") / "model.pth.tar"
    torch.save({"config": model.config, "state_dict": model.state_dict()}, path)
    return path, model


def _si(rattle: float = 0.03) -> Atoms:
    atoms = bulk("Si", "diamond", a=5.43, cubic=True)
    atoms.positions += np.random.default_rng(0).normal(0, rattle, atoms.positions.shape)
    return atoms


def _ours(model: MatRIS, atoms_list, **kw):
    g = GraphBatch.from_systems([to_system(a) for a in atoms_list], model.cutoff, model.three_body_cutoff,
                                dtype=torch.float64)
    return model.to(torch.float64)(g, compute_magmoms=True, **kw)


# ----------------------------------------------------------------------------- the model surface
def test_constructor_config_and_checkpoints(saved, tmp_path):
    path, model = saved
    # official keywords and positional order build our config
    assert MatRIS(**SMALL).config == MatRISConfig(**SMALL)
    assert MatRIS(2, 16, 16, 16, (16, 16)).config == MatRISConfig(**SMALL)
    with pytest.raises(TypeError, match="did you mean 'num_layers'"):
        MatRIS(num_layer=2)
    # the config reads as the official dict
    config = model.config
    assert config["pairwise_cutoff"] == 6.0 and config.get("missing", 1) == 1 and "num_layers" in config
    assert dict(config)["num_layers"] == 2 and MatRIS(**config).config == config
    assert type(copy.deepcopy(model).config) is MatRISConfig
    assert type(pickle.loads(pickle.dumps(model)).config) is MatRISConfig
    # saved the official way: torch.load(weights_only=True) reads it (as the official loader does)
    raw = torch.load(path, weights_only=True)
    assert isinstance(raw["config"], dict) and raw["config"]["num_layers"] == 2
    loaded = MatRIS.load(model_name=path, device=None)
    assert loaded.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    for other in (loaded, MatRIS.from_dict(raw), MatRIS.from_dict({"model": raw})):
        assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), model.state_dict().values()))
    assert loaded.get_params() == sum(p.numel() for p in model.parameters()) and loaded.is_intensive
    with pytest.raises(TypeError, match="both model and model_name"):
        MatRIS.load(path, model_name=path)


def test_graph_converter_and_forward_match_ours(saved):
    _, model = saved
    model = copy.deepcopy(model).to(torch.float64).eval()
    structures = [_si(), molecule("H2O")]
    graphs = [model.graph_converter(a) for a in structures]
    assert graphs[0].atom_frac_coord.dtype == torch.float64 and "RadiusGraph(" in repr(graphs[0])
    expected = _ours(model, structures)
    got = model(graphs, task="efsm", mode="torch")
    assert set(got) == {"e", "f", "s", "m", "atoms_per_graph", "ref_energy"}
    torch.testing.assert_close(got["e"], expected.energy_per_atom, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat(got["f"]), expected.forces, rtol=0, atol=1e-12)
    torch.testing.assert_close(got["s"][0], expected.stress[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(torch.cat(got["m"]), expected.magmoms, rtol=0, atol=1e-12)
    assert got["atoms_per_graph"].tolist() == [8, 3] and got["atoms_per_graph"].dtype == torch.int32
    ref = model.reference_energy.fc.weight[0]
    torch.testing.assert_close(got["ref_energy"][1], (2 * ref[0] + ref[7]) / 3)
    # the fused kernels give the same numbers; each task gives its keys
    fast = model(graphs, task="efs", mode="fast")
    torch.testing.assert_close(torch.cat(fast["f"]), expected.forces, rtol=0, atol=1e-10)
    for task, keys in {"e": set(), "em": {"m"}, "ef": {"f"}, "efs": {"f", "s"}}.items():
        assert set(model(graphs, task=task)) - {"e", "atoms_per_graph", "ref_energy"} == keys
    for bad in ({"task": "fs"}, {"mode": "eager"}):
        with pytest.raises(ValueError, match="task|mode"):
            model(graphs, **bad)


def test_any_official_numbering_of_the_edges(saved):
    """An official graph may list a bond's two directed edges in any order and place: the batch
    built from it is the same structure (the official converter orders them by centre atom)."""
    _, model = saved
    model = copy.deepcopy(model).to(torch.float64).eval()
    graph = model.graph_converter(_si())
    n_e = graph.atom_graph.shape[0]
    perm = torch.randperm(n_e, generator=torch.Generator().manual_seed(1))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n_e)
    d2u = graph.directed2undirected[perm]
    # each bond's forward edge: a random one of its two directed edges
    first = {}
    for k, u in enumerate(d2u.tolist()):
        first.setdefault(u, []).append(k)
    pick = torch.Generator().manual_seed(2)
    u2d = torch.tensor([first[u][int(torch.randint(2, (1,), generator=pick))] for u in range(len(first))],
                       dtype=torch.int32)
    line = graph.line_graph.clone().long()
    line[:, 2], line[:, 4] = inverse[line[:, 2]], inverse[line[:, 4]]
    shuffled = RadiusGraph(None, None, None, graph.atomic_number, graph.atom_frac_coord, graph.lattice,
                           graph.neighbor_image[perm], graph.atom_graph[perm], 6.0, line.int(), 4.0, d2u, u2d)
    a, b = model([graph], task="efs"), model([shuffled, graph], task="efs")
    torch.testing.assert_close(b["e"][0], a["e"][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(b["f"][0], a["f"][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(b["s"][0], a["s"][0], rtol=0, atol=1e-10)


def test_radius_graph_files_and_batches(tmp_path, saved):
    _, model = saved
    graph = model.graph_converter(_si(), graph_id="si8")
    path = graph.save(save_dir=str(tmp_path))
    assert path.endswith("si8.pt")
    again = RadiusGraph.from_file(path)
    for name in RadiusGraph._TENSORS:
        assert torch.equal(getattr(again, name), getattr(graph, name))
    batch = graphs_to_batch([graph, again])
    assert batch.num_structures == 2 and batch.num_angles == 2 * graph.line_graph.shape[0]
    back = batch_to_graph(batch, 1)
    assert torch.equal(back.atom_graph, graph.atom_graph) and torch.equal(back.line_graph, graph.line_graph)
    with pytest.raises(ValueError, match="directed edges"):
        RadiusGraph(None, None, None, graph.atomic_number, graph.atom_frac_coord, graph.lattice,
                    graph.neighbor_image, graph.atom_graph, 6.0, graph.line_graph, 4.0,
                    graph.directed2undirected, graph.undirected2directed[:-1])
    with pytest.raises(ValueError, match="RadiusGraph"):
        graphs_to_batch([batch])


def test_compile_defaults():
    from torch.fx.experimental import _config

    import matris.model.compile  # noqa: F401 - applies the defaults

    assert _config.use_duck_shape is False


# ----------------------------------------------------------------------------- the calculator
def test_calculator_results_by_task(saved):
    from matris.applications.base import MatRISCalculator

    path, model = saved
    atoms = _si()
    ours = OurCalculator(model, dtype="float64")
    atoms.calc = ours
    energy, forces, stress = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress(voigt=False)
    magmoms = atoms.get_magnetic_moments()
    calc = MatRISCalculator(path, task="efsm", dtype="float64", mode="torch")
    assert not any(p.requires_grad for p in calc.model.parameters())
    assert calc.implemented_properties == ["energy", "forces", "stress", "magmoms"]
    atoms.calc = calc
    assert atoms.get_potential_energy() == pytest.approx(energy, abs=1e-10)
    np.testing.assert_allclose(atoms.get_forces(), forces, atol=1e-10)
    assert calc.results["stress"].shape == (3, 3)  # the official calculator's shape (eV/Å³)
    np.testing.assert_allclose(calc.results["stress"], stress, atol=1e-12)
    np.testing.assert_allclose(atoms.get_magnetic_moments(), magmoms, atol=1e-10)
    ref = model.reference_energy.fc.weight[0, 13].item() * len(atoms)
    assert calc.results["ref_energy"] == pytest.approx(ref, rel=1e-12)
    energy_only = MatRISCalculator(path, task="e", dtype="float64")
    atoms.calc = energy_only
    assert atoms.get_potential_energy() == pytest.approx(energy, abs=1e-10)
    assert set(energy_only.results) == {"energy", "free_energy", "ref_energy"}
    with pytest.raises(Exception, match="forces"):
        atoms.get_forces()


def test_calculator_keywords(saved):
    from matris.applications.base import MatRISCalculator

    path, _ = saved
    with pytest.raises(TypeError, match="activation_checkpoint instead"):
        MatRISCalculator(path, checkpoint=True)
    with pytest.raises(TypeError, match="'devcie'; did you mean 'device'"):
        MatRISCalculator(path, devcie="cuda")
    with pytest.raises(TypeError, match="'devcie'; did you mean 'device'"):
        OurCalculator(path, devcie="cuda")
    with pytest.raises(ValueError, match="task"):
        MatRISCalculator(path, task="fe")
    with pytest.raises(ValueError, match="mode"):
        MatRISCalculator(path, mode="eager")
    calc = MatRISCalculator(path, mode="torch", activation_checkpoint=False, label="run")
    assert calc.run_options.kernels == "torch" and calc.run_options.memory_level == 0 and calc.label == "run"
    assert MatRISCalculator(path).run_options.memory_level is None  # adaptive: the fastest level that fits
    # ours takes the official keywords too, saying once what they do here
    with pytest.warns(UserWarning, match="official MatRIS keywords mode='torch'"):
        ours = OurCalculator(path, mode="torch", task="ef")
    assert ours.run_options.kernels == "torch" and not ours.compute_stress


def test_calculator_rotation_and_partial_periodicity(saved):
    """Molecules, wires and slabs (with zero cell vectors along their open directions) give
    rotation-invariant energies and covariant forces; the caller's atoms are left alone."""
    from matris.applications.base import MatRISCalculator

    path, _ = saved
    calc = MatRISCalculator(path, task="ef", dtype="float64")
    rotation = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])
    cases = [molecule("H2O")] + [Atoms("Si2", positions=[[0, 0, 0], [1.4, 1.4, 1.4]], cell=np.diag(np.array(p) * 5.43),
                                       pbc=p) for p in ([True, False, False], [True, True, False])]
    for atoms in cases:
        atoms.calc = calc
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        turned = atoms.copy()
        turned.positions[:] = atoms.positions @ rotation
        turned.set_cell(atoms.cell.array @ rotation)
        before = turned.positions.copy(), turned.cell.array.copy()
        turned.calc = calc
        assert turned.get_potential_energy() == pytest.approx(energy, abs=1e-10)
        np.testing.assert_allclose(turned.get_forces(), forces @ rotation, atol=1e-10)
        np.testing.assert_array_equal(turned.positions, before[0])
        np.testing.assert_array_equal(turned.cell.array, before[1])


# ----------------------------------------------------------------------------- relax and MD
@pytest.mark.skipif(not HAVE_PYMATGEN, reason="StructOptimizer returns pymatgen structures")
def test_struct_optimizer(saved, tmp_path):
    from pymatgen.core import Molecule, Structure
    from pymatgen.io.ase import AseAtomsAdaptor

    from matris.applications.relax import StructOptimizer

    path, _ = saved
    optimizer = StructOptimizer(path, task="efsm", device="cpu", mode="torch")
    crystal = _si()
    result = optimizer.relax(crystal, steps=3, fmax=0.0, verbose=False, save_path=str(tmp_path / "traj.pkl"))
    final, traj = result["final_structure"], result["trajectory"]
    assert isinstance(final, Structure) and len(traj) == 4  # the start and three steps
    np.testing.assert_allclose(final.cart_coords, traj.atom_positions[-1])
    np.testing.assert_allclose(final.lattice.matrix, traj.cells[-1])
    np.testing.assert_allclose(final.site_properties["magmom"], traj.magmoms[-1])
    assert traj.stresses[-1].shape == (6,) and np.isfinite(traj.energies).all()
    frames = pickle.loads((tmp_path / "traj.pkl").read_bytes())
    assert set(frames) == {"energy", "forces", "stresses", "magmoms", "atom_positions", "cell", "atomic_number"}
    # a Molecule in, a Molecule out; a slab keeps its periodicity
    water = optimizer.relax(AseAtomsAdaptor.get_molecule(molecule("H2O")), relax_cell=False, steps=1, fmax=0,
                            verbose=False)["final_structure"]
    assert isinstance(water, Molecule)
    slab = _si()
    slab.pbc = [True, True, False]
    out = optimizer.relax(slab, relax_cell=False, steps=2, fmax=0, loginterval=3, verbose=False)
    assert out["final_structure"].lattice.pbc == (True, True, False) and len(out["trajectory"]) == 2
    for bad, match in (({"loginterval": 0}, "loginterval"), ({"ase_filter": "NoFilter"}, "Unknown ASE cell filter")):
        with pytest.raises(ValueError, match=match):
            optimizer.relax(_si(), **bad)
    with pytest.raises(ValueError, match="Optimizer Adam not found"):
        StructOptimizer(path, optimizer="Adam")


def test_molecular_dynamics(saved, tmp_path):
    from matris.applications import MolecularDynamics

    path, model = saved
    atoms = _si()
    md = MolecularDynamics(atoms, model=path, ensemble="nvt", temperature=300, starting_temperature=300, timestep=1,
                           trajectory=str(tmp_path / "md.traj"), logfile=str(tmp_path / "md.log"), loginterval=1,
                           task="efs", device="cpu", mode="torch")
    md.run(2)
    assert md.dyn.nsteps == 2 and len((tmp_path / "md.log").read_text().splitlines()) == 4
    other = _si(0.05)
    other.set_momenta(atoms.get_momenta())  # Berendsen rescales by the temperature: it must not be 0
    md.set_atoms(other)
    md.run(1)
    assert other.calc is atoms.calc and md.dyn.nsteps == 1
    from ase.io import read

    assert len(read(tmp_path / "md.traj", ":")) == 5  # 3 frames, then 2 appended for the new atoms
    npt = MolecularDynamics(_si(), model=path, ensemble="npt", thermostat="Nose-Hoover", bulk_modulus=100,
                            temperature=300, timestep=1, device="cpu")
    npt.run(1)
    for bad, match in (({"ensemble": "nph"}, "ensemble"), ({"thermostat": "langevin"}, "thermostat"),
                       ({"ensemble": "npt"}, "bulk_modulus")):
        with pytest.raises(ValueError, match=match):
            MolecularDynamics(_si(), model=path, **bad)


# ----------------------------------------------------------------------------- torch-sim
@pytest.mark.skipif(not HAVE_TORCH_SIM, reason="torch-sim is optional")
def test_torchsim_model(saved):
    import torch_sim as ts

    from matris.applications.torchsim import MatRISTorchSimModel

    _, model = saved
    model = copy.deepcopy(model).to(torch.float64).eval()
    structures = [_si(), bulk("NaCl", "rocksalt", a=5.64)]
    expected = model([model.graph_converter(a) for a in structures], task="efsm", mode="torch")
    state = ts.io.atoms_to_state(structures, device=torch.device("cpu"), dtype=torch.float64)
    water = ts.io.atoms_to_state(molecule("H2O"), device=torch.device("cpu"), dtype=torch.float64)
    assert torch.count_nonzero(MatRISTorchSimModel(model, target="efs", dtype=torch.float64)(water)["stress"]) == 0
    for target in ("e", "em", "ef", "efs", "efsm"):
        sim = MatRISTorchSimModel(model, target=target, dtype=torch.float64, mode="torch")
        out = sim(state)
        assert set(out) == {n for k, n in zip("efsm", ("energy", "forces", "stress", "magmoms")) if k in target}
        assert sim.compute_forces == ("f" in target) and sim.compute_stress == ("s" in target)
        assert not any(v.requires_grad for v in out.values())
        atoms = torch.tensor([8.0, 2.0], dtype=torch.float64)
        torch.testing.assert_close(out["energy"], expected["e"].detach() * atoms)
        if "f" in target:
            torch.testing.assert_close(out["forces"], torch.cat(expected["f"]), rtol=0, atol=1e-10)
        if "s" in target:
            torch.testing.assert_close(out["stress"], torch.stack(expected["s"]) / 160.21766208, rtol=0, atol=1e-12)
        if "m" in target:
            torch.testing.assert_close(out["magmoms"], torch.cat(expected["m"]).detach(), rtol=0, atol=1e-12)
    for target in ("", "es", "fsm"):
        with pytest.raises(ValueError, match="target must be"):
            MatRISTorchSimModel(model, target=target)


def test_applications_import_lazily():
    import matris.applications as apps

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert apps.MatRISCalculator.__module__ == "matris.applications.base"
    with pytest.raises(AttributeError):
        apps.Missing  # noqa: B018
