"""What each model of a multi-model server will take, checked before any is loaded.

Per model: its weights (the checkpoint's parameter count, from the safetensors headers,
times the served dtype's size) and its KV cache (the pool the engine will allocate: at most
the KV space, and no more blocks than `max_num_seqs x max_model_len` needs; none for a
bidirectional model, which keeps no K/V). The start-up log gets one line per model, and a
set whose sum exceeds the machine's available memory is refused before anything loads.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from vllm import envs
from vllm.logger import init_logger
from vllm.model_executor.weight_utils import checkpoint_files

logger = init_logger(__name__)
MiB = 2 ** 20


@dataclass(frozen=True)
class ModelMemory:
    name: str
    weights: int   # bytes
    kv_cache: int  # bytes

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    def describe(self) -> str:
        return (f"{self.name}: weights {self.weights / MiB:.0f} MiB + KV cache "
                f"{self.kv_cache / MiB:.0f} MiB = {self.total / MiB:.0f} MiB")


def estimate(name: str, config) -> ModelMemory:
    """`config`: the model's VllmConfig (resolved, nothing loaded)."""
    mc = config.model_config
    itemsize = torch.empty(0, dtype=mc.dtype).element_size()
    return ModelMemory(name, _num_params(Path(mc.path)) * itemsize,
                       _kv_bytes(config, itemsize))


def check_fits(models: list[ModelMemory], available: Optional[int] = None) -> None:
    """Log each model's share; SystemExit when together they exceed available memory."""
    for m in models:
        logger.info("Model %s", m.describe())
    available = _available_bytes() if available is None else available
    need = sum(m.total for m in models)
    if available is not None and need > available:
        raise SystemExit(
            f"These models need about {need / MiB:.0f} MiB together but only "
            f"{available / MiB:.0f} MiB of memory is available: "
            + "; ".join(m.describe() for m in models)
            + ". Serve fewer models, lower VLLM_CPU_KVCACHE_SPACE / max_num_seqs, or use a "
            "smaller dtype.")
    logger.info("Models: %.0f MiB in all, of %s available.", need / MiB,
                f"{available / MiB:.0f} MiB" if available is not None else "unknown memory")


def _num_params(path: Path) -> int:
    total = 0
    for file in checkpoint_files(path):
        if file.suffix != ".safetensors":  # a .bin checkpoint: its size is close enough
            total += file.stat().st_size // 4
            continue
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for key, entry in header.items():
            if key != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total


def _kv_bytes(config, itemsize: int) -> int:
    mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
    if not mc.is_causal:
        return 0
    hf = mc.hf_config
    heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    kv_heads = getattr(hf, "num_key_value_heads", None) or heads
    per_block = hf.num_hidden_layers * 2 * cc.block_size * kv_heads * head_dim * itemsize
    if cc.num_gpu_blocks_override is not None:
        return cc.num_gpu_blocks_override * per_block
    useful = sc.max_num_seqs * -(-mc.max_model_len // cc.block_size) * per_block
    space = cc.cpu_kvcache_space_bytes
    space = int(envs.VLLM_CPU_KVCACHE_SPACE * 2 ** 30) if space is None else space
    return min(useful, space)


def _available_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
