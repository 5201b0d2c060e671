"""Segment reductions (kernels/segment.py) against plain loops, with first and second derivatives."""

import pytest
import torch

from matris.kernels import scatter_sum, segment_softmax


def loop_softmax(x, index, n):
    out = torch.zeros_like(x)
    for s in range(n):
        rows = index == s
        if rows.any():
            out[rows] = torch.softmax(x[rows], dim=0)
    return out


@pytest.mark.parametrize("n_edges,n_seg", [(1, 1), (7, 3), (50, 9), (0, 4)])
def test_segment_softmax_matches_loop(n_edges, n_seg):
    g = torch.Generator().manual_seed(n_edges)
    x = torch.randn(n_edges, 5, generator=g, dtype=torch.float64) * 30  # large logits: needs the max shift
    index = torch.randint(0, n_seg, (n_edges,), generator=g)
    got = segment_softmax(x, index, n_seg)
    torch.testing.assert_close(got, loop_softmax(x, index, n_seg))
    if n_edges:
        sums = scatter_sum(got, index, n_seg)
        present = torch.bincount(index, minlength=n_seg) > 0
        torch.testing.assert_close(sums[present], torch.ones_like(sums[present]))
        assert torch.all(sums[~present] == 0)  # empty segments stay zero


def test_scatter_sum_matches_loop():
    x = torch.randn(20, 3, dtype=torch.float64)
    index = torch.randint(0, 6, (20,))
    want = torch.stack([x[index == s].sum(0) for s in range(6)])
    torch.testing.assert_close(scatter_sum(x, index, 6), want)


def test_gradcheck_and_gradgradcheck():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 3, dtype=torch.float64, generator=g, requires_grad=True)
    m = torch.randn(12, 3, dtype=torch.float64, generator=g, requires_grad=True)
    index = torch.tensor([0, 0, 1, 1, 1, 3, 3, 3, 3, 4, 0, 1])

    def f(x, m):
        return scatter_sum(segment_softmax(x, index, 5) * m, index, 5)

    assert torch.autograd.gradcheck(f, (x, m))
    assert torch.autograd.gradgradcheck(f, (x, m))
