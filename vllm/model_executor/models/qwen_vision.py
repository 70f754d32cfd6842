"""The Qwen vision-language models' vision towers: Qwen2-VL's (`VisionTower`) and
Qwen3-VL's (`Qwen3VisionTower`), and the pieces they share: pre-norm blocks whose attention
rotates queries and keys by each patch's (height, width) on the image's patch grid, patches
in merge-block order (the image processor's: each m x m block of patches adjacent, so a
merger reads a block as one row)."""
from __future__ import annotations

import torch
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import Linear
from vllm.model_executor.models.clip import segments_meta


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class VisionAttentionBlock(nn.Module):
    """A vision block's pre-norm attention with 2-D rotary (`norm1`, `qkv`, `proj`), then
    the subclass's MLP (`mlp_add`) after `norm2`: Qwen2-VL's and Qwen3-VL's blocks."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = Linear(dim, 3 * dim)
        self.proj = Linear(dim, dim)
        self.attn = Attention(heads, dim // heads, heads)

    def mlp_add(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + the block's MLP of y."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.heads, self.head_dim).unbind(1)
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(x.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(x.dtype)
        x = self.proj.forward_add(self.attn(q.reshape(n, -1), k.reshape(n, -1),
                                            v.reshape(n, -1), meta), x)
        return self.mlp_add(self.norm2(x), x)


class VisionBlock(VisionAttentionBlock):
    """Qwen2-VL's block: MLP fc1 -> quick_gelu -> fc2."""

    def __init__(self, config) -> None:
        super().__init__(config.embed_dim, config.num_heads)
        hidden = int(config.embed_dim * config.mlp_ratio)
        self.fc1 = Linear(config.embed_dim, hidden)
        self.fc2 = Linear(hidden, config.embed_dim)
        if config.hidden_act != "quick_gelu":
            raise ValueError(f"Qwen2-VL vision hidden_act {config.hidden_act!r} is not "
                             "supported (quick_gelu is).")

    def mlp_add(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        y = self.fc1(y)
        return self.fc2.forward_add(y * torch.sigmoid(1.702 * y), residual)


def vision_inv_freq(config, head_dim: int) -> torch.Tensor:
    """The vision rotary's inverse frequencies: head_dim / 4 of them, shared by the height
    and the width axis."""
    theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 1e4))
    return 1.0 / (theta ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float)
                            / (head_dim // 2)))


def vision_rotary(grid: tuple[int, int, int], merge: int,
                  inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, 1, head_dim] of an image's patches (in merge-block order, frames
    repeated): height angles then width angles, the pair repeated (rotate-half layout)."""
    t, h, w = grid
    hpos, wpos = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    hpos = hpos.reshape(shape).transpose(1, 2).flatten().repeat(t)
    wpos = wpos.reshape(shape).transpose(1, 2).flatten().repeat(t)
    angles = torch.cat([hpos[:, None] * inv_freq, wpos[:, None] * inv_freq], -1)
    angles = torch.cat([angles, angles], dim=-1)[:, None, :]
    return angles.cos(), angles.sin()


class PatchTower(nn.Module):
    """The frame both towers share: a Conv3d patch embedding (`patch_embed.proj`), then the
    blocks (`blocks`) with 2-D rotary, all of one image's patches attending to each other."""

    def __init__(self, config, width: int, block: type[nn.Module], bias: bool) -> None:
        super().__init__()
        self.config, self.width = config, width
        p, tp = config.patch_size, config.temporal_patch_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv3d(config.in_channels, width, (tp, p, p), (tp, p, p),
                                          bias=bias)
        self.blocks = nn.ModuleList(block(config) for _ in range(config.depth))
        self.inv_freq = vision_inv_freq(config, width // config.num_heads)

    def embed_patches(self, pixels: torch.Tensor) -> torch.Tensor:
        """An image's patches [N, C*T*P*P] -> [N, width]."""
        c, proj = self.config, self.patch_embed.proj
        x = proj(pixels.to(proj.weight.dtype).view(-1, c.in_channels, c.temporal_patch_size,
                                                   c.patch_size, c.patch_size))
        return x.view(-1, self.width)

    def run_blocks(self, x: torch.Tensor, grid: tuple[int, int, int], like: AttentionMetadata,
                   taps: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x through every block, and x as it leaves each block in `taps` (block order)."""
        cos, sin = (a.to(x.device) for a in vision_rotary(
            grid, self.config.spatial_merge_size, self.inv_freq))
        meta = segments_meta([x.shape[0]], False, like)
        tapped = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, meta)
            if i in taps:
                tapped.append(x)
        return x, tapped


class VisionTower(PatchTower):
    """HF Qwen2-VL `visual`: Conv3d patches, blocks with 2-D rotary, merger of m x m
    patches."""

    def __init__(self, config) -> None:
        super().__init__(config, config.embed_dim, VisionBlock, bias=False)
        merged = config.embed_dim * config.spatial_merge_size ** 2
        self.merger = nn.Module()
        self.merger.ln_q = nn.LayerNorm(config.embed_dim, eps=1e-6)
        self.merger.mlp = nn.Sequential(nn.Linear(merged, merged), nn.GELU(),
                                        nn.Linear(merged, config.hidden_size))

    def forward(self, pixels: torch.Tensor, grid: tuple[int, int, int],
                like: AttentionMetadata) -> torch.Tensor:
        """One image's patches [N, C*T*P*P] -> its merged-patch embeddings [N / m^2, H]."""
        x, _ = self.run_blocks(self.embed_patches(pixels), grid, like)
        return self.merger.mlp(self.merger.ln_q(x).view(-1, self.width *
                                                        self.config.spatial_merge_size ** 2))


class Qwen3VisionBlock(VisionAttentionBlock):
    """Qwen3-VL's block: MLP linear_fc1 -> gelu (tanh) -> linear_fc2."""

    def __init__(self, config) -> None:
        super().__init__(config.hidden_size, config.num_heads)
        if config.hidden_act != "gelu_pytorch_tanh":
            raise ValueError(f"Qwen3-VL vision hidden_act {config.hidden_act!r} is not "
                             "supported (gelu_pytorch_tanh is).")
        self.mlp = nn.Module()
        self.mlp.linear_fc1 = Linear(config.hidden_size, config.intermediate_size,
                                     activation="gelu_tanh")
        self.mlp.linear_fc2 = Linear(config.intermediate_size, config.hidden_size)

    def mlp_add(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.mlp.linear_fc2.forward_add(self.mlp.linear_fc1(y), residual)


class PatchMerger(nn.Module):
    """m x m patches -> one decoder-width row: LayerNorm (per patch, or over the merged
    row: `postshuffle`, the deepstack mergers'), Linear, GELU, Linear."""

    def __init__(self, config, postshuffle: bool) -> None:
        super().__init__()
        self.width = config.hidden_size * config.spatial_merge_size ** 2
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.width if postshuffle else config.hidden_size, eps=1e-6)
        self.linear_fc1 = Linear(self.width, self.width, activation="gelu")
        self.linear_fc2 = Linear(self.width, config.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.width)) if self.postshuffle else \
            self.norm(x).view(-1, self.width)
        return self.linear_fc2(self.linear_fc1(x))


class Qwen3VisionTower(PatchTower):
    """HF Qwen3-VL `visual`: Conv3d patches (with bias) plus learned positions resampled
    to the image's grid, blocks with 2-D rotary, the merger, and one deepstack merger per
    `deepstack_visual_indexes` block whose output the decoder adds after its early layers.

    forward returns [N / m^2, out * (1 + deepstack)]: the merged embeddings, then each
    deepstack feature, side by side (one tensor: one encoder-cache entry per image)."""

    def __init__(self, config) -> None:
        super().__init__(config, config.hidden_size, Qwen3VisionBlock, bias=True)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.side = int(config.num_position_embeddings ** 0.5)
        self.merger = PatchMerger(config, postshuffle=False)
        self.deepstack_visual_indexes = list(config.deepstack_visual_indexes)
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(config, postshuffle=True) for _ in self.deepstack_visual_indexes)

    def positions(self, grid: tuple[int, int, int]) -> torch.Tensor:
        """[N, d] learned positions of an image's patches: the square table resampled to
        the (h, w) grid (bilinear, corners aligned), in merge-block order, per frame."""
        t, h, w = grid
        m, d = self.config.spatial_merge_size, self.width
        table = self.pos_embed.weight.view(self.side, self.side, d).permute(2, 0, 1)
        grid_pos = torch.nn.functional.interpolate(table[None].float(), size=(h, w),
                                                   mode="bilinear", align_corners=True)[0]
        blocks = grid_pos.permute(1, 2, 0).reshape(h // m, m, w // m, m, d).transpose(1, 2)
        return blocks.reshape(h * w, d).repeat(t, 1)

    def forward(self, pixels: torch.Tensor, grid: tuple[int, int, int],
                like: AttentionMetadata) -> torch.Tensor:
        """One image's patches [N, C*T*P*P] -> [N / m^2, out * (1 + deepstack)]."""
        x = self.embed_patches(pixels)
        x = x + self.positions(grid).to(x.dtype)
        taps = sorted(set(self.deepstack_visual_indexes))
        x, tapped = self.run_blocks(x, grid, like, tuple(taps))
        # feature j: the j-th tapped block (block order), through that block's merger
        mergers = [self.deepstack_merger_list[self.deepstack_visual_indexes.index(b)]
                   for b in taps]
        return torch.cat([self.merger(x), *(m(y) for m, y in zip(mergers, tapped))], dim=-1)
