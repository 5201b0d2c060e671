"""Per-block activation checkpointing for training on forces, exact to second order.

Training on forces differentiates twice: the forces are ``−∂E/∂x`` with ``create_graph``, and the
loss on them is differentiated again. Kept whole, that graph holds every intermediate of every
block (the forward's and the first backward's): 16 GB for a 16-atom rocksalt oxide (15,872
angles) with the published 10M architecture, about 60 GB for a 64-atom one (the memory model's
prediction; ``benchmarks/train_memory.py``, ``benchmarks/results/train_memory.json``). ``torch.utils.checkpoint`` does not help here: the first backward
recomputes a block and its ``create_graph`` graph then keeps the recomputed tensors alive until the
second.

Here a block is one autograd node whose backward is itself one differentiable node:

- :class:`_Block` (forward): the block without a graph; it keeps only its inputs ``(h, e, a,
  rbf_pair, rbf_3b)`` and the parameters (references).
- its backward, inside the force computation (``create_graph``): :class:`_BlockVJP`, whose forward
  recomputes the block and returns the input gradients ``J_xᵀ·G`` without a graph (input gradients
  only: the fused kernels' own backwards), keeping only the upstream gradients ``G``.
- :class:`_BlockVJP`'s backward, in the loss's backward: the block recomputed with autograd, its
  input gradients with ``create_graph``, and those differentiated against the incoming
  gradients: the second-order terms (``∂/∂x``, ``∂/∂G``, ``∂/∂θ``) of that block alone.
- :class:`_Block`'s backward without a graph (the energy terms of the loss): the block recomputed
  with autograd, first-order gradients of inputs and parameters.

So at any moment one block's intermediates are alive, next to the inputs and upstream gradients
of all blocks (a few per-angle rows each): 3.1 GB for the 16-atom oxide, 10.9 GB for the 64-atom
one. The recomputations in which no parameter gradient is
wanted run the call's fast kernels (the fused CPU operators or the Triton kernels); the others the
composed ops, the references of the same formulas: the gradients equal the un-checkpointed ones
to float rounding (``tests/test_recompute.py`` checks 1e-12 in float64, with the second-order terms).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from .block import BlockGraph

@dataclass(eq=False)
class _Spec:
    """What a recomputation needs besides tensors: ``module`` and ``arguments(inputs, fast)``, which
    gives the positional and keyword arguments of a call of ``module`` on the differentiable
    ``inputs`` with the call's fast kernels (``fast``) or the composed ops; ``names``: the module's
    parameter names, in the order the parameters are passed."""

    module: nn.Module
    arguments: object
    names: tuple[str, ...]
    n_inputs: int

    def run(self, fast: bool, inputs, params=None):
        """The module on ``inputs``; ``params`` (tensors in the order of ``names``) replace its
        parameters for the call (detached copies: no weight gradient)."""
        args, kwargs = self.arguments(inputs, fast)
        if params is None:
            return tuple(self.module(*args, **kwargs))
        return tuple(functional_call(self.module, dict(zip(self.names, params)), args, kwargs))


def recomputed(module: nn.Module, arguments, inputs: list) -> tuple[torch.Tensor, ...]:
    """``module(*args, **kwargs)`` (a tuple of tensors), ``args, kwargs = arguments(inputs, True)``, as
    one autograd node that keeps only ``inputs`` and recomputes the rest in the backward passes (see
    the module docstring); ``arguments(inputs, False)`` must give the same call with the composed ops."""
    named = list(module.named_parameters())
    names, params = tuple(n for n, _ in named), [p for _, p in named]
    spec = _Spec(module, arguments, names, len(inputs))
    return _Block.apply(spec, *inputs, *params)


def checkpointed_block(block: nn.Module, h: torch.Tensor, e: torch.Tensor, a: torch.Tensor, fast: BlockGraph,
                       exact: BlockGraph, last: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``block(h, e, a, graph, last)`` with its activations recomputed in the backward passes (see
    the module docstring). ``fast`` and ``exact``: the same graph with the call's fast kernels and
    with the composed ops; their ``rbf_pair`` and ``rbf_3b`` are the bases the block reads."""

    def arguments(inputs, use_fast):
        h_, e_, a_, rbf_pair, rbf_3b = inputs
        g = dataclasses.replace(fast if use_fast else exact, rbf_pair=rbf_pair, rbf_3b=rbf_3b)
        return (h_, e_, a_, g), {"last": last}

    return recomputed(block, arguments, [h, e, a, fast.rbf_pair, fast.rbf_3b])


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


class _Block(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec: _Spec, *tensors):
        inputs = tensors[: spec.n_inputs]
        out = spec.run(True, inputs)  # Function.forward runs without a graph
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
        with torch.enable_grad():
            xs = _detached(tensors[:k], needs[:k])
            params = list(tensors[k:])
            out = spec.run(False, xs)
            g = _grads(out, xs + [p if w else None for p, w in zip(params, needs[k:])], grads)
        return (None, *g)


class _BlockVJP(torch.autograd.Function):
    """``G → ∂(Σ out·G)/∂inputs`` of one recomputed module (a block: ``(G_h, G_e, G_a)`` → the
    gradients of ``(h, e, a, rbf_pair, rbf_3b)``), a differentiable node (see the module docstring)."""

    @staticmethod
    def forward(ctx, spec: _Spec, needs, n_out: int, *args):
        grads, tensors = args[:n_out], args[n_out:]
        k = spec.n_inputs
        inputs, params = tensors[:k], tensors[k:]
        with torch.enable_grad():
            xs = _detached(inputs, needs[:k])
            # detached parameters: input gradients only, so the fast kernels run their own backwards
            out = spec.run(True, xs, [p.detach() for p in params])
            g_in = _grads(out, xs, grads)
        ctx.spec, ctx.needs, ctx.n_out = spec, needs, n_out
        ctx.save_for_backward(*grads, *tensors)
        return tuple(g_in)

    @staticmethod
    def backward(ctx, *ggs):
        spec, needs, n_out = ctx.spec, ctx.needs, ctx.n_out
        saved = ctx.saved_tensors
        grads, tensors = saved[:n_out], saved[n_out:]
        k = spec.n_inputs
        inputs, params = tensors[:k], list(tensors[k:])
        with torch.enable_grad():
            xs = _detached(inputs, needs[:k])
            gs = _detached(grads, ctx.needs_input_grad[3 : 3 + n_out])
            # the block and its input gradients with a graph (composed ops: weight gradients wanted)
            out = spec.run(False, xs)
            g_in = _grads(out, xs, [g if g is not None else torch.zeros_like(o) for g, o in zip(gs, out)],
                          create_graph=True)
            wanted_params = [p if w else None for p, w in zip(params, needs[k:])]
            result = _grads(g_in, gs + xs + wanted_params, ggs)
        return (None, None, None, *result)
