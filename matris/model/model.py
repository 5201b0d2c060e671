"""MatRIS: embeddings → interaction blocks → readout, with forces and stress by autograd."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from .. import log, memory
from ..checkpoint import CheckpointIO
from ..errors import MatRISInputError
from ..graph import GraphBatch
from ..graph.system import MAX_Z, atom_element, element_symbol
from ..kernels import REFERENCES, Kernels, dispatch
from ..official import official_config
from ..settings import MOVED_TO_OPTIONS, RunOptions
from ..targets import DEFAULT_TARGETS
from . import stream
from .block import BlockGraph, InteractionBlock, RowLines, checkpointed_block
from .config import MatRISConfig
from .embedding import AtomEmbedding, EdgeEmbedding, ThreeBodyEmbedding
from .layers import norm
from .readout import EnergyHead, MagmomHead, ReferenceEnergy
from .recompute import RowRecompute

EV_PER_A3_TO_GPA = 160.21766208
ANGLE_SHRINK = 1 - 1e-6  # keeps arccos differentiable for collinear bonds (spec §2)
@dataclass
class ModelOutput:
    """Predictions for ``S`` structures and ``N`` atoms: energy ``[S]`` eV (reference term included); energy_per_atom
    ``[S]`` eV/atom; forces ``[N, 3]`` eV/Å; stress ``[S, 3, 3]`` GPa, positive = tensile, NaN without a 3-D cell;
    magmoms ``[N]`` μB (None if not computed: by default only if trained on them); when asked for, atomic_energies
    ``[N]`` eV (each atom's share; they sum to ``energy``) and node_features (after the embedding and each block)."""

    energy: torch.Tensor
    energy_per_atom: torch.Tensor
    forces: torch.Tensor | None = None
    stress: torch.Tensor | None = None
    magmoms: torch.Tensor | None = None
    atomic_energies: torch.Tensor | None = None
    node_features: dict[str, torch.Tensor] = field(default_factory=dict)


class MatRIS(CheckpointIO, nn.Module):
    """The MatRIS interatomic potential (spec §4–§6); module names mirror published checkpoints.

    ``targets``: what the weights were trained on, ``"efsm"`` (default) or ``"efs"`` (untrained magmom head: no
    magnetic moments offered). ``name``: how error messages name the model (the loaders set the model name or file)."""

    def __init__(self, config: MatRISConfig | Mapping[str, Any] | None = None, *args: Any, **kwargs: Any):
        super().__init__()
        self.config = c = official_config(MatRISConfig, config, args, kwargs)
        self.atom_embedding = AtomEmbedding(c.node_feat_dim)
        self.edge_embedding = EdgeEmbedding(c)
        self.three_body_embedding = ThreeBodyEmbedding(c)
        self.interaction_block = nn.ModuleList(InteractionBlock(c) for _ in range(c.num_layers))
        self.readout_norm = norm(c.norm_type, c.node_feat_dim)
        self.energy_head = EnergyHead(c.node_feat_dim, c.mlp_hidden_dims, c.activation_type, c.dropout)
        self.magmom_head = MagmomHead(c.node_feat_dim, c.activation_type, c.dropout)
        self.reference_energy = ReferenceEnergy() if c.reference_energy is not None else None
        self.options = RunOptions()  # kernels, memory and TF32 (how it runs, not what it computes)
        self.targets: str = DEFAULT_TARGETS
        self.name: str = "MatRIS"
        self._compile_options: dict | None = None  # compile()'s torch.compile options (None: eager)
        self._compiled = None  # the compiled energy function

    def set_reference_width(self, n: int) -> None:
        """Per-element reference energies for ``n`` elements (a checkpoint's width, whatever its config says)."""
        self.reference_energy = ReferenceEnergy(n)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in MOVED_TO_OPTIONS:  # a removed switch would otherwise become a new, ignored attribute
            raise AttributeError(f"MatRIS.{name} is now model.options.{MOVED_TO_OPTIONS[name]} (matris.RunOptions): "
                                 f"set model.options.{MOVED_TO_OPTIONS[name]} = {value!r}")
        super().__setattr__(name, value)

    def __setstate__(self, state: dict) -> None:
        config = state.get("config")  # pickled as a plain mapping (MatRISConfig.__reduce_ex__): made a config again
        if config is not None and not isinstance(config, MatRISConfig):
            state["config"] = MatRISConfig.from_dict(dict(config))
        super().__setstate__(state)

    @property
    def dtype(self) -> torch.dtype:
        return self.atom_embedding.embedding.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.atom_embedding.embedding.weight.device

    @property
    def cutoff(self) -> float:
        return float(self.config.pairwise_cutoff)

    @property
    def three_body_cutoff(self) -> float:
        return float(self.config.three_body_cutoff)

    @property
    def predicts_magmoms(self) -> bool:
        """Whether the model was trained on magnetic moments (``"m"`` in :attr:`targets`)."""
        return "m" in self.targets

    @property
    def max_atomic_number(self) -> int:
        """The largest Z the model covers: its embedding and, if present, its reference energies."""
        z = min(MAX_Z, self.atom_embedding.embedding.num_embeddings)
        return z if self.reference_energy is None else min(z, self.reference_energy.num_elements)

    def check_elements(self, graph: GraphBatch) -> None:
        """Raise :class:`MatRISInputError` for an element beyond :attr:`max_atomic_number`. Reads Z on the host, so only
        for models covering fewer than Z ≤ 94 (the limit checked when structures are read); free for the others."""
        limit = self.max_atomic_number
        if limit >= MAX_Z or graph.num_atoms == 0:
            return
        z = graph.atomic_numbers.detach().cpu()
        if int(z.max()) <= limit:
            return
        k = int(torch.nonzero(z > limit)[0, 0])
        structure = int(graph.atom_batch[k])
        bad = sorted({element_symbol(int(v)) for v in z[z > limit].tolist()})
        why = (f"its reference energies cover Z = 1..{self.reference_energy.num_elements}"
               if self.reference_energy is not None and self.reference_energy.num_elements == limit
               else f"its atom embedding covers Z = 1..{limit}")
        raise MatRISInputError(
            f"structure {structure} contains {', '.join(bad)} "
            f"({atom_element(k, int(z[k]))}), "
            f"which model {self.name} does not cover: {why} (up to {element_symbol(limit)}). Remove those atoms or use "
            "a model that covers them (see 'matris models').")

    @property
    def is_intensive(self) -> bool:
        """Whether the energy head predicts energy per atom (published models) rather than per structure."""
        return bool(self.config.is_intensive)

    @property
    def graph_converter(self):
        """A :class:`matris.graph.GraphConverter` for this model's cutoffs and dtype: the official
        ``model.graph_converter(structure)`` → :class:`matris.graph.RadiusGraph`, for ``model([graph, ...])``."""
        from ..graph.converter import GraphConverter

        return GraphConverter(self.cutoff, self.three_body_cutoff, dtype=self.dtype)

    def get_params(self) -> int:
        """Number of parameter entries, reference energies included (the official count)."""
        return sum(p.numel() for p in self.parameters())

    def num_parameters(self) -> int:
        """Number of parameter entries (trainable or not, reference energies excluded)."""
        ref = set() if self.reference_energy is None else {id(p) for p in self.reference_energy.parameters()}
        return sum(p.numel() for p in self.parameters() if id(p) not in ref)

    def forward(self, graph: GraphBatch | Sequence[Any], *args: Any, **kwargs: Any) -> ModelOutput | dict[str, Any]:
        """:meth:`evaluate` of a :class:`GraphBatch` (→ :class:`ModelOutput`), or the official MatRIS call
        ``model([graph, ...], task="ef", is_training=False, mode="fast", activation_checkpoint=False, tf32=False)`` on a
        list of :class:`matris.graph.RadiusGraph` → the official dict (:func:`matris.official.forward_graphs`)."""
        if isinstance(graph, GraphBatch):
            return self.evaluate(graph, *args, **kwargs)
        from ..official import forward_graphs

        return forward_graphs(self, graph, *args, **kwargs)

    def evaluate(
        self,
        graph: GraphBatch,
        compute_forces: bool = True,
        compute_stress: bool = True,
        compute_magmoms: bool | None = None,
        create_graph: bool = False,
        return_node_features: bool = False,
        compute_atomic_energies: bool = False,
        options: RunOptions | None = None,
    ) -> ModelOutput:
        """Energy, forces, stress and magnetic moments of every structure in ``graph``. ``compute_magmoms``: None
        (default) only if :attr:`predicts_magmoms`, True computes the head anyway (training it). ``create_graph``: keep
        the force graph for a loss on forces (default False, even in ``train()`` mode). ``compute_atomic_energies``:
        also each atom's energy ``[N]`` (readout plus reference). ``options``: this call's :class:`RunOptions`."""
        if options is not None:
            kept, self.options = self.options, options
            try:
                return self.evaluate(graph, compute_forces, compute_stress, compute_magmoms, create_graph,
                                     return_node_features, compute_atomic_energies)
            finally:
                self.options = kept
        if compute_magmoms is None:
            compute_magmoms = self.predicts_magmoms
        self.check_precision()
        self.check_elements(graph)
        g = graph if graph.positions.dtype == self.dtype and graph.positions.device == self.device else graph.to(
            self.device, self.dtype
        )
        with torch.enable_grad() if (compute_forces or compute_stress) else contextlib.nullcontext():
            # without create_graph no weight gradient can be asked for: frozen weights let the fused backwards skip them
            frozen = contextlib.nullcontext() if create_graph else self._frozen_weights()
            with frozen, self._tf32_context(g.positions.device):
                return self._forward(g, compute_forces, compute_stress, compute_magmoms, create_graph,
                                     return_node_features, compute_atomic_energies)

    @contextlib.contextmanager
    def _frozen_weights(self):
        """``requires_grad=False`` on every trainable parameter for the duration, then restored."""
        thawed = [p for p in self.parameters() if p.requires_grad]
        for p in thawed:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in thawed:
                p.requires_grad_(True)

    def check_precision(self) -> None:
        """Refuse half precision (bf16/fp16 model, or autocast) before any kernel runs: derivatives need fp32/fp64."""
        problem = None
        if self.dtype not in (torch.float32, torch.float64):
            problem = f"the model is in {self.dtype}"
        elif torch.is_autocast_enabled(self.device.type):
            problem = f"autocast is enabled on {self.device.type}"
        if problem:
            raise MatRISInputError(
                f"{problem}: MatRIS runs in float32 or float64 only (forces and stress are derivatives that half "
                "precision cannot resolve, and the fused kernels take only those). Use model.to(torch.float32) or "
                "float64 and run outside torch.autocast; for faster float32 GEMMs on GPU use TF32 "
                "(trainer.precision: tf32).")

    def _forward(self, g, compute_forces, compute_stress, compute_magmoms, create_graph, return_node_features,
                 compute_atomic_energies=False):
        n_struct = g.num_structures
        positions = g.positions
        if compute_forces:
            positions = positions.detach().requires_grad_(True)
        strain = None
        if compute_stress:  # zero symmetric strain ε = ½(s + sᵀ) per structure; ∂E/∂s gives the virial
            strain = torch.zeros(n_struct, 3, 3, dtype=positions.dtype, device=positions.device, requires_grad=True)
        # chosen once, on the host, outside the (possibly compiled) energy function
        kernels, fast = dispatch(positions.device, self.options.kernels, create_graph)
        level = memory.inference_level(self, g, positions.dtype, create_graph, kernels.name,
                                       backward=compute_forces or compute_stress)
        compiled = self._compile_options is not None and not create_graph and not return_node_features
        if compiled and level > 0:  # the compiled backward ignores the memory levels (17 GB vs 4.8 GB eager, Si512)
            compiled = False
            if not getattr(self, "_eager_notice", False):  # said once
                self._eager_notice = True
                log.info(f"{g.n_atoms.sum().item()} atoms need memory level {level}, which runs eagerly "
                         "(compiled code keeps every activation); smaller structures use the compiled code")
        # training on forces: blocks (and rows) recomputed in the backward, fast kernels where no weight grad is wanted
        recompute_mode = memory.training_mode(self, create_graph, g, positions.dtype)
        if compiled:
            if self._compiled is None:
                log.info("compiling the model with torch.compile on its first call (tens of seconds to a few "
                         "minutes; later calls and MD steps reuse it)")
                self._compiled = torch.compile(self._energy, **self._compile_options)
            energy_fn = self._compiled
        else:
            energy_fn = self._energy
        e_model, h_norm, features, atomic_model = energy_fn(
            g, positions, strain, level, kernels, return_node_features,
            recompute=None if recompute_mode == "none" else fast, row_chunks=recompute_mode == "rows")
        n_atoms = g.n_atoms.to(e_model.dtype)
        ref = self._reference_term(g, e_model)
        if self.config.is_intensive:
            energy_per_atom = e_model / n_atoms + ref
            energy = energy_per_atom * n_atoms
        else:  # the reference adds the per-atom reference term to the total (spec §6)
            energy = e_model + ref
            energy_per_atom = energy / n_atoms

        out = ModelOutput(energy=energy, energy_per_atom=energy_per_atom, node_features=features)
        if compute_atomic_energies:
            out.atomic_energies = atomic_model + self._atomic_reference(g, ref)
        inputs = ([positions] if compute_forces else []) + ([strain] if compute_stress else [])
        if inputs:
            grads = torch.autograd.grad(
                e_model.sum(), inputs, create_graph=create_graph, allow_unused=True, materialize_grads=True
            )
            if compute_forces:
                out.forces = -grads[0]
            if compute_stress:  # volume |a · (b × c)|: a batched det may synchronise on some backends
                volume = torch.linalg.vecdot(g.cell[:, 0], torch.linalg.cross(g.cell[:, 1], g.cell[:, 2])).abs()
                valid = g.pbc.any(dim=1) & (volume > 1e-8)
                volume = torch.where(valid, volume, torch.ones_like(volume))
                stress = grads[-1] / volume[:, None, None] * EV_PER_A3_TO_GPA
                out.stress = torch.where(valid[:, None, None], stress, torch.full_like(stress, float("nan")))
        if not create_graph:
            out.energy, out.energy_per_atom = out.energy.detach(), out.energy_per_atom.detach()
            if out.atomic_energies is not None:
                out.atomic_energies = out.atomic_energies.detach()
        if compute_magmoms:
            out.magmoms = self.magmom_head(h_norm)
            if not create_graph:
                out.magmoms = out.magmoms.detach()
        return out

    def _reference_term(self, g: GraphBatch, like: torch.Tensor) -> torch.Tensor:
        """The reference term ``[S]`` of each structure (spec §6; zeros without reference energies)."""
        if self.reference_energy is None:
            return torch.zeros_like(like)
        return self.reference_energy(g.atomic_numbers, g.atom_batch, g.n_atoms)

    def _atomic_reference(self, g: GraphBatch, ref: torch.Tensor) -> torch.Tensor:
        """Each atom's share ``[N]`` (eV) of its structure's reference term ``ref`` ``[S]`` (spec §6): its element's
        reference energy for intensive models, an equal share of ``ref`` otherwise."""
        if self.reference_energy is None:
            return torch.zeros_like(g.positions[:, 0])
        if self.config.is_intensive:
            return self.reference_energy.fc.weight[0, g.atomic_numbers - 1].to(ref.dtype)
        return (ref / g.n_atoms.to(ref.dtype))[g.atom_batch]

    def _energy(self, g: GraphBatch, positions: torch.Tensor, strain: torch.Tensor | None, level: int,
                kernels: Kernels, return_node_features: bool = False, bond_vectors: torch.Tensor | None = None,
                recompute: Kernels | None = None, row_chunks: bool = False, halo=None):
        """Energy ``[S]`` (eV, reference excluded), normalised atom features ``[N, d_n]``, per-block features and
        per-atom energies ``[N]`` (eV, reference excluded, summing to the energy), differentiable in ``positions``
        ``[N, 3]`` and ``strain`` ``[S, 3, 3]`` (or None); :meth:`compile` compiles this. ``kernels``: from
        :func:`matris.kernels.dispatch`. ``bond_vectors`` ``[B, 3]`` (x_target − x_source − image shift) replace those
        from ``positions``/``strain``, giving the energy's gradient per bond (per-bond forces, per-atom virials).
        ``recompute`` (training on forces): recompute each block in the backward (:mod:`matris.model.recompute`), with
        these kernels where no weight gradient is wanted; ``row_chunks``: per-angle work by row chunks too (``"rows"``).
        ``halo``: ``g`` is a domain decomposition's rank(s); the blocks exchange through it (:mod:`matris.domain`)."""
        cell = g.cell
        if strain is not None:
            eps = (strain + strain.transpose(1, 2)) / 2
            positions = positions + torch.einsum("ni,nij->nj", positions, eps[g.atom_batch])
            cell = cell + torch.bmm(cell, eps)

        bond_batch = g.bond_batch
        if bond_vectors is None:  # bond vectors v = x_i − (x_j + n·L) of the forward edges; reverse edges are −v
            shift = torch.einsum("bi,bij->bj", g.bond_image, cell[bond_batch])
            v = positions[g.bond_target] - positions[g.bond_source] - shift
        else:
            v = bond_vectors
        r = torch.linalg.vector_norm(v, dim=-1)
        u_fwd = v / r.unsqueeze(-1)
        unit = torch.cat([u_fwd, -u_fwd])  # [2B, 3]

        n_b = g.num_bonds
        h = self.atom_embedding(g.atomic_numbers)
        e, rbf_pair, rbf_3b = self.edge_embedding(r, kernels.fused)
        u_t, u_s = unit[g.angle_target_edge], unit[g.angle_source_edge]
        theta = torch.arccos((u_t * u_s).sum(-1) * ANGLE_SHRINK)
        # the SH radial argument: |u_src| / r_c, as published models compute it (≈ 1/r_c)
        rho = torch.linalg.vector_norm(u_s, dim=-1) / self.config.pairwise_cutoff
        # the lowest levels stream the angles through the blocks by chunks (:mod:`matris.model.stream`)
        streaming = level >= memory.STREAM_LEVEL and g.num_angles > 0 and halo is None
        a = None if streaming else self.three_body_embedding(theta, rho, kernels.fused)

        if kernels.triton or (recompute is not None and recompute.triton):
            atom, line = g.segments()  # the CUDA kernels' CSR order, made once per graph
            line = None if halo is not None else line  # the line graph's sums run per end (the halo's numbering)
            kernels, recompute = (dataclasses.replace(k, atom_segments=atom, line_segments=line)
                                  if k is not None and k.triton else k for k in (kernels, recompute))
        bg = BlockGraph(
            edge_target=g.edge_target,
            edge_source=g.edge_source,
            edge_bond=torch.arange(n_b, device=h.device).repeat(2),
            angle_atom=g.angle_atom,
            angle_target_bond=g.angle_target_edge % n_b if n_b else g.angle_target_edge,
            angle_source_bond=g.angle_source_edge % n_b if n_b else g.angle_source_edge,
            rbf_pair=rbf_pair,
            rbf_3b=rbf_3b,
            kernels=kernels,
            checkpoint=int(level == 1),
            halo=halo,
        )
        fast = exact = None
        if recompute is not None:  # training's block recomputation: the fast kernels, and the references
            fast = dataclasses.replace(bg, kernels=recompute)
            exact = dataclasses.replace(bg, kernels=REFERENCES)
            if row_chunks:  # the per-angle parts and the atom graph's Φ by row chunks in each block's recomputation
                rows = RowRecompute(memory.chunk_rows(self, g.num_angles), recompute)
                exact = dataclasses.replace(exact, rows=rows, lines=RowLines())
        features = {"embedding": h} if return_node_features else {}
        last = len(self.interaction_block) - 1
        if streaming:
            modules = (self.interaction_block, self.three_body_embedding)
            plan = stream.Plan(self.interaction_block, self.three_body_embedding, bg,
                               memory.kept_blocks(level, last + 1), memory.stream_rows(self),
                               [p for m in modules for p in m.parameters() if p.requires_grad])
            hs = stream.streamed(plan, h, e, theta, rho, rbf_pair, rbf_3b)
            features.update({f"block_{k}": x for k, x in enumerate(hs)} if return_node_features else {})
            h = hs[-1]
        for k, block in enumerate([] if streaming else self.interaction_block):
            if halo is not None:
                halo.block = k
            if fast is not None:
                h, e, a = checkpointed_block(block, h, e, a, fast, exact, last=k == last)
            else:
                h, e, a = block(h, e, a, bg, last=k == last)
            if return_node_features:
                features[f"block_{k}"] = h

        h_norm = self.readout_norm(h)
        atomic_energy = self.energy_head(h_norm)
        s_pad = g.num_structures + 1  # one spare slot: Inductor's CPU codegen (torch 2.13) fails on a size-1 scatter
        e_model = atomic_energy.new_zeros(s_pad).index_add(0, g.atom_batch, atomic_energy)[: g.num_structures]
        return e_model, h_norm, features, atomic_energy

    def compile(self, dynamic: bool = True, fullgraph: bool = False, **kwargs: Any) -> "MatRIS":
        """Compile :meth:`_energy` with ``torch.compile``, in place; returns ``self``. ``dynamic`` lets MD steps with
        changing numbers of atoms, bonds and angles reuse one graph; forces and stress come from the compiled backward;
        the fused ``torch.ops.matris`` operators (C++ on CPU, Triton on CUDA) are registered so as not to break the
        graph. Inference only: training calls (no double backward) and memory levels below 0 (:mod:`matris.memory`) run
        eagerly. ``kwargs`` go to ``torch.compile``; the first call compiles (tens of seconds)."""
        from .compile import apply_defaults

        apply_defaults()  # equal sizes need not stay equal between calls (one graph for more MD steps)
        self._compile_options = dict(dynamic=dynamic, fullgraph=fullgraph, **kwargs)
        self._compiled = None  # made on the next call
        return self

    @property
    def compiled(self) -> bool:
        """Whether :meth:`compile` is in effect."""
        return self._compile_options is not None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_compiled"] = None  # copies/pickles keep the compile options; the function is made again on use
        return state

    @contextlib.contextmanager
    def _tf32_context(self, device: torch.device):
        """TF32 matmuls during a call when ``options.tf32`` is set, on CUDA; the global setting is restored after."""
        if not (self.options.tf32 and device.type == "cuda"):
            yield
            return
        matmul = torch.backends.cuda.matmul
        name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
        before = getattr(matmul, name)
        setattr(matmul, name, "tf32" if name == "fp32_precision" else True)
        try:
            yield
        finally:
            setattr(matmul, name, before)

    def predict(self, structures: Sequence[Any] | Any, batch_size: int = 16, **kwargs: Any):
        """Predict energy, forces, stress and magnetic moments of Atoms/Structures (see :func:`matris.predict.predict`):
        a list of :class:`matris.predict.Prediction` (one for a single structure)."""
        from ..predict import predict

        return predict(self, structures, batch_size=batch_size, **kwargs)
