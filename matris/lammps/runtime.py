"""What ``pair_style matris`` calls: energies, forces and virials in LAMMPS units.

``mode domain`` (the default): every MPI rank calls :meth:`LammpsEvaluator.compute_domain_raw`
with its own atoms and LAMMPS's ghost atoms, and the ranks exchange what each interaction block
reads from the others (:mod:`matris.domain`) through the pair style's LAMMPS communication
(:class:`LammpsComm`). ``mode gather``: the pair style gathers all atoms onto MPI rank 0 each step
and calls :meth:`LammpsEvaluator.compute` on the whole periodic cell (the same graph as the ASE
calculator builds). Both are exact for any number of ranks.

Units are LAMMPS ``metal``: Å, eV, eV/Å; virials in eV (W = Σ r ⊗ f, Voigt order xx yy zz
xy xz yz as LAMMPS stores them).
"""

from __future__ import annotations

# first, before torch is imported: PyTorch's own dgemm_, not LAMMPS's (matris.lammps.blas);
# BLAS says what was done, for diagnostics
from .blas import STATUS as BLAS  # noqa: F401

# isort: split

import ctypes
import json
import os
import resource
import time

import numpy as np
import torch

from .. import memory
from ..domain import Subdomain, build_graphs, evaluate
from ..domain.evaluate import bond_forces_and_virials
from ..errors import MatRISInputError, counted, is_out_of_memory
from ..graph import AtomicSystem, GraphBatch
from ..graph.system import MAX_Z, element_symbol
from ..kernels import choose, dispatch
from ..model import MatRIS
from ..settings import parse_size

_SYMBOLS = {element_symbol(z): z for z in range(1, MAX_Z + 1)}


def rank_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; the machine's where unknown).
    LAMMPS sets OpenMP, and with it PyTorch, to one thread when ``OMP_NUM_THREADS`` is unset,
    so the model would otherwise run on one core."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _rss_bytes() -> int:
    """This process's resident memory now (Linux), else its peak."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def atomic_numbers_of(elements: list[str]) -> list[int]:
    """``pair_coeff * * Si O`` → ``[14, 8]``; an unknown symbol raises with the valid ones."""
    out = []
    for symbol in elements:
        if symbol not in _SYMBOLS:
            raise MatRISInputError(
                f"pair_coeff: {symbol!r} is not an element symbol MatRIS knows (H to Pu, e.g. Si, O, Fe); "
                "give one element per LAMMPS atom type")
        out.append(_SYMBOLS[symbol])
    return out


_EXCHANGE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_int)
_ALLREDUCE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_double), ctypes.c_int, ctypes.c_int)


class LammpsComm:
    """:class:`matris.domain.Comm` for one MPI rank: the pair style's ``forward_comm`` and
    ``reverse_comm`` on rows ``[n_local + n_ghost, width]`` (float64; LAMMPS's ghost order) and an
    ``MPI_Allreduce`` on LAMMPS's communicator, called through the plugin's C functions.
    ``bytes`` counts the rows this rank received or sent back (ghost rows × width × 8), ``seconds``
    the time spent in exchanges (waiting for other ranks included)."""

    def __init__(self, pair: int, exchange: int, allreduce: int, n_local: int, n_all: int):
        self.pair, self.n_local, self.n_all = ctypes.c_void_p(pair), n_local, n_all
        self._exchange, self._allreduce = _EXCHANGE(exchange), _ALLREDUCE(allreduce)
        self.bytes, self.seconds = 0, 0.0

    def _exchange_rows(self, x: torch.Tensor, reverse: int) -> torch.Tensor:
        """``x``: the owned rows (forward) or the ghost rows (reverse), ``[k, *shape]`` → the other
        side's rows after the exchange, on ``x``'s device and dtype."""
        start = time.perf_counter()
        owned, ghosts = slice(None, self.n_local), slice(self.n_local, None)
        source, target = (ghosts, owned) if reverse else (owned, ghosts)
        width = int(np.prod(x.shape[1:]))
        rows = np.zeros((self.n_all, width), dtype=np.float64)
        rows[source] = x.detach().reshape(x.shape[0], width).to("cpu", torch.float64).numpy()
        if width:
            self._exchange(self.pair, reverse, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), width)
            self.bytes += (self.n_all - self.n_local) * width * 8
        out = torch.from_numpy(rows[target]).to(x.device, x.dtype)
        self.seconds += time.perf_counter() - start
        return out.reshape((out.shape[0],) + tuple(x.shape[1:]))

    def forward(self, local: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self._exchange_rows(local[0], 0)]

    def reverse(self, ghost: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self._exchange_rows(ghost[0], 1)]

    def total(self, values: list[torch.Tensor], op: str = "sum") -> torch.Tensor:
        (v,) = values
        v = torch.as_tensor(v)
        buf = np.ascontiguousarray(v.detach().to("cpu", torch.float64).numpy().reshape(-1))
        self._allreduce(self.pair, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), buf.size,
                        1 if op == "max" else 0)
        return torch.from_numpy(buf).reshape(v.shape).to(v.dtype)


def _rank_device(device: str, local_rank: int) -> str:
    """``auto`` with several GPUs: the node's ranks take them in turn (``cuda:<local rank>``)."""
    if device == "auto" and torch.cuda.is_available():
        return f"cuda:{local_rank % torch.cuda.device_count()}"
    return device


class LammpsEvaluator:
    """One model on one MPI rank: its own atoms (``mode domain``) or, on rank 0, the whole system
    (``mode gather``).

    Args:
        model: a model name, checkpoint path (e.g. from ``matris export lammps``) or URL.
        elements: the element of each LAMMPS atom type, in type order (``pair_coeff * * Si O``).
        device: "auto" (the default: CUDA when present, ``cuda:<local rank>`` with several GPUs),
            "cpu", "cuda" or "cuda:N".
        dtype: "float32" (the default, as everywhere in matris) or "float64".
        threads: PyTorch's CPU threads for the model; 0 (the default): this rank's share of the
            cores it may run on (:func:`rank_cores` divided among the ``local_size`` ranks of the
            node that run the model; in ``mode gather`` rank 0 alone, while the others sleep).
        local_rank: this rank's index among the MPI ranks of its node.
        local_size: the number of MPI ranks on its node.
        memory_limit: the memory one evaluation on this rank may use (``"8GB"``; ``"auto"``: a share
            of what its device has, :func:`matris.memory.default_budget`); a rank's atoms that need
            more even at the lowest memory level stop the run with a message before any work.
        stats: ``PREFIX``: this rank writes its counters to ``PREFIX.<rank>.json`` after every call
            (``benchmarks/lammps.py`` reads them); ``""``: none.
    """

    def __init__(self, model: str, elements: list[str], device: str = "auto", dtype: str = "float32",
                 threads: int = 0, local_rank: int = 0, local_size: int = 1, memory_limit: str = "auto",
                 stats: str = ""):
        if threads < 0:
            raise MatRISInputError(f"pair_style matris: threads must be 0 (the cores this rank may run on) or more, "
                                   f"got {threads}")
        cores = rank_cores()
        # a rank pinned to its own cores keeps them; unpinned ranks of a node share its cores
        shared = cores >= (os.cpu_count() or cores)
        self.threads = threads or max(1, cores // local_size if shared else cores)
        torch.set_num_threads(self.threads)
        limit = parse_size(memory_limit, "pair_style matris memory_limit")
        self.model = MatRIS.load(model, device=_rank_device(device, local_rank), dtype=dtype).eval()
        self.model.options.memory_limit = limit
        self.stats_prefix = stats
        self.stats = {"calls": 0, "seconds": 0.0, "rss_after_load_bytes": _rss_bytes()}
        self.type_to_z = np.asarray([0] + atomic_numbers_of(elements), dtype=np.int64)  # LAMMPS types start at 1
        beyond = [element_symbol(int(z)) for z in self.type_to_z[1:] if z > self.model.max_atomic_number]
        if beyond:
            raise MatRISInputError(
                f"pair_coeff: model {self.model.name} does not cover {', '.join(beyond)} (it covers Z = 1.."
                f"{self.model.max_atomic_number}); use a model that does (see 'matris models')")
        for p in self.model.parameters():
            p.requires_grad_(False)

    def atomic_numbers(self, types: np.ndarray) -> np.ndarray:
        """LAMMPS types (1-based) → atomic numbers ``[N]``; a type without an element raises."""
        types = np.asarray(types, dtype=np.int64)
        if types.size and (types.min() < 1 or types.max() >= len(self.type_to_z)):
            raise MatRISInputError(
                f"atom type {int(types.max())} has no element: pair_coeff * * maps "
                f"{counted(len(self.type_to_z) - 1, 'type')}; give one element per atom type")
        return self.type_to_z[types]

    def _raise_if_out_of_memory(self, exc: BaseException, what: str, advice: str) -> None:
        """An allocation failure becomes a MemoryError naming what was evaluated and what to do
        (LAMMPS then stops: no step runs on old forces); other errors are left to the caller."""
        if not is_out_of_memory(exc):
            return
        m = self.model
        raise MemoryError(
            f"out of memory evaluating {what} on {m.device} ({str(m.dtype).removeprefix('torch.')}): {advice}, "
            f"dtype float32, or a device with more memory "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc

    def _check_domain_limit(self, graph, n_local: int, n_ghost: int) -> None:
        """``memory_limit`` in mode domain, whose ranks keep every activation (level 0: the blocks'
        exchanges run once, in the forward pass): a rank that needs more is refused before its call."""
        m = self.model
        limit = m.options.memory_limit
        if limit is None:
            return
        need = memory.activation_bytes(m, graph, 0, m.dtype, choose(m.device, m.options.kernels))
        if need > limit:
            memory.refuse(f"{n_local} atoms and {n_ghost} ghosts with {graph.num_angles} angles on this rank", need, 0,
                          limit)

    @property
    def cutoff(self) -> float:
        return float(self.model.cutoff)

    def describe(self) -> str:
        """The line the pair style writes to the LAMMPS log: model, device, dtype and threads."""
        m = self.model
        n = self.threads
        where = f"{m.device}" + (f", {n} CPU thread{'s' if n != 1 else ''}" if m.device.type == "cpu" else "")
        dtype = str(m.dtype).removeprefix("torch.")
        return f"pair_style matris: model {m.name}, {where}, {dtype}, cutoff {m.cutoff:g} A"

    def compute_raw(self, positions: bytes, types: bytes, cell: bytes, px: int, py: int, pz: int
                    ) -> tuple[float, bytes, bytes, bytes]:
        """:meth:`compute` on raw buffers, as the pair style calls it: float64 positions
        ``[N, 3]``, int32 types ``[N]``, float64 cell ``[3, 3]`` and the three periodic flags;
        returns the energy and the per-atom energies, forces and virials as float64 bytes. Out
        of memory is an error that says so (LAMMPS then stops: no step runs on old forces)."""
        n = len(types) // 4
        try:
            e, atomic, forces, virial = self.compute(
                np.frombuffer(positions, dtype=np.float64).reshape(-1, 3), np.frombuffer(types, dtype=np.int32),
                np.frombuffer(cell, dtype=np.float64).reshape(3, 3), np.array([px, py, pz], dtype=bool))
        except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            self._raise_if_out_of_memory(exc, f"{n} atoms", "rank 0 evaluates the whole system; use fewer atoms")
            raise
        return e, atomic.tobytes(), forces.tobytes(), virial.tobytes()

    def compute(self, positions: np.ndarray, types: np.ndarray, cell: np.ndarray, pbc: np.ndarray
                ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Energy (eV), per-atom energies ``[N]`` (eV), forces ``[N, 3]`` (eV/Å) and per-atom
        virials ``[N, 6]`` (eV; xx yy zz xy xz yz) of one structure.

        positions: ``[N, 3]`` Å; types: ``[N]`` LAMMPS types (1-based); cell: ``[3, 3]`` rows
        are the box vectors a, b, c (Å); pbc: ``[3]``, periodic directions.
        """
        system = AtomicSystem(positions=positions, cell=cell, pbc=pbc, atomic_numbers=self.atomic_numbers(types),
                              name="LAMMPS system")
        m = self.model
        g = GraphBatch.from_systems([system], m.cutoff, m.three_body_cutoff, dtype=m.dtype, device=m.device)
        kernels, _ = dispatch(g.positions.device, m.options.kernels)
        level = memory.inference_level(m, g, m.dtype, False, kernels.name)
        shift = g.bond_image @ g.cell[0]
        v = (g.positions[g.bond_target] - g.positions[g.bond_source] - shift).detach().requires_grad_(True)
        with torch.enable_grad():
            e_model, _, _, atomic = m._energy(g, g.positions, None, level, kernels, bond_vectors=v)
            (dv,) = torch.autograd.grad(e_model.sum(), [v])
        atomic = (atomic + m._atomic_reference(g, m._reference_term(g, e_model))).detach()
        forces, virial = bond_forces_and_virials(v, dv, g.bond_target, g.bond_source, g.num_atoms)
        to_np = lambda t: np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float64)  # noqa: E731
        return float(atomic.sum()), to_np(atomic), to_np(forces), to_np(virial)

    def _record(self, comm: LammpsComm, graph, seconds: float) -> None:
        """This rank's counters (``stats``); with the pair style's ``stats PREFIX`` also written to
        ``PREFIX.<rank>.json`` after every call (``benchmarks/lammps.py`` reads them)."""
        st = self.stats
        st["calls"] += 1
        st["seconds"] += seconds
        st.update(n_local=comm.n_local, n_ghost=comm.n_all - comm.n_local, n_slots=graph.n_slots,
                  bonds=graph.num_bonds, angles=graph.num_angles, bytes=comm.bytes,
                  exchange_seconds=comm.seconds, last_seconds=seconds,
                  peak_rss_bytes=_peak_rss_bytes())
        prefix = self.stats_prefix
        if prefix:
            rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
            path = f"{prefix}.{rank}.json"
            with open(path + ".tmp", "w") as fh:
                json.dump(st, fh)
            os.replace(path + ".tmp", path)

    def compute_domain_raw(self, positions: bytes, types: bytes, tags: bytes, n_local: int, cell: bytes, pair: int,
                           exchange: int, allreduce: int) -> tuple[float, bytes, bytes, bytes]:
        """This rank's share (``mode domain``, :mod:`matris.domain`): float64 positions ``[n, 3]``,
        int32 types and int64 tags ``[n]`` of its ``n_local`` atoms then its ghosts, the float64
        box ``[3, 3]``, and the pair style's exchange and allreduce functions. Returns the energy
        of its atoms, their per-atom energies ``[n_local]``, and forces ``[n, 3]`` and per-atom
        virials ``[n, 6]`` on all its atoms (ghosts included: LAMMPS sends those to their owners)."""
        x = np.frombuffer(positions, dtype=np.float64).reshape(-1, 3)
        z = self.atomic_numbers(np.frombuffer(types, dtype=np.int32))
        m = self.model
        start = time.perf_counter()
        comm = LammpsComm(pair, exchange, allreduce, n_local, len(z))
        domain = Subdomain(positions=torch.from_numpy(x.copy()), atomic_numbers=torch.from_numpy(z),
                           tags=torch.from_numpy(np.frombuffer(tags, dtype=np.int64).copy()), n_local=n_local)
        box = torch.from_numpy(np.frombuffer(cell, dtype=np.float64).reshape(3, 3).copy())
        try:
            graphs = build_graphs([domain], comm, box, m.cutoff, m.three_body_cutoff)
            self._check_domain_limit(graphs[0], n_local, len(z) - n_local)
            (res,) = evaluate(m, graphs, comm)
        except (MemoryError, RuntimeError) as exc:
            self._raise_if_out_of_memory(exc, f"{n_local} atoms and {len(z) - n_local} ghosts", "use more ranks")
            raise
        self._record(comm, graphs[0], time.perf_counter() - start)
        to_bytes = lambda a: np.ascontiguousarray(a.detach().cpu().numpy(), dtype=np.float64).tobytes()  # noqa: E731
        return res.energy, to_bytes(res.atomic), to_bytes(res.forces), to_bytes(res.virial)
