"""The memory policy, in one place: what a device has free, what a call needs (memory models
fitted to measured peaks), and the choices made from them: the inference memory level and the
training recompute mode.

Inference (energy, forces and stress of one call) keeps, per level, the activations of
:func:`activation_bytes`: level 0 keeps everything (fastest), 1 recomputes each block's four steps
in the backward pass, 2 streams the angles through the blocks by chunks keeping each block's input
angle state, 3 (:data:`LOWEST_LEVEL`) the same keeping one of them (least memory;
:mod:`matris.model.stream`); :func:`inference_level` picks the fastest that fits. Training on forces
recomputes nothing, each block, or each block and its
per-angle work by chunks of :data:`CHUNK_ROWS` rows (:data:`RECOMPUTE_MODES`,
:mod:`matris.model.recompute`); :func:`training_mode` picks the fastest that fits. By default a
call may use :data:`DEFAULT_SHARE` of the memory available on its device (:func:`available_memory`:
cgroup-aware on a CPU). Every choice gives the same numbers, to float rounding.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from . import heap
from .errors import MatRISInputError, MemoryLimitError
from .kernels import choose
from .settings import RECOMPUTE_MODES, format_size

# rows of one chunk recomputed in a block's backward passes (the line-graph steps' per-angle work,
# the atom graph's Φ): its composed second order keeps ≈ 60 floats per row and feature, so 4096
# rows of width 128 ≈ 0.13 GB (float32). Twice that measured 0.4 GB more peak RSS for a 64-atom
# oxide cell and 6 % less time (the heap's free blocks between chunks' tensors count in RSS;
# benchmarks/train_memory.py)
CHUNK_ROWS = 4096
# at most this many chunks per recomputed step (:func:`chunk_rows`)
MAX_CHUNKS = 16
# the share of the device's available memory a call may use by default (inference and training)
DEFAULT_SHARE = 0.6

# what a training step on forces recomputes in its backward passes (``RunOptions.training_recompute``):
# nothing (the whole graph kept), each block, or each block and, inside it, everything per angle by
# row chunks (least memory)
# models this deep or deeper recompute by default where their whole graph would not fit
RECOMPUTE_MIN_BLOCKS = 4
# the memory model of a training step (:func:`training_bytes`): rows of the block width
# per angle (and per directed bond, per atom), fitted to peak RSS (benchmarks/train_memory.py):
# (rows alive while one block is recomputed, rows kept per block), per mode. The published 10-block
# model fixes only their sum (peak + 10·kept); the split follows the live tensors' count at the peak
# (kept: a block's inputs and upstream gradients), scaled to RSS (the heap's free blocks between
# live ones)
TRAIN_ROWS = {"none": (0, 180), "blocks": (265, 2.5), "rows": (40, 2.5)}
# recomputing rows, one chunk of rows (:data:`CHUNK_ROWS`) is alive at a time, whatever the
# batch: this many floats per row and feature of the three-body width (part of
# training_fixed_bytes). A chunk recomputed on its own keeps about 145 (fitted with
# TRAIN_ROWS); rows that make one chunk are computed with the rest of the block, as in "blocks",
# which counts 265 − 40 more than "rows" per row, the bonds' and atoms' rows too (a tenth more
# than the angles' in oxide cells), so the bound is that
TRAIN_CHUNK_FLOATS = 250
FRAMEWORK_BYTES = 512 * 2**20
# the inference memory level that keeps the least: the angles streamed by chunks, one angle state kept
LOWEST_LEVEL = 3
# the levels from which the angles are streamed through the blocks by chunks (:mod:`matris.model.stream`)
STREAM_LEVEL = 2
# the inference levels by speed (fastest first); each keeps less than the one before it
INFERENCE_ORDER = (0, 1, 2, 3)


def kept_blocks(level: int, n_blocks: int) -> frozenset:
    """The blocks whose input angle state a streamed level keeps (:mod:`matris.model.stream`):
    every block's at level 2; at the lowest level the middle block's only (one kept state, 512 B
    per angle at d_t = 128 in float32, against the recomputation of the states in between: with
    10 blocks, 20 blocks' angle updates more in the backward pass). Block 0's is the embedding."""
    every = 1 if level == STREAM_LEVEL else max(1, -(-n_blocks // 2))
    return frozenset(range(every, n_blocks, every))


def stream_rows(model) -> int:
    """Angles of one chunk at the streamed levels: ``model.options.chunk_rows`` or :data:`CHUNK_ROWS`
    (a chunk's work touches only its own bonds and atoms, so small chunks cost no pass over all bonds)."""
    return model.options.chunk_rows or CHUNK_ROWS


def available_memory(device: torch.device) -> int:
    """Bytes of memory free for new tensors on ``device`` (CPU: MemAvailable, or less where the
    process's memory cgroup allows less (a SLURM job's ``--mem``, a container's limit: MemAvailable
    is the whole node's there), plus what the heap keeps free for reuse, :mod:`matris.heap`)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    free = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = 8 * 2**30
    headroom = cgroup_headroom()
    if headroom is not None:
        free = min(free, headroom)
    return free + heap.free_bytes()


def cgroup_headroom(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes this process's memory cgroup and its ancestors still allow: the least of limit − usage
    over those with a limit, usage without the reclaimable page cache (``inactive_file``); None
    where no limit is set or nothing can be read. cgroup v2 (``memory.max``, ``memory.current``)
    and v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    candidates = []  # (folder of the process's cgroup, file names)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.strip().lstrip("/")
        if controllers == "":  # v2: the unified hierarchy, at the root or under unified/
            for base in (Path(root), Path(root) / "unified"):
                candidates.append((base, rel, ("memory.max", "memory.current", "inactive_file")))
        elif "memory" in controllers.split(","):
            candidates.append((Path(root) / "memory", rel, ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                             "total_inactive_file")))
    best = None
    for base, rel, (limit_name, usage_name, cache_key) in candidates:
        if not (base / limit_name).exists() and not (base / rel / limit_name).exists():
            continue
        folder = base / rel
        # the process's cgroup and its ancestors (a namespaced container sees its own at the root)
        chain = [folder, *folder.parents] if folder != base else [base]
        for cg in chain:
            if not str(cg).startswith(str(base)):
                break
            room = _cgroup_room(cg, limit_name, usage_name, cache_key)
            if room is not None:
                best = room if best is None else min(best, room)
    return best


def _cgroup_room(folder: Path, limit_name: str, usage_name: str, cache_key: str) -> int | None:
    """limit − (usage − inactive page cache) of one cgroup folder, or None (no limit, unreadable)."""
    try:
        limit_text = (folder / limit_name).read_text().strip()
        usage = int((folder / usage_name).read_text().strip())
    except (OSError, ValueError):
        return None
    if limit_text == "max" or not limit_text.isdigit() or int(limit_text) >= 2**60:  # v1's "no limit"
        return None
    cache = 0
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == cache_key:
                cache = int(value)
                break
    except (OSError, ValueError):
        pass
    return max(0, int(limit_text) - max(0, usage - cache))


def check_recompute(mode) -> str:
    """A training recompute mode (:data:`RECOMPUTE_MODES`), or a clear error naming the choices."""
    if mode not in RECOMPUTE_MODES:
        raise MatRISInputError(f"unknown training recompute mode {mode!r}: use one of {', '.join(RECOMPUTE_MODES)} "
                               "(or null for automatic)")
    return mode


def chunk_rows(model, n_rows: int = 0) -> int:
    """Rows of one recomputed chunk of ``n_rows`` rows: ``model.options.chunk_rows``, else
    :data:`CHUNK_ROWS`, or more where the rows would make more than :data:`MAX_CHUNKS` chunks: every
    chunk also reads and writes whole per-bond tensors (its sums into the bonds, the gradients of
    the bonds' projections), so their count must not grow with the system (time ∝ angles × bonds)."""
    return model.options.chunk_rows or max(CHUNK_ROWS, -(-n_rows // MAX_CHUNKS))


def default_budget(device: torch.device) -> int:
    """Bytes a call on ``device`` may use when no limit is set: :data:`DEFAULT_SHARE` of what it has."""
    return int(DEFAULT_SHARE * available_memory(device))


# ------------------------------------------------------------------------------------- inference
def _itemsize(model, dtype: torch.dtype | None) -> int:
    return torch.finfo(dtype or model.dtype).bits // 8


def activation_bytes(model, graph, level: int = 0, dtype: torch.dtype | None = None, kernels: str = "torch",
                     backward: bool = True) -> int:
    """Rough peak memory of the activations of one energy+forces+stress call of ``model`` on
    ``graph`` (a :class:`~matris.graph.GraphBatch`) at ``level``, in ``dtype`` (default the model's).

    Counted in angle- (and directed-edge-) sized tensors of the block width, measured on CPU
    (1,000-atom bcc Fe, 628k angles): level 0 keeps ≈ 45 per block (≈ 21 with the fused operators,
    ``kernels`` "fused" or "triton", measured on Si64 on a CPU against 48 for the composed ops);
    level 1 (steps recomputed) keeps 2 per block plus ≈ 40 while one step is recomputed; the
    streamed levels (:mod:`matris.model.stream`) one per kept angle state plus ≈ 5 (the gradient
    buffer, the recomputation buffer, the bonds' sums of every block, one chunk's work; fitted to
    the published architecture on diamond Si in float32, ``benchmarks/system_size.py``).

    Without a backward pass (``backward`` False: energies alone) nothing is kept: the whole forward's
    working set at level 0 (≈ 8, measured on Si512), one angle state and one chunk's work streamed (≈ 2.5).
    """
    c = model.config
    rows = graph.num_angles * c.three_body_feat_dim + 2 * graph.num_bonds * c.edge_feat_dim
    if not backward:
        return int((8 if level < STREAM_LEVEL else 2.5) * rows * _itemsize(model, dtype))
    level0 = 21 if kernels in ("fused", "triton") else 45
    if level >= STREAM_LEVEL:
        tensors = len(kept_blocks(level, c.num_layers)) + 5
    else:
        tensors = {0: level0 * c.num_layers, 1: 2 * c.num_layers + 40}[level]
    return tensors * rows * _itemsize(model, dtype)


# Energies alone: level 0's forward is the faster below this many angles, the streamed forward above
# (the published architecture on an Intel Xeon CPU, float32: level 0 1.4x faster at Si8, the two within
# 20 % of each other at Si32-Si128, where the crossover lies, the streamed forward 1.5x faster at Si216;
# benchmarks/results/energy_only_levels_cpu.json)
STREAMED_FORWARD_ANGLES = 65_536


def inference_level(model, graph, dtype: torch.dtype | None = None, create_graph: bool = False,
                    kernels: str | None = None, backward: bool = True) -> int:
    """The memory-saving level (0–3, :data:`INFERENCE_ORDER`) a call of ``model`` on ``graph`` uses:
    ``model.options.memory_level`` where set; else the fastest whose activations
    (:func:`activation_bytes`) fit ``options.memory_limit`` bytes (default :func:`default_budget`),
    :data:`LOWEST_LEVEL` where none does. Training (``create_graph``) keeps everything (0); a call
    without a backward pass (``backward`` False or autograd off: energies alone) takes the fastest
    that fits too: below :data:`STREAMED_FORWARD_ANGLES` angles level 0's forward (it keeps nothing
    for a backward, but a whole block's angle work at once), else the streamed forward
    (:data:`STREAM_LEVEL`: 3.5 times less memory, and faster on large cells, whose chunks stay in
    cache); a compiled model takes level 0 (the compiled code)."""
    if create_graph:
        return 0
    backward = backward and torch.is_grad_enabled()
    opts = model.options
    if opts.memory_level is not None:
        return int(opts.memory_level)
    budget = opts.memory_limit if opts.memory_limit is not None else default_budget(model.device)
    if kernels is None:
        kernels = choose(model.device, opts.kernels, create_graph)
    if not backward:  # energies alone: the faster forward first (measured), then the one that keeps less
        small = graph.num_angles < STREAMED_FORWARD_ANGLES
        order = (0,) if model.compiled else ((0, STREAM_LEVEL) if small else (STREAM_LEVEL,))
    else:
        order = INFERENCE_ORDER
    for level in order:
        need = activation_bytes(model, graph, level, dtype, kernels, backward)
        if need <= budget:
            return level
    if opts.memory_limit is not None:  # a limit the user stated holds: refused before any work
        refuse(f"{graph.num_atoms} atoms with {graph.num_angles} angles ({graph.num_structures} structure"
               f"{'s' if graph.num_structures != 1 else ''})", need, order[-1], budget)
    return order[-1]


def refuse(what: str, need: int, level: int, limit: int):
    """Raise the :class:`MemoryLimitError` of ``what`` needing ``need`` bytes at ``level``."""
    lowest = "the lowest memory level" if level == LOWEST_LEVEL else "memory level"
    raise MemoryLimitError(
        f"{what} need about {format_size(need)} for one call at {lowest} ({level}), more than the memory limit "
        f"of {format_size(limit)}: raise memory_limit, evaluate fewer atoms at a time (smaller batches; more MPI "
        "ranks in LAMMPS), or use a device with more memory")


# -------------------------------------------------------------------------------------- training
def training_bytes(model, n_atoms, n_bonds, n_angles, dtype: torch.dtype | None = None, recompute: str | None = None):
    """Peak memory of the activations of one training step of ``model`` (energy, forces and stress
    with ``create_graph``, then the loss's backward) on ``n_atoms`` atoms, ``n_bonds`` bonds and
    ``n_angles`` angles (ints or arrays: per structure, then the costs add up over a batch), bytes,
    recomputing as ``recompute`` (None: as planned without a graph, :func:`training_mode`).

    Counted in rows of the block width (``n_angles·d_t + 2·n_bonds·d_e + n_atoms·d_n`` floats) and
    fitted to peak RSS on CPU, float32, published 10M architecture on rocksalt MgO cells (7,936 to
    63,488 angles; ``benchmarks/train_memory.py`` checks it): per recompute mode the rows alive
    while one block is recomputed plus the rows kept per block (:data:`TRAIN_ROWS`). Recomputing
    rows, the chunk alive at a time is the same for any batch: part of :func:`training_fixed_bytes`.
    """
    c = model.config
    mode = training_mode(model) if recompute is None else check_recompute(recompute)
    rows = n_angles * c.three_body_feat_dim + 2 * n_bonds * c.edge_feat_dim + n_atoms * c.node_feat_dim
    peak, kept = TRAIN_ROWS[mode]
    out = rows * (peak + kept * c.num_layers) * _itemsize(model, dtype)
    return int(out) if isinstance(out, float) else out  # arrays (per structure) stay arrays


def training_fixed_bytes(model, dtype: torch.dtype | None = None, ema: bool = True, recompute: str | None = None
                         ) -> int:
    """Memory of a training run of ``model`` besides the activations (:func:`training_bytes`): the
    parameters, their gradients, AdamW's two moments and the EMA copy (``ema``), the framework's
    own (:data:`FRAMEWORK_BYTES`) and, recomputing rows, the one chunk of rows recomputed at a time
    (:data:`TRAIN_CHUNK_FLOATS`), whatever the batch."""
    mode = training_mode(model) if recompute is None else check_recompute(recompute)
    itemsize = _itemsize(model, dtype)
    chunk = TRAIN_CHUNK_FLOATS * chunk_rows(model) * model.config.three_body_feat_dim * itemsize
    chunk = chunk if mode == "rows" else 0
    return sum(p.numel() for p in model.parameters()) * itemsize * (5 if ema else 4) + FRAMEWORK_BYTES + chunk


def training_mode(model, create_graph: bool = True, graph=None, dtype: torch.dtype | None = None) -> str:
    """What a call of ``model`` with ``create_graph`` (training on forces) recomputes in the backward
    passes (:data:`RECOMPUTE_MODES`, :mod:`matris.model.recompute`; the same gradients to float
    rounding): ``"none"`` keeps the whole graph (fastest; also without ``create_graph`` and for
    models of fewer than :data:`RECOMPUTE_MIN_BLOCKS` blocks); ``"blocks"`` recomputes each
    interaction block; ``"rows"`` too, and inside it the line-graph steps' per-angle work and the
    atom-graph Φ by row chunks (least memory). ``model.options.training_recompute`` decides where
    set; else, on ``graph``, the fastest whose :func:`training_bytes` fit
    ``options.training_memory_limit`` bytes (default :func:`default_budget`; a run with
    ``data.max_memory`` sets it); without a graph (planning), ``"rows"``."""
    if not create_graph:
        return "none"
    opts = model.options
    if opts.training_recompute is not None:
        return check_recompute(opts.training_recompute)
    if model.config.num_layers < RECOMPUTE_MIN_BLOCKS:
        return "none"
    if graph is None:
        return "rows"
    # the batch's atom count is read back to the host only where a choice depends on it
    sizes = (int(graph.n_atoms.sum()), graph.num_bonds, graph.num_angles)
    limit = opts.training_memory_limit if opts.training_memory_limit is not None else default_budget(model.device)
    for mode in ("none", "blocks"):
        if training_bytes(model, *sizes, dtype, mode) <= limit:
            return mode
    return "rows"
