"""The official MatRIS 1.0 call shapes over our model: ``model([graph, ...], task=..., mode=...)``
returning the official prediction dict, and how the official switches (``mode``,
``activation_checkpoint``, ``tf32``) map onto :class:`~matris.RunOptions`.

=========================  ==========================================================================
official                   here
=========================  ==========================================================================
``mode="fast"``            ``RunOptions(kernels="auto")``: the fused kernels (Triton on CUDA, C++ on a
                           CPU); the official ``"fast"`` is its CUDA operators + ``torch.compile``
``mode="torch"``           ``RunOptions(kernels="torch")``: the PyTorch reference of every operator
``activation_checkpoint``  True: ``memory_level=None``, the fastest memory level that fits (adaptive
                           recomputation, as the official CUDA path); False: ``memory_level=0``, keep
                           every activation
``tf32``                   ``RunOptions(tf32=...)``: TF32 matmuls on CUDA
=========================  ==========================================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Sequence

import torch

from .settings import RunOptions

#: the official prediction tasks: e energy, f forces, s stress, m magnetic moments
TASKS = ("e", "em", "ef", "efs", "efsm")
MODES = ("fast", "torch")
EV_PER_A3_TO_GPA = 160.21766208


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"Unsupported task {task!r}; choose e, em, ef, efs, or efsm.")
    return task


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}; choose 'fast' or 'torch'.")
    return mode


def run_options(base: RunOptions, mode: str = "fast", activation_checkpoint: bool = False,
                tf32: bool = False) -> RunOptions:
    """``base`` with the official switches applied (the table of the module docstring)."""
    check_mode(mode)
    return dataclasses.replace(base, kernels="torch" if mode == "torch" else base.kernels,
                               memory_level=base.memory_level if activation_checkpoint else 0, tf32=bool(tf32))


def forward_graphs(model: Any, graphs: Sequence[Any], task: str = "ef", is_training: bool = False,
                   mode: str = "fast", *, activation_checkpoint: bool = False, tf32: bool = False) -> dict[str, Any]:
    """The official ``MatRIS.forward`` of ``model`` (a :class:`matris.MatRIS`): a list of
    :class:`~matris.graph.RadiusGraph` → the dict

    - ``"e"``: ``[S]`` energy per atom (eV/atom; the total for a model with ``is_intensive=False``),
      reference energies included;
    - ``"f"``: forces per graph, a tuple of ``[n_i, 3]`` eV/Å (tasks with f);
    - ``"s"``: stress per graph, a list of ``[3, 3]`` GPa, positive = tensile (tasks with s);
    - ``"m"``: magnetic moments per graph, a list of ``[n_i]`` μB (tasks with m);
    - ``"atoms_per_graph"``: ``[S]`` int32; ``"ref_energy"``: ``[S]`` the reference term in ``"e"``'s
      unit (0 for a model without reference energies).

    ``is_training`` keeps the graph of the forces for a loss on them (as in the official code, the
    model's train/eval mode decides dropout only).
    """
    from .graph.radiusgraph import RadiusGraph, graphs_to_batch

    check_task(task)
    check_mode(mode)
    if isinstance(graphs, RadiusGraph):
        graphs = [graphs]
    batch = graphs_to_batch(graphs, device=model.device, dtype=model.dtype)
    training = bool(is_training)
    options = run_options(model.options, mode, activation_checkpoint, tf32)
    out = model(batch, compute_forces="f" in task, compute_stress="s" in task, compute_magmoms="m" in task,
                create_graph=training, options=options)
    counts = batch.n_atoms.tolist()
    atoms = batch.n_atoms.to(torch.int32)
    intensive = bool(model.config.is_intensive)
    prediction: dict[str, Any] = {}
    if out.forces is not None:
        prediction["f"] = torch.split(out.forces, counts)
    if out.stress is not None:
        # the official code reports a stress for every graph (its cell is complete): so do we
        prediction["s"] = list(torch.unbind(torch.nan_to_num(out.stress, nan=0.0), 0))
    if out.magmoms is not None:
        prediction["m"] = list(torch.split(out.magmoms, counts))
    prediction["e"] = out.energy_per_atom if intensive else out.energy
    prediction["atoms_per_graph"] = atoms
    if model.reference_energy is None:
        prediction["ref_energy"] = 0
    else:
        ref = model._reference_term(batch, out.energy)  # [S], the unit of "e"
        prediction["ref_energy"] = ref if training else ref.detach()
    return prediction


__all__ = ["TASKS", "MODES", "check_task", "check_mode", "run_options", "forward_graphs"]


def official_config(config_class: type, config: Any, args: tuple, kwargs: dict) -> Any:
    """The config of ``MatRIS(config, *args, **kwargs)``: a ``config_class`` (:class:`matris.MatRISConfig`)
    or its dict, or the official constructor's config values, positional in its order
    (``MatRIS(num_layers, node_feat_dim, ...)``) or by keyword."""
    if config is not None and not isinstance(config, (config_class, Mapping)):
        # the official constructor's positional arguments: MatRIS(num_layers, node_feat_dim, ...)
        args = (config, *args)
        config = None
    if args:
        names = [f.name for f in dataclasses.fields(config_class)]
        if len(args) > len(names):
            raise TypeError(f"MatRIS takes at most {len(names)} positional config values, got {len(args)}")
        clash = sorted(set(names[: len(args)]) & set(kwargs))
        if clash:
            raise TypeError(f"MatRIS got multiple values for {clash}")
        kwargs = {**dict(zip(names, args)), **kwargs}
    if config is None:
        unknown = sorted(set(kwargs) - {f.name for f in dataclasses.fields(config_class)})
        if unknown:
            raise TypeError(f"MatRIS got unexpected config keys {unknown}{_closest(unknown[0], config_class)}")
        config = config_class(**kwargs)
    elif kwargs:
        raise TypeError("pass either a config_class or keyword arguments, not both")
    elif not isinstance(config, config_class):
        config = config_class.from_dict(dict(config))
    return config


def _closest(key: str, config_class: type) -> str:
    """'' or "; did you mean 'x'?" for a misspelt config key."""
    import difflib

    match = difflib.get_close_matches(key, [f.name for f in dataclasses.fields(config_class)], n=1)
    return f"; did you mean {match[0]!r}?" if match else ""
