"""CLIP (`CLIPModel`) as a dual-encoder embedding model: text prompts go through the text
tower, image prompts through the vision tower, each into the shared projection space.

Shared with SigLIP (siglip.py): the pre-norm encoder layer, the per-tower flat batches
(`Towers`) and the weight-name mapping. A step may mix text and image requests; the model
returns, at each request's last row, its projected embedding (the LAST pooler reads it).
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import Linear
from vllm.model_executor.models.bert import get_activation
from vllm.model_executor.weight_utils import load_mapped

_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}


class EncoderLayer(nn.Module):
    """A pre-norm transformer layer (CLIP/SigLIP towers), attention as `meta` says."""

    def __init__(self, config) -> None:
        super().__init__()
        h = config.hidden_size
        heads = config.num_attention_heads
        self.hidden = h
        self.layer_norm1 = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.qkv = Linear(h, 3 * h)
        self.attn = Attention(heads, h // heads, heads)
        self.out_proj = Linear(h, h)
        self.layer_norm2 = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.quick_gelu = config.hidden_act == "quick_gelu"
        act = None if self.quick_gelu else get_activation(config.hidden_act)
        self.fc1 = Linear(h, config.intermediate_size, activation=act)
        self.fc2 = Linear(config.intermediate_size, h)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv(self.layer_norm1(x)).split(self.hidden, dim=-1)
        x = self.out_proj.forward_add(self.attn(q, k, v, meta), x)
        y = self.fc1(self.layer_norm2(x))
        if self.quick_gelu:
            y = y * torch.sigmoid(1.702 * y)
        return self.fc2.forward_add(y, x)


class Encoder(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config)
                                    for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, meta)
        return x


def segments_meta(lengths: list[int], causal: bool, like: AttentionMetadata) -> AttentionMetadata:
    """Metadata for sequences of `lengths` laid out back to back, attended without a cache."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return AttentionMetadata(starts, [0] * len(lengths), list(lengths), None,
                             [[] for _ in lengths], like.block_size, causal=causal,
                             device=like.device)


class DualEncoder(nn.Module):
    """The shared frame: split the step into text and image requests, run each tower once
    on its requests, and place every request's embedding at its last row."""

    default_pooling_type = "LAST"
    is_causal = False
    weight_prefix = ""
    text_causal = True  # CLIP's text tower is causal; SigLIP's is not

    def embed_text(self, ids: torch.Tensor, positions: torch.Tensor,
                   meta: AttentionMetadata, lengths: list[int]) -> torch.Tensor:
        raise NotImplementedError

    def embed_images(self, images: list, like: AttentionMetadata) -> torch.Tensor:
        """One embedding per image of `images` (each request's ImageInputs, in order)."""
        raise NotImplementedError

    def attention_layers(self) -> list[Attention]:
        return [m for m in self.modules() if isinstance(m, Attention)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, token_type_ids: Optional[torch.Tensor] = None,
                images: Optional[list] = None) -> torch.Tensor:
        """[T] ids of text and image requests -> [T, D] holding each request's embedding
        at its last row (only `meta.output_rows` when given)."""
        images = images if images is not None else [None] * meta.num_reqs
        starts, lengths = meta.query_start_loc, meta.num_new
        text = [i for i, img in enumerate(images) if img is None]
        pics = [i for i, img in enumerate(images) if img is not None]
        out = None
        if text:
            rows = torch.cat([torch.arange(starts[i], starts[i] + lengths[i]) for i in text])
            rows = rows.to(input_ids.device)
            sub = segments_meta([lengths[i] for i in text], self.text_causal, meta)
            out = self._place(out, input_ids.shape[0], text, starts, lengths, self.embed_text(
                input_ids[rows], positions[rows], sub, [lengths[i] for i in text]))
        if pics:
            out = self._place(out, input_ids.shape[0], pics, starts, lengths,
                              self.embed_images([images[i] for i in pics], meta))
        return out if meta.output_rows is None else out[meta.output_rows]

    @staticmethod
    def _place(out: Optional[torch.Tensor], total: int, which: list[int], starts: list[int],
               lengths: list[int], emb: torch.Tensor) -> torch.Tensor:
        if out is None:
            out = emb.new_zeros(total, emb.shape[-1])
        last = torch.tensor([starts[i] + lengths[i] - 1 for i in which], device=emb.device)
        out[last] = emb
        return out

    @staticmethod
    def skip_weight(name: str) -> bool:
        """Checkpoint tensors no embedding uses (the contrastive logit scale / bias)."""
        return name.endswith("position_ids") or name in ("logit_scale", "logit_bias")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """HF names, with each encoder layer's q/k/v fused into `qkv`."""
        return load_mapped(self, weights, _map_name)


def _map_name(name: str) -> tuple[str, Optional[int]]:
    """HF encoder-layer names -> ours (q/k/v -> fused qkv shard; self_attn/mlp flattened)."""
    if ".encoder.layers." not in name:
        return name, None
    head, rest = name.split(".encoder.layers.", 1)
    idx, sub = rest.split(".", 1)
    module, kind = sub.rsplit(".", 1)
    prefix = f"{head}.encoder.layers.{idx}"
    if module.startswith("self_attn."):
        proj = module[len("self_attn."):]
        if proj in _QKV:
            return f"{prefix}.qkv.{kind}", _QKV[proj]
        return f"{prefix}.{proj}.{kind}", None
    return f"{prefix}.{module.replace('mlp.', '')}.{kind}", None


class TextEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embedding = nn.Embedding(config.max_position_embeddings,
                                               config.hidden_size)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.token_embedding(ids) + self.position_embedding(positions)


class TextTower(nn.Module):
    """Embeddings, encoder, final norm (HF `text_model`)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.embeddings = TextEmbeddings(config)
        self.encoder = Encoder(config)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        return self.final_layer_norm(self.encoder(self.embeddings(ids, positions), meta))


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h = config.hidden_size
        self.class_embedding = nn.Parameter(torch.empty(h))
        self.patch_embedding = nn.Conv2d(config.num_channels, h, config.patch_size,
                                         stride=config.patch_size, bias=False)
        positions = (config.image_size // config.patch_size) ** 2 + 1
        self.position_embedding = nn.Embedding(positions, h)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.class_embedding.dtype))
        patches = patches.flatten(2).transpose(1, 2)           # [B, P, H]
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class CLIPVisionTower(nn.Module):
    """HF `vision_model`: patches + class token, pre-norm, encoder, post-norm of the class
    token."""

    def __init__(self, config) -> None:
        super().__init__()
        h = config.hidden_size
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.encoder = Encoder(config)
        self.post_layernorm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def forward(self, pixels: torch.Tensor, like: AttentionMetadata) -> torch.Tensor:
        x = self.pre_layrnorm(self.embeddings(pixels))
        b, n, h = x.shape
        x = self.encoder(x.reshape(b * n, h), segments_meta([n] * b, False, like))
        return self.post_layernorm(x.view(b, n, h)[:, 0])


class CLIPEmbeddingModel(DualEncoder):
    """CLIPModel: text -> text_projection of the EOS state; image -> visual_projection of
    the class token's state."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        text, vision = config.text_config, config.vision_config
        self.text_model = TextTower(text)
        self.vision_model = CLIPVisionTower(vision)
        self.text_projection = Linear(text.hidden_size, config.projection_dim, bias=False)
        self.visual_projection = Linear(vision.hidden_size, config.projection_dim, bias=False)
        self.eos_token_id = text.eos_token_id

    def embed_text(self, ids, positions, meta, lengths):
        hidden = self.text_model(ids, positions, meta)
        rows, start = [], 0
        for n in lengths:  # the EOS row, as Transformers picks it
            seq = ids[start:start + n]
            pick = seq.argmax() if self.eos_token_id == 2 else \
                (seq == self.eos_token_id).int().argmax()
            rows.append(start + int(pick))
            start += n
        return self.text_projection(hidden[rows])

    def embed_images(self, images, like):
        pixels = torch.cat([i.pixel_values for i in images]).to(like.device)
        return self.visual_projection(self.vision_model(pixels, like))
