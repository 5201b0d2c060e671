"""Segment reductions over edges: the scatter-sum and per-channel softmax of spec §5.

PyTorch references, on any device and twice differentiable (training on forces differentiates through the forces)."""

from __future__ import annotations

import torch


def scatter_sum(src: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """``out[n] = Σ_{index[k] = n} src[k]``: src ``[n_edges, C]``, index ``[n_edges]`` int64 → ``[num_segments, C]``."""
    out = src.new_zeros((num_segments,) + tuple(src.shape[1:]))
    return out.index_add(0, index, src)


def segment_max(values: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """``out[n] = max_{index[k] = n} values[k]`` per channel → ``[num_segments, C]`` (0 for a
    segment without rows), without a graph: the shift that keeps exponentials of ``values`` finite."""
    out = values.new_full((num_segments, values.shape[1]), float("-inf"))
    out = out.scatter_reduce(0, index.unsqueeze(1).expand_as(values), values.detach(), "amax", include_self=True)
    return out.nan_to_num(neginf=0.0)


def segment_softmax(logits: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Softmax over the edges that share ``index``, separately for every channel.

    logits ``[n_edges, C]``, index ``[n_edges]`` → ``[n_edges, C]``, summing to one per segment and channel. The
    segment maximum is subtracted for stability, detached (the softmax does not depend on it)."""
    if logits.shape[0] == 0:
        return logits
    w = torch.exp(logits - segment_max(logits, index, num_segments).index_select(0, index))
    denom = scatter_sum(w, index, num_segments)
    return w / denom.index_select(0, index)
