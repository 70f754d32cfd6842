"""MPNet encoder (all-mpnet-base-v2) and its sequence-classification head.

A post-LayerNorm BERT-style encoder without segment embeddings whose attention scores get
a learned per-head bias indexed by the bucketed distance between query and key (T5-style
buckets: exact below 8, log-spaced up to 128, one half per direction). One bias table is
shared by every layer. Positions are numbered from padding_idx + 1 = 2, as RoBERTa's.

No attention backend takes an additive bias, so the layers attend through SDPA with the
bias as a float mask, over the flat, padding-free batch cut into `window_groups`' groups
(requests longest first, padded work within 1.3x of the exact work). A request of n tokens
uses the top-left n x n block of the step's bias (it depends only on the distance),
computed once per step for the longest request. Long requests run one SDPA call each on
zero-copy slices with that block as a view; short ones, where a call's fixed cost (a
parallel region, or a CUDA launch) outweighs its work, run as one padded call per group:
padding keys get -inf in a materialised mask, padded query rows are dropped. Measured on
MPNet-shaped layers (12 heads, 128 mixed texts of 8-200 words, CPU), this split spent about 40% less CPU
in attention than either all-per-request or all-padded. An encoder keeps no KV cache, so
prefix caching and chunked prefill stay off (the gate's rule).
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention.backends.window_groups import WindowGroup, WindowLayout
from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.linear import Linear, mlp_add
from vllm.model_executor.lora_target import LoRATarget, linear_at, whole
from vllm.model_executor.models.bert import get_activation
from vllm.model_executor.models.roberta import RobertaClassifierHead
from vllm.model_executor.weight_utils import load_mapped

PADDING_IDX = 1        # MPNet's embeddings fix it, whatever the config's pad_token_id
NUM_BUCKETS = 32       # transformers' MPNet always buckets with these two values
MAX_DISTANCE = 128
# Groups whose longest request has this many tokens run one request per SDPA call; shorter
# ones as padded batches whose float mask ([b, H, n, n], built per call) stays under
# MAX_MASK_BYTES (a bigger group is split).
ALONE_FROM = 64
MAX_MASK_BYTES = 32 << 20
_NO_WINDOW = (1 << 30, 1 << 30)   # WindowLayout's padded groups, with no key cut
_QKV = {"q": 0, "k": 1, "v": 2}
_LAYER_NAMES = {"attention.attn.o": "attn_out", "attention.LayerNorm": "attn_norm",
                "intermediate.dense": "intermediate", "output.dense": "out",
                "output.LayerNorm": "out_norm"}


def relative_buckets(n: int, device: torch.device) -> torch.Tensor:
    """[n, n] bucket of each (query, key) pair: MPNet's (T5's bidirectional) bucketing."""
    pos = torch.arange(n, dtype=torch.long, device=device)
    dist = pos[:, None] - pos[None, :]                 # query - key
    half = NUM_BUCKETS // 2
    exact = half // 2
    bucket = (dist < 0).to(torch.long) * half
    dist = dist.abs()
    far = exact + (torch.log(dist.float() / exact) / math.log(MAX_DISTANCE / exact)
                   * (half - exact)).to(torch.long)
    far = torch.clamp(far, max=half - 1)
    return bucket + torch.where(dist < exact, dist, far)


def biased_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     meta: AttentionMetadata, bias: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q/k/v: [T, H, D] (flat, no padding); bias: [H, L, L] (contiguous) for the longest
    request -> [T, H, D], each request attending over its own tokens with the bias added."""
    out = torch.empty_like(q)
    first = 0                                     # the group's first request
    for g in meta.prepared(WindowLayout(_NO_WINDOW)):
        b, n = g.rows.shape
        start = g.start
        if n >= ALONE_FROM:
            for length in meta.num_new[first:first + b]:
                out[start:start + length] = _alone(q, k, v, start, length, bias, scale)
                start += length
        else:
            per_chunk = max(1, MAX_MASK_BYTES // (bias.shape[0] * n * n * bias.element_size()))
            for c in range(0, b, per_chunk):
                rows = _padded(q, k, v, g, slice(c, c + per_chunk), bias, scale)
                out[start:start + rows.shape[0]] = rows
                start += rows.shape[0]
        first += b
    return out


def _alone(q, k, v, start: int, n: int, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """One request's [n, H, D] rows: SDPA on zero-copy slices, the bias's n x n corner as
    its mask (a view: nothing is copied)."""
    qh, kh, vh = (x[start:start + n].transpose(0, 1)[None] for x in (q, k, v))
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias[None, :, :n, :n],
                                       scale=scale)
    return o[0].transpose(0, 1)


def _padded(q, k, v, g: WindowGroup, part: slice, bias: torch.Tensor,
            scale: float) -> torch.Tensor:
    """One SDPA call on requests `part` of group `g`, padded to its longest (n): the float
    mask is the bias with the padding keys at -inf; padded query rows are dropped. Returns
    the requests' rows, flat, in order."""
    rows = g.rows[part]
    n = rows.shape[1]
    mask = bias[None, :, :n, :n].masked_fill(~g.mask[part], float("-inf"))
    qp, kp, vp = (x[rows].transpose(1, 2) for x in (q, k, v))        # [b, H, n, D]
    o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale)
    o = o.transpose(1, 2)
    return o[g.valid[part]] if g.valid is not None else o.reshape(-1, *o.shape[2:])


class MPNetEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.LayerNorm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + \
            self.position_embeddings(positions + PADDING_IDX + 1)
        return self.LayerNorm(x)


class MPNetLayer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = Linear(h, 3 * h)
        self.attn_out = Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.intermediate = Linear(h, i, activation=get_activation(config.hidden_act))
        self.out = Linear(i, h)
        self.out_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, bias: torch.Tensor,
                rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`rows`: keep only these rows after attention (the last layer under CLS/LAST)."""
        t = x.shape[0]
        q, k, v = (y.view(t, self.num_heads, self.head_dim)
                   for y in self.qkv(x).chunk(3, dim=-1))
        attn = biased_attention(q, k, v, meta, bias, self.scale).reshape(t, -1)
        if rows is not None:
            x, attn = x[rows], attn[rows]
        x = self.attn_out.forward_add_norm(attn, x, self.attn_norm)
        return mlp_add(self.intermediate, self.out, x, x, self.out_norm)


class MPNetModel(nn.Module):
    """forward(input_ids[T], positions[T], meta) -> hidden_states[T, H] (only the
    `meta.output_rows` rows when those are given)."""

    default_pooling_type = "CLS"
    is_causal = False
    weight_prefix = "mpnet."

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.embeddings = MPNetEmbeddings(config)
        self.layers = nn.ModuleList(MPNetLayer(config) for _ in range(config.num_hidden_layers))
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets,
                                                    config.num_attention_heads)

    def attention_layers(self) -> list:
        """None of its layers keeps a KV cache (see `ModelRunner`'s sizing)."""
        return []

    def lora_target(self, module: str) -> LoRATarget:
        """Where PEFT's `module` lands: q/k/v are thirds of our fused `qkv`."""
        pname, shard = _map_mpnet_name(module + ".weight")
        path = pname[: -len(".weight")]
        if shard is None:
            return whole(self, path)
        h = self.config.hidden_size
        return LoRATarget(path, linear_at(self, path), shard * h, h)

    def position_bias(self, meta: AttentionMetadata, device: torch.device) -> torch.Tensor:
        """[H, L, L] bias for the step's longest request (shorter ones take a corner)."""
        buckets = relative_buckets(max(meta.num_new), device)
        return self.relative_attention_bias(buckets).permute(2, 0, 1).contiguous()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`token_type_ids` is accepted and ignored: MPNet has no segment embeddings."""
        x = self.embeddings(input_ids, positions)
        bias = self.position_bias(meta, x.device).to(x.dtype)
        for layer in self.layers[:-1]:
            x = layer(x, meta, bias)
        return self.layers[-1](x, meta, bias, meta.output_rows)

    @staticmethod
    def skip_weight(name: str) -> bool:
        """Checkpoint tensors the backbone does not use (buffers, the unused pooler,
        a masked-LM head)."""
        return name.endswith("position_ids") or name.startswith(("pooler.", "lm_head."))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_mapped(self, weights, _map_mpnet_name)


def _map_mpnet_name(name: str) -> tuple[str, Optional[int]]:
    """A checkpoint / PEFT name (prefix stripped) -> (our parameter, q/k/v shard or None)."""
    if name.startswith("encoder.relative_attention_bias."):
        return name[len("encoder."):], None
    if not name.startswith("encoder.layer."):
        return name, None
    idx, sub = name[len("encoder.layer."):].split(".", 1)
    module, kind = sub.rsplit(".", 1)
    if module.startswith("attention.attn.") and module[-1] in _QKV and \
            module.count(".") == 2:
        return f"layers.{idx}.qkv.{kind}", _QKV[module[-1]]
    return f"layers.{idx}.{_LAYER_NAMES.get(module, module)}.{kind}", None


class MPNetForSequenceClassification(MPNetModel):
    """The MPNet backbone; its head (dense + tanh + out_proj on the first token, named
    `classifier.*` as RoBERTa's) is built by `build_classifier`."""

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        return RobertaClassifierHead(config, num_labels)
