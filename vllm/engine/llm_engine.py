"""LLMEngine: requests in, pooled outputs out, one scheduler step at a time."""
from __future__ import annotations

import dataclasses
from typing import Optional

from vllm.config import VllmConfig
from vllm.core.kv_cache_manager import KVCacheManager
from vllm.core.request import Request
from vllm.core.scheduler import Scheduler
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.chunking import ChunkedInputs, parent_of
from vllm.engine.dedup import Deduplicator, request_key
from vllm.engine.processor import InputProcessor, load_tokenizer
from vllm.engine.prompt_types import TokenizedPrompt
from vllm.engine.stats import EngineStats
from vllm.logger import init_logger
from vllm.lora.request import LoRARequest
from vllm.outputs import PoolingOutput, PoolingRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask
from vllm.worker.model_runner import ModelRunner

logger = init_logger(__name__)


class LLMEngine:
    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.tokenizer = load_tokenizer(self.model_config)
        self.processor = InputProcessor(self.model_config, self.tokenizer)
        self.runner = ModelRunner(vllm_config)
        cc = vllm_config.cache_config
        self.kv = KVCacheManager(self.runner.num_blocks, cc.block_size,
                                 bool(cc.enable_prefix_caching),
                                 cache_partials=self.runner.tracker is None)
        lc = vllm_config.lora_config
        self.scheduler = Scheduler(vllm_config.scheduler_config, self.kv,
                                   lc.max_loras if lc is not None else None)
        self._stats = EngineStats()
        self._dedup = Deduplicator()
        self._chunks = ChunkedInputs(self.model_config.max_model_len, self.runner.pool_prompt)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        return cls(engine_args.create_engine_config())

    def add_request(self, request_id: str, prompt: TokenizedPrompt,
                    params: PoolingParams, lora_request: Optional[LoRARequest] = None) -> None:
        """Queue a tokenized prompt, under `lora_request`'s adapter when given (loaded
        now if it is not). Raises ValueError for a task the model cannot do, parameters
        that do not belong to the task, or an adapter the engine refuses."""
        task = params.task or PoolingTask.ENCODE
        self.verify_task(task)
        params.verify(task, self.model_config)
        chunked = task == PoolingTask.EMBED and bool(self.model_config.pooler_config
                                           .enable_chunked_processing)
        self.processor.check(prompt, chunked)
        lora_key = self._lora_key(lora_request) if lora_request is not None else \
            self._task_key(prompt)
        if self._dedup.leader_for(request_id,
                                  request_key(prompt, params, lora_key)) is not None:
            self._stats.num_deduplicated += 1
            return
        parts = [(request_id, prompt)]
        if chunked and len(prompt.prompt_token_ids) > self.model_config.max_model_len:
            parts = self._chunks.split(request_id, prompt, bool(params.normalize))
        for rid, part in parts:
            self.scheduler.add_request(Request(rid, part.prompt_token_ids, params,
                                               part.token_type_ids, part.cache_salt,
                                               prompt_len=part.prompt_len, lora_key=lora_key,
                                               pool_key=self.runner.pool_key(part),
                                               images=part.images))

    # ----- LoRA adapters (upstream's LLMEngine names) ----------------------------------
    def _lora_key(self, lora_request: Optional[LoRARequest]) -> Optional[str]:
        if lora_request is None:
            return None
        if self.runner.lora is None:
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r} requested, but LoRA "
                             "is not enabled; start the engine with enable_lora=True "
                             "(--enable-lora).")
        return self.runner.lora.add(lora_request)

    def _task_key(self, prompt: TokenizedPrompt) -> Optional[str]:
        """On a model with task adapters, the key of the task the prompt's name chose (the
        default task when none): it keys dedup and block hashes as an adapter does."""
        tasks = self.runner.tasks
        return None if tasks is None else tasks.key(prompt.task_adapter)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter now (ValueError if refused); True once loaded."""
        self._lora_key(lora_request)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        """Unload an adapter; False if it was not loaded."""
        return self.runner.lora is not None and self.runner.lora.remove(lora_id)

    def list_loras(self) -> set[int]:
        """The ids of the loaded adapters."""
        return set() if self.runner.lora is None else self.runner.lora.loaded_ids()

    def verify_task(self, task: str) -> None:
        """Raise ValueError unless this engine runs `task`: one the model supports but the
        engine was not started for names `PoolerConfig(task=...)`, as upstream."""
        mc = self.model_config
        tasks = mc.supported_tasks
        if task in tasks:
            return
        if task in mc.pooling_tasks:
            raise ValueError(f"Try switching the model's pooling_task via "
                             f'`PoolerConfig(task="{task}")`: this engine runs '
                             f"{mc.pooling_task!r}.")
        hint = {"embed": "convert='embed'", "classify": "convert='classify'",
                "reward": "convert='reward'", "score": "a cross-encoder with one label "
                "(convert='classify', num_labels=1) or an embedding model",
                "token_embed": "an embedding model (convert='embed')",
                "token_classify": "a classifier (convert='classify')"}.get(task, "")
        raise ValueError(f"The model {mc.architecture} does not support the "
                         f"{task!r} task; it supports {list(tasks)}. To {task} with it, load it "
                         f"with {hint}.")

    def abort_request(self, request_ids: list[str]) -> None:
        real = self._dedup.abort(set(request_ids))
        self.scheduler.abort(real | self._chunks.chunk_ids(real))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_waiting(self) -> int:
        """Requests added and not yet scheduled."""
        return len(self.scheduler.waiting)

    def step(self) -> list[PoolingRequestOutput]:
        """Schedule, run the model once, and return the requests that finished."""
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        try:
            pooled = self.runner.execute(out)
        except Exception:
            # Drop this step's requests (their blocks were promised but maybe not
            # written) so the engine keeps serving others; the caller sees the exception.
            failed = {s.request.request_id for s in out.scheduled}
            self.scheduler.abort(failed | self._chunks.drop_chunks(failed))
            self._dedup.drop(failed | {parent_of(f) or f for f in failed})
            self.kv.reset_prefix_cache()
            raise
        finished = self.scheduler.update(out)
        self._stats.num_steps += 1
        self._stats.computed_tokens += out.num_tokens
        outputs = []
        for req in finished:
            self._stats.num_split_requests += int(req.num_steps > 1)
            done = self._chunks.finish(req.request_id, pooled[req.request_id],
                                       req.num_tokens, req.num_cached_tokens)
            if done is None:  # a chunk of a long input whose other chunks still run
                continue
            ids = done.prompt_token_ids or req.prompt_token_ids
            emit, followers = self._dedup.finish(done.request_id)
            for rid in ([done.request_id] if emit else []) + followers:
                self._stats.num_requests_finished += 1
                self._stats.prompt_tokens += len(ids)
                outputs.append(PoolingRequestOutput(
                    rid, PoolingOutput(done.data if rid == done.request_id
                                       else done.data.clone()),
                    list(ids), True, done.num_cached_tokens))
        return outputs

    @property
    def stats(self) -> EngineStats:
        """A snapshot of the counters (a new object on every read)."""
        return dataclasses.replace(
            self._stats, prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            num_evictions=self.kv.pool.num_evictions,
            num_preemptions=self.scheduler.num_preemptions,
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting))

    def reset_stats(self) -> None:
        """Start every counter again from zero (after the server's warm-up, so /metrics
        counts users' work only). Call it while no request is in flight."""
        self._stats = EngineStats()
        self.kv.prefix_cache_queries = self.kv.prefix_cache_hits = 0
        self.kv.pool.num_evictions = 0
        self.scheduler.num_preemptions = 0

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix block hash (later requests recompute from scratch)."""
        self.kv.reset_prefix_cache()

    def get_tokenizer(self):
        return self.tokenizer
