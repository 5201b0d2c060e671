"""Activation recomputation for training on forces, exact to second order: per block, and per chunk of rows inside it.

Training on forces differentiates twice: the forces ``−∂E/∂x`` with ``create_graph``, then the loss on them. Kept
whole, that graph holds every intermediate of every block: 16 GB for a 16-atom rocksalt oxide (15,872 angles) with the
published 10M architecture, ~60 GB predicted for 64 atoms (``benchmarks/train_memory.py``). ``torch.utils.checkpoint``
does not help: the first backward's ``create_graph`` graph keeps the recomputed tensors alive until the second.

Here a block is one autograd node whose backward is itself one differentiable node:

- :class:`_Block` (forward): the block without a graph; keeps only inputs ``(h, e, a, rbf_pair, rbf_3b)`` and params.
- its backward, inside the force computation (``create_graph``): :class:`_BlockVJP`, whose forward recomputes the block
  and returns the input gradients ``J_xᵀ·G`` without a graph (the fused kernels' own backwards), keeping only ``G``.
- :class:`_BlockVJP`'s backward (the loss's): the block recomputed with autograd, its input gradients with
  ``create_graph`` differentiated against the incoming ones: its second-order terms (``∂/∂x``, ``∂/∂G``, ``∂/∂θ``).
- :class:`_Block`'s backward without a graph (the loss's energy terms): the block recomputed with autograd on the fast
  kernels, first-order gradients of inputs and parameters.

That is ``model.options.training_recompute = "blocks"`` (:data:`matris.settings.RECOMPUTE_MODES`). With ``"rows"`` the
same node nests: inside a block's recomputation its widest work is such a node too, recomputed by
:data:`matris.memory.CHUNK_ROWS` rows (:class:`_Gathered`) where they make several chunks (:meth:`RowRecompute.splits`):

- each line-graph step's per-angle part (:class:`matris.model.block.RowLines`), each chunk on the bonds and atoms it
  touches only, its sums into the bonds in the form of :mod:`matris.model.block`;
- the atom graph's Φ on the directed bonds (:func:`matris.model.attention.recomputed_phi`), with Φ's first-layer
  per-node terms projected once per step (:func:`matris.model.attention.project_terms`): a chunk multiplies its rows.

So at any moment one block's intermediates are alive (per angle, one chunk's), next to all blocks' inputs and upstream
gradients (numbers in ``benchmarks/results/train_memory.json``). The nesting adds three fast-kernel passes to the
backward (forward, input gradients, first order with weight gradients). First-order recomputations run the call's fast
kernels (fused CPU operators or Triton); the second-order one the composed ops, references of the same formulas: the
gradients equal the un-checkpointed ones to float rounding (``tests/test_recompute.py``: 1e-12 in float64)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from ..kernels import Kernels


@dataclass(frozen=True)
class RowRecompute:
    """A block's per-row work (Φ, the line-graph steps) recomputed ``chunk`` rows at a time in the backward passes
    (training's ``rows`` mode; the atom graph's Φ in :mod:`matris.model.stream`); ``kernels``: the call's fast ones."""

    chunk: int
    kernels: Kernels

    def splits(self, n_rows: int) -> bool:
        """Whether ``n_rows`` make more than one chunk (one chunk as its own node would save nothing, cost 3 passes)."""
        return n_rows > self.chunk


@dataclass(eq=False)
class _Spec:
    """What a recomputation needs besides tensors: ``module`` and ``arguments(inputs, fast, rows)``, giving the args
    and kwargs of a call of ``module`` on the differentiable ``inputs`` with the call's fast kernels (``fast``) or the
    composed ops, on the rows ``rows`` (a slice, or None: all); ``names``: the parameter names, in passing order.
    ``chunk`` > 0: the module is row-wise (row k of each output depends on row k of the inputs marked in ``row_inputs``
    and on whole other inputs only) and the backward passes recompute it ``chunk`` rows at a time. ``row_outputs``:
    which outputs are row-wise (None: all); the others are sums over the rows (``scatter_sum`` into nodes), whose
    upstream gradient every chunk reads whole. ``fast_first_order``: the first-order backward runs the fast call (False:
    the composed one, which nests row-chunked nodes running fast chunk by chunk; the fast call would hold all rows)."""

    module: nn.Module
    arguments: object
    names: tuple[str, ...]
    n_inputs: int
    chunk: int = 0
    row_inputs: tuple[bool, ...] = ()
    n_rows: int = 0
    row_outputs: tuple[bool, ...] | None = None
    fast_first_order: bool = True

    def run(self, fast: bool, inputs, params=None, rows: slice | None = None):
        """The module on ``inputs`` (row-wise ones already cut to ``rows``); ``params`` (in the order of ``names``)
        replace its parameters for the call (detached copies: no weight gradient)."""
        args, kwargs = self.arguments(inputs, fast, rows)
        if params is None:
            return tuple(self.module(*args, **kwargs))
        return tuple(functional_call(self.module, dict(zip(self.names, params)), args, kwargs))

    def slices(self) -> list:
        """The row ranges of the backward passes' recomputations: ``[None]`` (all at once) unless chunked."""
        if not self.chunk or self.n_rows <= self.chunk:
            return [None]
        return [slice(lo, min(lo + self.chunk, self.n_rows)) for lo in range(0, self.n_rows, self.chunk)]

    def output_rows(self, n_out: int) -> tuple[bool, ...]:
        """Which of the ``n_out`` outputs are row-wise."""
        return (True,) * n_out if self.row_outputs is None else self.row_outputs

    def cut(self, grads, rows: slice | None):
        """The outputs' upstream gradients for ``rows``: a row-wise output's cut, a summed output's whole."""
        if rows is None:
            return list(grads)
        return [g[rows] if (g is not None and r) else g for g, r in zip(grads, self.output_rows(len(grads)))]

    def take(self, tensors, rows: slice | None):
        """``tensors`` (one per input) with the row-wise ones cut to ``rows``."""
        if rows is None:
            return list(tensors)
        return [t[rows] if (t is not None and r) else t for t, r in zip(tensors, self.row_inputs)]


class _Gathered:
    """Chunked recomputations' gradients put together: row-wise ones written at their rows, the others summed."""

    def __init__(self, like, row_wise):
        self.like, self.row_wise = like, row_wise
        self.out = [None] * len(like)

    def add(self, grads, rows: slice | None):
        for k, g in enumerate(grads):
            if g is None:
                continue
            if rows is not None and self.row_wise[k]:
                if self.out[k] is None:
                    self.out[k] = self.like[k].new_zeros(self.like[k].shape)
                self.out[k][rows] = g
            else:
                self.out[k] = g if self.out[k] is None else self.out[k] + g


def recomputed(module: nn.Module, arguments, inputs: list, chunk: int = 0, row_inputs=(), n_rows: int = 0,
               row_outputs=None, fast_first_order: bool = True) -> tuple[torch.Tensor, ...]:
    """``module(*args, **kwargs)`` (a tuple of tensors), ``args, kwargs = arguments(inputs, True, None)``, as one
    autograd node keeping only ``inputs`` and recomputing the rest in the backward passes (module docstring);
    ``arguments(inputs, False, rows)`` must give the same call with the composed ops. Others: :class:`_Spec`."""
    named = list(module.named_parameters())
    names, params = tuple(n for n, _ in named), [p for _, p in named]
    spec = _Spec(module, arguments, names, len(inputs), chunk, tuple(row_inputs), n_rows,
                 None if row_outputs is None else tuple(row_outputs), fast_first_order)
    return _Block.apply(spec, *inputs, *params)


def _detached(tensors, wanted):
    """Leaves for a recomputation: detached, requiring grad where ``wanted``."""
    return [t.detach().requires_grad_(bool(w)) if t is not None else None for t, w in zip(tensors, wanted)]


def _grads(outputs, inputs, grad_outputs, create_graph=False):
    """∂(Σ outputs·grad_outputs)/∂inputs, None for an input that is None, needs none or gets none."""
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o is not None and g is not None and o.requires_grad]
    targets = [(k, x) for k, x in enumerate(inputs) if x is not None and x.requires_grad]
    result = [None] * len(inputs)
    if not pairs or not targets:
        return result
    got = torch.autograd.grad([o for o, _ in pairs], [x for _, x in targets], [g for _, g in pairs],
                              create_graph=create_graph, allow_unused=True)
    for (k, _), g in zip(targets, got):
        result[k] = g
    return result


def _forward_by_rows(spec: _Spec, inputs) -> tuple[torch.Tensor, ...]:
    """The module's outputs without a graph: chunk by chunk where row-wise (row-wise outputs written at their rows, the
    others summed), else at once on the fast kernels, or, where rows nest inside (``fast_first_order`` False), on the
    composed call, whose nested row nodes compute their own chunks."""
    if len(spec.slices()) == 1:
        return spec.run(spec.fast_first_order, inputs)
    out = None
    for rows in spec.slices():
        part = spec.run(True, spec.take(inputs, rows), rows=rows)
        if out is None:
            out = [p.new_empty((spec.n_rows, *p.shape[1:])) if r else torch.zeros_like(p)
                   for p, r in zip(part, spec.output_rows(len(part)))]
        for o, p, r in zip(out, part, spec.output_rows(len(part))):
            if r:
                o[rows] = p
            else:
                o += p
    return tuple(out)


class _Block(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec: _Spec, *tensors):
        inputs = tensors[: spec.n_inputs]
        out = _forward_by_rows(spec, inputs)  # Function.forward runs without a graph
        ctx.set_materialize_grads(False)  # an unused output (the last block's angles) gets no zero gradient
        ctx.spec = spec
        ctx.save_for_backward(*tensors)
        # an output that is an input (the last block's e and a): a new tensor, so the node owns it
        return tuple(o.clone() if any(o is t for t in inputs) else o for o in out)

    @staticmethod
    def backward(ctx, *grads):
        spec = ctx.spec
        tensors = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:]
        if torch.is_grad_enabled():  # inside a create_graph backward (the forces of a training step)
            g_in = _BlockVJP.apply(spec, needs, len(grads), *grads, *tensors)
            return (None, *g_in, *[None] * (len(tensors) - spec.n_inputs))
        # first order, without a graph (the loss's energy terms): inputs and parameters
        k = spec.n_inputs
        inputs, params = tensors[:k], list(tensors[k:])
        wanted = [p if w else None for p, w in zip(params, needs[k:])]
        total = _Gathered(list(inputs) + params, spec.row_inputs + (False,) * len(params))
        for rows in spec.slices():
            with torch.enable_grad():
                xs = _detached(spec.take(inputs, rows), needs[:k])
                # the fast kernels: their first-order backwards give the weight gradients too
                out = spec.run(spec.fast_first_order, xs, rows=rows)
                total.add(_grads(out, xs + wanted, spec.cut(grads, rows)), rows)
        return (None, *total.out)


class _BlockVJP(torch.autograd.Function):
    """``G → ∂(Σ out·G)/∂inputs`` of a recomputed module, differentiable (a block: ``(G_h, G_e, G_a)`` → 5 inputs)."""

    @staticmethod
    def forward(ctx, spec: _Spec, needs, n_out: int, *args):
        grads, tensors = args[:n_out], args[n_out:]
        k = spec.n_inputs
        inputs, params = tensors[:k], tensors[k:]
        frozen = [p.detach() for p in params]
        total = _Gathered(inputs, spec.row_inputs)
        for rows in spec.slices():
            with torch.enable_grad():
                xs = _detached(spec.take(inputs, rows), needs[:k])
                # detached parameters: input gradients only, so the fast kernels run their own backwards
                out = spec.run(True, xs, frozen, rows)
                total.add(_grads(out, xs, spec.cut(grads, rows)), rows)
        ctx.spec, ctx.needs, ctx.n_out = spec, needs, n_out
        ctx.save_for_backward(*grads, *tensors)
        return tuple(total.out)

    @staticmethod
    def backward(ctx, *ggs):
        spec, needs, n_out = ctx.spec, ctx.needs, ctx.n_out
        saved = ctx.saved_tensors
        grads, tensors = saved[:n_out], saved[n_out:]
        k = spec.n_inputs
        inputs, params = tensors[:k], list(tensors[k:])
        wanted = [p if w else None for p, w in zip(params, needs[k:])]
        total = _Gathered(list(grads) + list(inputs) + params,
                          spec.output_rows(n_out) + spec.row_inputs + (False,) * len(params))
        for rows in spec.slices():
            with torch.enable_grad():
                xs = _detached(spec.take(inputs, rows), needs[:k])
                gs = _detached(spec.cut(grads, rows), ctx.needs_input_grad[3 : 3 + n_out])
                # the module and its input gradients with a graph (composed ops: weight gradients wanted)
                out = spec.run(False, xs, rows=rows)
                g_in = _grads(out, xs, [g if g is not None else torch.zeros_like(o) for g, o in zip(gs, out)],
                              create_graph=True)
                total.add(_grads(g_in, gs + xs + wanted, spec.take(ggs, rows)), rows)
        return (None, None, None, *total.out)
