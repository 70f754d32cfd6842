"""Sliding-window attention in padded groups (backends/window_groups.py) equals a plain
per-request masked softmax computed here in float64, for lengths below, at and above the
window, bidirectional and causal, with grouped-query heads."""
from __future__ import annotations

import pytest
import torch

from vllm.attention.backends import window_groups
from vllm.attention.backends.masked import masked_attention
from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention

WINDOW = (4, 4)
# Longest first (the runner's layout): above the window (30, 17, 6), at it (5: the
# farthest key is exactly 4 away), below it (3, 1); 17/6/5 force padded groups.
LENGTHS = [30, 17, 6, 5, 5, 3, 1]


def _reference(q, k, v, lengths, window, causal, scale):
    """Per request: softmax(q k^T * scale, keys outside the window cut) v, float64."""
    out, start = [], 0
    groups = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = (x[start:start + n].double().transpose(0, 1) for x in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        allowed = torch.tensor([[-window[0] <= j - i <= (0 if causal else window[1])
                                 for j in range(n)] for i in range(n)])
        scores = (qs @ ks.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf"))
        out.append((torch.softmax(scores, -1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("causal", [False, True])
def test_window_groups_equal_plain_masked_attention(causal):
    torch.manual_seed(0)
    layer = Attention(num_heads=4, head_dim=8, num_kv_heads=2, window=WINDOW)
    t = sum(LENGTHS)
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    starts = [sum(LENGTHS[:i]) for i in range(len(LENGTHS) + 1)]
    meta = AttentionMetadata(starts, [0] * len(LENGTHS), LENGTHS, None,
                             [[] for _ in LENGTHS], 16, causal=causal)
    groups = meta.prepared(window_groups.WindowLayout(WINDOW))
    assert len(groups) > 1 and any(g.valid is not None for g in groups)  # padding used
    with torch.inference_mode():
        got = masked_attention(layer, q, k, v, meta)
    want = _reference(q, k, v, LENGTHS, WINDOW, causal, layer.scale)
    assert (got.double() - want).abs().max() < 1e-5
    # The window matters: without it the long request's rows differ.
    full = _reference(q, k, v, LENGTHS, (100, 100), causal, layer.scale)
    assert (got.double() - full).abs().max() > 1e-2


def test_padding_bound_splits_groups():
    """Requests join a group only while its padded work stays within the bound."""
    assert window_groups._run_end([10, 10, 9], 0) == 3
    assert window_groups._run_end([30, 17, 6], 0) == 1
    assert window_groups._run_end([17, 6, 5], 1) == 3
