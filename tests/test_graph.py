"""Atom graph and line graph (spec §2) against brute-force definitions."""

import itertools
from dataclasses import fields

import numpy as np
import pytest
import torch

from conftest import random_system
from matris import AtomicSystem, GraphBatch
from matris.errors import MatRISInputError


def brute_force_edges(system: AtomicSystem, rc: float, nmax: int | None = None) -> set:
    """Every directed (target i, source j, image n) with |x_i − x_j − n·L| <= rc."""
    cell = system.cell
    ranges = []
    for k in range(3):
        if system.pbc[k] and nmax is not None:
            ranges.append(range(-nmax, nmax + 1))
        elif system.pbc[k]:
            # planes of direction k are 1/|b_k| apart
            b = np.linalg.inv(cell).T[k]
            ranges.append(range(-int(np.ceil(rc * np.linalg.norm(b))) - 1, int(np.ceil(rc * np.linalg.norm(b))) + 2))
        else:
            ranges.append(range(1))
    x = system.positions
    out = set()
    for n in itertools.product(*ranges):
        shift = np.asarray(n) @ cell
        d = np.linalg.norm(x[:, None, :] - x[None, :, :] - shift, axis=-1)
        for i, j in zip(*np.nonzero(d <= rc)):
            if i != j or any(n):
                out.add((int(i), int(j), n))
    return out


def graph_edges(g: GraphBatch) -> set:
    tgt, src = g.edge_target.tolist(), g.edge_source.tolist()
    img = torch.cat([g.bond_image, -g.bond_image]).round().long().tolist()
    return {(t, s, tuple(n)) for t, s, n in zip(tgt, src, img)}


def brute_force_angles(g: GraphBatch, r3: float) -> list:
    """Spec §2 literally: for every short directed edge d_c and every other short d' with the same target."""
    n_b = g.num_bonds
    length = torch.linalg.vector_norm(
        g.positions[g.bond_target] - g.positions[g.bond_source]
        - torch.einsum("bi,bij->bj", g.bond_image, g.cell[g.bond_batch]), dim=-1)
    tgt = g.edge_target.tolist()
    out = []
    for dc in range(2 * n_b):
        if length[dc % n_b] > r3:
            continue
        for dp in range(2 * n_b):
            if dp != dc and tgt[dp] == tgt[dc] and length[dp % n_b] < r3:
                out.append((tgt[dc], dc, dp))
    return sorted(out)


@pytest.mark.parametrize("seed", range(4))
def test_periodic_edges_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    system = random_system(rng, n=5, a=3.0 + seed)  # small cells: many periodic images
    g = GraphBatch.from_systems([system], 6.0, 4.0, dtype=torch.float64)
    assert graph_edges(g) == brute_force_edges(system, 6.0)
    # every bond has exactly two directed copies: (i, j, n) and (j, i, −n)
    assert 2 * g.num_bonds == len(brute_force_edges(system, 6.0))


def test_line_graph_matches_spec_definition():
    rng = np.random.default_rng(7)
    systems = [random_system(rng, n=4, a=3.3), random_system(rng, n=3, a=3.8)]
    g = GraphBatch.from_systems(systems, 5.0, 3.5, dtype=torch.float64)
    got = sorted(zip(g.angle_atom.tolist(), g.angle_target_edge.tolist(), g.angle_source_edge.tolist()))
    assert got == brute_force_angles(g, 3.5)
    assert g.n_angles.sum() == g.num_angles


def test_fcc_primitive_counts():
    """Cu fcc primitive: one atom, 18 short directed edges → 18 × 17 = 306 angles (spec §2)."""
    s = AtomicSystem(np.zeros((1, 3)), [[0, 1.805, 1.805], [1.805, 0, 1.805], [1.805, 1.805, 0]], True, [29])
    g = GraphBatch.from_systems([s], 6.0, 4.0)
    assert 2 * g.num_bonds == 78 and g.num_angles == 306


def test_mixed_periodicity_slab_and_wire():
    rng = np.random.default_rng(3)
    base = random_system(rng, n=6, a=4.0)
    for pbc in ([True, True, False], [False, False, True], [True, False, True]):
        s = AtomicSystem(base.positions, base.cell, pbc, base.atomic_numbers)
        g = GraphBatch.from_systems([s], 5.0, 3.0, dtype=torch.float64)
        edges = graph_edges(g)
        assert edges == brute_force_edges(s, 5.0)
        for _, _, n in edges:  # no images along non-periodic directions
            assert all(n[k] == 0 for k in range(3) if not pbc[k])


def test_slab_with_zero_vacuum_vector():
    """A 2-D periodic slab needs no third lattice vector."""
    cell = np.array([[2.5, 0, 0], [0, 2.5, 0], [0, 0, 0]])
    pos = np.array([[0, 0, 0], [1.25, 1.25, 1.8], [0, 0, 3.6]])
    s = AtomicSystem(pos, cell, [True, True, False], [29, 29, 29])
    g = GraphBatch.from_systems([s], 5.0, 3.0, dtype=torch.float64)
    assert graph_edges(g) == brute_force_edges(s, 5.0, nmax=4)


def test_molecule_without_box():
    pos = np.array([[0.0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
    s = AtomicSystem(pos, np.zeros((3, 3)), False, [8, 1, 1])
    g = GraphBatch.from_systems([s], 6.0, 4.0)
    assert 2 * g.num_bonds == 6 and g.num_angles == 6
    assert g.bond_image.abs().sum() == 0


def test_supercell_counts_scale():
    rng = np.random.default_rng(1)
    s = random_system(rng, n=4, a=3.5)
    sc = AtomicSystem(
        np.concatenate([s.positions + np.array(n) @ s.cell for n in itertools.product(range(2), repeat=3)]),
        s.cell * 2, True, np.tile(s.atomic_numbers, 8))
    g1 = GraphBatch.from_systems([s], 6.0, 4.0)
    g8 = GraphBatch.from_systems([sc], 6.0, 4.0)
    assert g8.num_bonds == 8 * g1.num_bonds and g8.num_angles == 8 * g1.num_angles


def test_batch_offsets():
    rng = np.random.default_rng(2)
    a, b = random_system(rng, n=3), random_system(rng, n=5)
    ga = GraphBatch.from_systems([a], 5.0, 3.5)
    gb = GraphBatch.from_systems([b], 5.0, 3.5)
    g = GraphBatch.from_systems([a, b], 5.0, 3.5)
    assert g.n_atoms.tolist() == [3, 5]
    assert g.n_bonds.tolist() == [ga.num_bonds, gb.num_bonds]
    assert g.n_angles.tolist() == [ga.num_angles, gb.num_angles]
    assert g.bond_target[ga.num_bonds:].min() >= 3
    assert g.atom_batch.tolist() == [0] * 3 + [1] * 5


def test_isolated_atom_has_no_edges():
    s = AtomicSystem(np.zeros((1, 3)), np.eye(3) * 20, True, [26])
    g = GraphBatch.from_systems([s], 6.0, 4.0)
    assert g.num_bonds == 0 and g.num_angles == 0


def test_graph_to_device_and_dtype():
    rng = np.random.default_rng(0)
    g = GraphBatch.from_systems([random_system(rng)], 5.0, 3.0, dtype=torch.float32)
    g64 = g.to(dtype=torch.float64)
    assert g64.positions.dtype == torch.float64 and g64.bond_target.dtype == torch.int64


@pytest.mark.parametrize("pbc", [True, [True, True, False], False])
def test_pure_torch_neighbor_list_matches_vesin(pbc):
    """The fallback search (used where vesin is missing, e.g. the GPU image) finds the same bonds."""
    from matris.graph.neighbors import half_neighbor_list, torch_half_neighbor_list

    base = random_system(np.random.default_rng(11), n=6, a=3.2)
    s = AtomicSystem(base.positions, base.cell, pbc, base.atomic_numbers)

    def directed(i, j, n):
        return {(a, b, tuple(c)) for a, b, c in zip(i, j, n)} | {(b, a, tuple(-c)) for a, b, c in zip(i, j, n)}

    a = half_neighbor_list(s, 5.0)
    b = torch_half_neighbor_list(s, 5.0, device="cpu", chunk=4)
    assert len(a[0]) == len(b[0])
    assert directed(*a[:3]) == directed(*b[:3])
    v = s.positions[b[0]] - s.positions[b[1]] - b[2] @ s.cell
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), b[3], atol=1e-12)


def test_graphs_build_without_vesin(monkeypatch):
    """Where vesin is not installed, graph construction falls back to the PyTorch search."""
    import sys

    s = AtomicSystem(np.zeros((1, 3)), [[0, 1.805, 1.805], [1.805, 0, 1.805], [1.805, 1.805, 0]], True, [29])
    monkeypatch.setitem(sys.modules, "vesin", None)  # makes `import vesin` raise ImportError
    g = GraphBatch.from_systems([s], 6.0, 4.0)
    assert 2 * g.num_bonds == 78 and g.num_angles == 306


def _device_build(systems, rc, r3, dtype=torch.float64):
    """The device builder (GraphBatch.from_tensors) run on CPU tensors."""
    return GraphBatch.from_tensors(
        torch.from_numpy(np.concatenate([s.positions for s in systems])),
        torch.from_numpy(np.stack([s.cell for s in systems])),
        torch.from_numpy(np.stack([s.pbc for s in systems])),
        torch.from_numpy(np.concatenate([s.atomic_numbers for s in systems])),
        [s.num_atoms for s in systems], rc, r3, dtype=dtype, names=[s.name for s in systems])


def _graph_cases():
    rng = np.random.default_rng(11)
    base = random_system(rng, n=6, a=4.0)
    cases = {f"random{k}": [random_system(np.random.default_rng(k))] for k in range(3)}
    cases["fcc-primitive"] = [AtomicSystem(np.zeros((1, 3)), [[0, 1.805, 1.805], [1.805, 0, 1.805],
                                                               [1.805, 1.805, 0]], True, [29])]
    for pbc in ([True, True, False], [False, False, True], [True, False, True]):
        cases[f"mixed{pbc}"] = [AtomicSystem(base.positions, base.cell, pbc, base.atomic_numbers)]
    cases["slab-no-vacuum-vector"] = [AtomicSystem(np.array([[0, 0, 0], [1.25, 1.25, 1.8], [0, 0, 3.6]]),
                                                   np.array([[2.5, 0, 0], [0, 2.5, 0], [0, 0, 0]]),
                                                   [True, True, False], [29, 29, 29])]
    cases["molecule"] = [AtomicSystem(np.array([[0.0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]]), np.zeros((3, 3)),
                                      False, [8, 1, 1])]
    cases["isolated-atom"] = [AtomicSystem(np.zeros((1, 3)), np.eye(3) * 20, True, [26])]
    cases["batch"] = [cases["random0"][0], cases["molecule"][0], cases["fcc-primitive"][0], cases["isolated-atom"][0]]
    return cases


@pytest.mark.parametrize("name", list(_graph_cases()))
def test_device_builder_equals_host_builder(name):
    """GraphBatch.from_tensors (the GPU path, here on CPU tensors) gives the host builder's
    graph, edge for edge and angle for angle, in the same order."""
    pytest.importorskip("vesin_torch")
    systems = _graph_cases()[name]
    host = GraphBatch.from_systems(systems, 5.0, 3.0, dtype=torch.float64)
    dev = _device_build(systems, 5.0, 3.0)
    for f in fields(GraphBatch):
        a, b = getattr(host, f.name), getattr(dev, f.name)
        assert a.dtype == b.dtype and torch.equal(a, b), f.name
    assert host.num_angles == dev.num_angles and (name != "fcc-primitive" or dev.num_angles > 0)


def test_device_builder_rejects_overlapping_atoms():
    pytest.importorskip("vesin_torch")
    s = AtomicSystem(np.array([[0.0, 0, 0], [0.05, 0, 0]]), np.eye(3) * 6, True, [14, 14], name="dup")
    with pytest.raises(MatRISInputError, match=r"structure 0 \(dup\): atoms 0 and 1 are 0.0500 Å apart"):
        _device_build([s], 5.0, 3.0)


def test_torch_sim_model_builds_the_same_graph_from_device_tensors():
    """MatRISModel's GPU path (graph from the state's tensors, positions never leave the
    device) gives the host graph; run here on CPU tensors."""
    pytest.importorskip("vesin_torch")
    ts = pytest.importorskip("torch_sim")
    from ase.build import bulk

    from conftest import RANDOM_TINY
    from matris import MatRIS
    from matris.simulate import MatRISModel

    model = MatRISModel(MatRIS.load(RANDOM_TINY, dtype=torch.float64), dtype="float64")
    state = ts.io.atoms_to_state([bulk("Si", "diamond", a=5.43), bulk("Cu", "fcc", a=3.6).repeat(2)],
                                 device=torch.device("cpu"), dtype=torch.float64)
    host = model.graph(state)
    # repeated: one pbc flag for all directions once reached vesin as a stride-0 view, read as
    # garbage now and then (fewer bonds in ~1 of 10 builds)
    for _ in range(20):
        dev = model._device_graph(lambda k, d=None: getattr(state, k, d))
        for f in fields(GraphBatch):
            assert torch.equal(getattr(host, f.name), getattr(dev, f.name)), f.name


def test_device_builder_that_cannot_run_falls_back_to_the_host(monkeypatch):
    """A vesin build that fails on the device (say, one without CUDA support) costs a warning,
    once; the graphs are then built on the host and moved, and the model still runs."""
    pytest.importorskip("vesin_torch")
    import matris.graph.batch as batch_module

    monkeypatch.setattr(batch_module, "_DEVICE_BUILDER", {"failed": None})

    def no_gpu_support(*args, **kwargs):
        raise RuntimeError("vesin was compiled without support for this device (simulated)")

    monkeypatch.setattr(batch_module, "device_half_neighbor_list", no_gpu_support)
    systems = [random_system(np.random.default_rng(5))]
    host = GraphBatch.from_systems(systems, 5.0, 3.0, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="built on the host from now on"):
        g = GraphBatch.from_systems(systems, 5.0, 3.0, dtype=torch.float64, device="meta")  # a non-CPU device
    assert g.positions.device.type == "meta" and g.num_angles == host.num_angles
    assert not batch_module.device_builder_available()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GraphBatch.from_systems(systems, 5.0, 3.0, device="meta")  # said once; the host builds
