"""ModelRunner: owns the model, the KV tensors and the step's pooling; runs one step.

It turns the scheduler's decisions into one flat, padding-free batch (token ids,
positions, slots) plus attention metadata, runs the forward pass and hands the hidden
states to `StepPooling` (worker/step_pooling.py), which pools the requests whose final
token was computed.
"""
from __future__ import annotations

from typing import Optional

import torch

from vllm.config import VllmConfig
from vllm.core.scheduler import SchedulerOutput
from vllm.attention.backends.registry import get_backend
from vllm.logger import init_logger
from vllm.attention.metadata import AttentionMetadata, sort_key, token_slots
from vllm.model_executor.layers.pooler import Pooler
from vllm.model_executor.layers.pool_state import BlockPayloadStore
from vllm.worker.model_loader import build_model
from vllm.platforms import platform_for
from vllm.worker.pool_steps import PoolTracker, hidden_size, tracked_kind
from vllm.worker.step_pooling import StepPooling

logger = init_logger(__name__)


class ModelRunner:
    def __init__(self, vllm_config: VllmConfig) -> None:
        self.config = vllm_config
        mc = vllm_config.model_config
        torch.manual_seed(mc.seed)
        self.platform = platform_for(mc.device)
        self.device = self.platform.device
        self.platform.prepare(mc.dtype)
        # Steps may hold requests reading cached keys (a platform may pick its backend by it).
        readers = vllm_config.uses_kv_cache and bool(
            vllm_config.cache_config.enable_prefix_caching or
            vllm_config.scheduler_config.enable_chunked_prefill)
        self.model = build_model(mc, self.platform, readers)
        reason = getattr(self.model.model, "whole_reason", None)
        if reason is not None and not mc.whole_sequences:  # found by the load-time probe
            vllm_config.run_whole_sequences(reason)
        self.attention_backend = self.model.attention_backend
        self.pooler = Pooler(mc.pooler_config.pooling_type, self.model, mc.score_activation
                             if mc.convert == "classify" else "identity")
        self.block_size = vllm_config.cache_config.block_size
        # sentence-transformers Pooling include_prompt false: pool without the prompt.
        self.pool_prompt = mc.st_config is None or mc.st_config.include_prompt
        self.uses_kv_cache = vllm_config.uses_kv_cache
        # CLS/MEAN/ALL/STEP with chunked prefill / prefix caching asked for (causal only).
        self.pool_kind = tracked_kind(vllm_config)
        self.num_blocks = self._size_kv_cache()
        vllm_config.cache_config.num_blocks = self.num_blocks
        self.kv_caches: list[torch.Tensor] = []
        if self.uses_kv_cache:
            self._allocate_kv_cache()
        self.tracker = self._pool_tracker()
        self.pooling = StepPooling(self.pooler, self.tracker, self.pool_prompt, self.device)
        self.tasks = self._task_adapters()  # first: it refuses enable_lora by name
        self.lora = self._lora_manager()
        if self.lora is not None and self.lora.heads is not None:
            self.pooling.use_heads(self.lora.heads)

    # ----- KV cache -------------------------------------------------------------------
    def _blocks_per_prompt(self) -> int:
        return -(-self.config.model_config.max_model_len // self.block_size)

    def _size_kv_cache(self) -> int:
        cc, sc = self.config.cache_config, self.config.scheduler_config
        useful = sc.max_num_seqs * self._blocks_per_prompt()
        if cc.num_gpu_blocks_override is not None:
            num = cc.num_gpu_blocks_override
        elif not self.uses_kv_cache:
            return useful  # bookkeeping only: bidirectional models keep no K/V
        else:
            num = min(useful, self._memory_for_cache() // self._bytes_per_block())
        if num < self._blocks_per_prompt():
            raise ValueError(
                f"The KV cache holds {num} blocks of {self.block_size} tokens, fewer than one "
                f"max_model_len prompt needs ({self._blocks_per_prompt()}). Raise "
                "VLLM_CPU_KVCACHE_SPACE (CPU) / gpu_memory_utilization (CUDA) / "
                "num_gpu_blocks_override or lower max_model_len.")
        return num

    def _bytes_per_block(self) -> int:
        layers = self.model.model.attention_layers()
        a = layers[0]
        itemsize = torch.tensor([], dtype=self.config.model_config.dtype).element_size()
        return len(layers) * 2 * self.block_size * a.num_kv_heads * a.head_dim * itemsize \
            + self._payload_bytes_per_block()

    def _payload_bytes_per_block(self) -> int:
        """A block's pooling payload, when prefix caching keeps one (see pool_state.py)."""
        if self.pool_kind is None or not self.config.cache_config.enable_prefix_caching:
            return 0
        mc = self.config.model_config
        return BlockPayloadStore.bytes_per_block(self.pool_kind, self.block_size,
                                                 hidden_size(mc.hf_config), mc.dtype)

    def _pool_tracker(self):
        """The tracker for CLS/MEAN/ALL/STEP chunks and cached blocks, or None."""
        if self.pool_kind is None:
            return None
        store = None
        if self.config.cache_config.enable_prefix_caching:
            mc = self.config.model_config
            store = BlockPayloadStore(self.pool_kind, self.num_blocks, self.block_size,
                                      hidden_size(mc.hf_config), mc.dtype, self.device)
            logger.info("Pooling payload: %.1f MiB beside the KV cache, counted in its "
                        "block budget (%d bytes a block)", self.num_blocks *
                        self._payload_bytes_per_block() / 2**20,
                        self._payload_bytes_per_block())
        return PoolTracker(self.pool_kind, self.pooler, self.pool_prompt, store)

    def _memory_for_cache(self) -> int:
        return self.platform.kv_cache_bytes(self.config.cache_config, self._profile)

    @torch.inference_mode()
    def _profile(self) -> None:
        """The largest step the scheduler can make, run once without a cache (the platform
        measures its peak memory): max_num_batched_tokens tokens in max_model_len prompts."""
        sc, max_len = self.config.scheduler_config, self.config.model_config.max_model_len
        budget = sc.max_num_batched_tokens
        lengths = [min(max_len, budget - i) for i in range(0, budget, max_len)]
        lengths = lengths[: sc.max_num_seqs]
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        meta = AttentionMetadata(starts, [0] * len(lengths), lengths, None,
                                 [[] for _ in lengths], self.block_size,
                                 causal=self.config.model_config.is_causal, device=self.device)
        ids = torch.zeros(starts[-1], dtype=torch.long, device=self.device)
        positions = torch.cat([torch.arange(n) for n in lengths]).to(self.device)
        self.model(ids, positions, meta, None)

    def _allocate_kv_cache(self) -> None:
        dtype = self.config.model_config.dtype
        slots = self.num_blocks * self.block_size
        for attn in self.model.model.attention_layers():
            # Zeroed, i.e. touched, now: blocks are handed out in LRU order, so otherwise
            # every step writes into pages never touched before and page-faults them in
            # (~15% of a prefix-cached step here) until the whole pool has been used once.
            cache = torch.zeros(2, slots, attn.num_kv_heads, attn.head_dim, dtype=dtype,
                                device=self.device)
            attn.kv_cache = cache
            self.kv_caches.append(cache)
        logger.info("KV cache: %d blocks x %d tokens (%.1f MiB)", self.num_blocks,
                    self.block_size, self.num_blocks * self._bytes_per_block() / 2**20)

    def pool_key(self, prompt) -> Optional[str]:
        """What `prompt`'s cached blocks' pooling payload depends on besides its tokens
        (hashed with them; see pool_state.pool_key), or None."""
        if self.tracker is None or self.tracker.store is None:
            return None
        return self.tracker.key(len(prompt.prompt_token_ids), prompt.prompt_len)

    def _lora_manager(self):
        """The LoRA adapters (enable_lora), else None."""
        if self.config.lora_config is None:
            return None
        from vllm.lora.manager import LoRAManager
        return LoRAManager.for_runner(self.config, self.model, self.device)

    def _task_adapters(self):
        """The checkpoint's own per-task LoRAs (jina-embeddings-v3), else None."""
        if not self.config.model_config.task_adapters:
            return None
        from vllm.lora.task_adapters import TaskAdapters
        return TaskAdapters.for_runner(self.config, self.model.model, self.device)

    def _begin_lora(self, out: SchedulerOutput, meta: AttentionMetadata) -> None:
        """This step's rows per adapter (or task), for every LoRA projection and head."""
        for adapters in (self.lora, self.tasks):
            if adapters is not None:
                adapters.begin_step(out.scheduled, meta)

    # ----- one step -------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[str, torch.Tensor]:
        """Run the scheduled tokens; return pooled outputs of requests that finished."""
        if not out.scheduled:
            return {}
        adapters = self.lora or self.tasks  # never both (TaskAdapters refuses enable_lora)
        if adapters is None:
            return self._execute(out)
        try:
            return self._execute(out)
        finally:
            adapters.end_step()

    def _execute(self, out: SchedulerOutput) -> dict[str, torch.Tensor]:
        self._copy_blocks(out)
        # Lay requests out by shape so attention buckets are contiguous slices.
        out.scheduled.sort(key=lambda s: sort_key(s.num_computed, s.num_new))
        input_ids, positions, token_types, meta = self._prepare(out)
        plan = self.pooling.plan(out, meta)
        meta.output_rows = plan.rows
        self._begin_lora(out, meta)
        hidden = self.model(input_ids, positions, meta, token_types, **_images(out))
        return self.pooling.pool(plan, hidden, out, meta)

    def _copy_blocks(self, out: SchedulerOutput) -> None:
        """Copy cached partial blocks' slots into their readers' own blocks (every layer,
        K and V). Runs before the forward pass, so it reads each source before this step
        writes any slot (a source freed and handed out again in this step included), and
        gathers every source before writing any destination."""
        copies = [s.copy for s in out.scheduled if s.copy is not None]
        if not copies or not self.kv_caches:
            return
        bs = self.block_size
        src = torch.cat([torch.arange(c.num_slots) + c.src * bs for c in copies])
        dst = torch.cat([torch.arange(c.num_slots) + c.dst * bs for c in copies])
        src, dst = src.to(self.device), dst.to(self.device)
        for cache in self.kv_caches:
            cache.index_copy_(1, dst, cache.index_select(1, src))

    def _prepare(self, out: SchedulerOutput):
        ids: list[int] = []
        pos: list[int] = []
        types: list[int] = []
        starts = [0]
        any_types = any(s.request.token_type_ids is not None for s in out.scheduled)
        for s in out.scheduled:
            k, n, req = s.num_computed, s.num_new, s.request
            ids.extend(req.prompt_token_ids[k: k + n])
            pos.extend(range(k, k + n))
            if any_types:
                types.extend(req.token_type_ids[k: k + n] if req.token_type_ids else [0] * n)
            starts.append(starts[-1] + n)
        dev = self.device
        positions = torch.tensor(pos, dtype=torch.long)
        meta = AttentionMetadata(
            query_start_loc=starts, num_computed=[s.num_computed for s in out.scheduled],
            num_new=[s.num_new for s in out.scheduled],
            slot_mapping=self._slot_mapping(out) if self.uses_kv_cache else None,
            block_tables=[s.block_ids for s in out.scheduled], block_size=self.block_size,
            causal=self.config.model_config.is_causal, device=dev)
        meta.prepared(get_backend(self.attention_backend))  # once, before the first layer
        token_types = torch.tensor(types, dtype=torch.long, device=dev) if any_types else None
        return (torch.tensor(ids, dtype=torch.long, device=dev), positions.to(dev),
                token_types, meta)

    def _slot_mapping(self, out: SchedulerOutput) -> torch.Tensor:
        """[T] cache slot of every new token, in flat order."""
        return torch.cat([token_slots(s.block_ids, s.num_computed, s.num_computed + s.num_new,
                                      self.block_size) for s in out.scheduled]).to(self.device)


def _images(out: SchedulerOutput) -> dict:
    """The step's image pixels for a multimodal model's forward (`images`: one entry per
    scheduled request, None for text), or no argument at all when the step has none."""
    images = [s.request.images for s in out.scheduled]
    return {"images": images} if any(i is not None for i in images) else {}
