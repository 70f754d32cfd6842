"""LLM: the offline API (`encode`, `embed`, `classify`, `score`, `reward`)."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Optional, Sequence, Union

import torch
from tqdm.auto import tqdm

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine
from vllm.engine.padding import padding_kwarg
from vllm.engine.pooling_request import PoolingRequest
from vllm.engine.protocol import EngineCore
from vllm.engine import request_front
from vllm.engine.processor import PromptType
from vllm.transformers_utils.score_template import load_score_template
from vllm.logger import init_logger
from vllm.entrypoints import late_chunking
from vllm.entrypoints.embed_options import Calibration, EmbedOptions
from vllm.entrypoints.score_utils import cosine_score, maxsim, pair_texts
from vllm.entrypoints.sparse import check_lexical, lexical_weights
from vllm.outputs import (ClassificationRequestOutput, EmbeddingRequestOutput, PoolingOutput,
                          PoolingRequestOutput, ScoringRequestOutput)
from vllm.lora.request import LoRARequest
from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask

logger = init_logger(__name__)

Prompts = Union[PromptType, Sequence[PromptType]]
Params = Optional[Union[PoolingParams, Sequence[PoolingParams]]]
# one adapter for every prompt, or one (or None) per prompt
LoRAArg = Optional[Union[LoRARequest, Sequence[Optional[LoRARequest]]]]


class LLM:
    """Load a pooling model and run batches of prompts through it.

    Keyword arguments are vLLM's engine arguments (see `EngineArgs`); ones with no
    meaning here are accepted and logged, unsupported ones raise ValueError.
    """

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs.from_kwargs(model, **kwargs))
        self._ids = itertools.count()
        # the engine's embedding_calibration ranges, read on first need
        self._calibration = Calibration(self.llm_engine.model_config.embedding_calibration)
        self._warned_removed_task = False

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Forget all cached prefixes (as vLLM's `LLM.reset_prefix_cache`)."""
        self.llm_engine.reset_prefix_cache()
        return True

    # ----- public tasks ---------------------------------------------------------------
    def encode(self, prompts: Prompts, pooling_params: Params = None,
               truncate_prompt_tokens: Optional[int] = None, use_tqdm: bool = True,
               pooling_task: Optional[str] = None, *, truncation_side: Optional[str] = None,
               sparse: bool = False, **kwargs: Any) -> list[PoolingRequestOutput]:
        """Pooled states for `pooling_task` (upstream's: embed, classify, token_embed,
        token_classify); without one, the seed's raw `encode` task, which upstream 0.32
        has removed (a deprecation line is logged once). `sparse=True` (BGE-M3 under
        token_classify): each output's data is {token_id: weight}, max-pooled per id."""
        padding = padding_kwarg(kwargs.pop("tokenization_kwargs", None))
        lora = _refuse_extra(kwargs)
        mc = self.llm_engine.model_config
        task = pooling_task or mc.encode_task
        if sparse:
            check_lexical(mc, task)
        if task in (PoolingTask.ENCODE, PoolingTask.SCORE) and not self._warned_removed_task:
            self._warned_removed_task = True
            logger.warning("LLM.encode with the %r task: upstream vLLM 0.32 removed it; pass "
                           "pooling_task='token_embed' or 'token_classify' (or use "
                           "LLM.embed / LLM.classify / LLM.score).", task)
        outs = self._pool(prompts, task, pooling_params, use_tqdm,
                          truncate_prompt_tokens=truncate_prompt_tokens,
                          truncation_side=truncation_side, lora=lora, padding=padding)
        for o in outs if sparse else ():
            o.outputs.data = lexical_weights(mc, o.prompt_token_ids, o.outputs.data)
        return outs

    def embed(self, prompts: Prompts, truncate_prompt_tokens: Optional[int] = None,
              use_tqdm: bool = True, pooling_params: Params = None, *,
              truncation_side: Optional[str] = None,
              prompt_name: Optional[Union[str, Sequence[Optional[str]]]] = None,
              prompt: Optional[str] = None, precision: Optional[str] = None,
              ranges: Any = None, sparse: bool = False,
              **kwargs: Any) -> Union[list[EmbeddingRequestOutput],
                                      list[PoolingRequestOutput]]:
        """Embeddings. `prompt_name` / `prompt`: a sentence-transformers prompt before each
        text (the model's default_prompt_name applies when neither is given); a list of
        names gives each prompt its own (on jina-embeddings-v3 the name is also the task
        whose LoRA adapter runs; the prompts still share steps);
        `precision` / `ranges`: `quantize_embeddings`' output types (int8/uint8 need
        ranges, here or from the engine's `embedding_calibration` file); `sparse=True`
        (SPLADE models): each output's `embedding` is {token_id: weight} of the non-zero
        weights instead of the vocabulary-size list. On an engine running token_embed
        (ColBERT), as upstream 0.33: PoolingRequestOutputs whose `data` is the prompt's
        matrix of token vectors."""
        padding = padding_kwarg(kwargs.pop("tokenization_kwargs", None))
        lora = _refuse_extra(kwargs)
        options = EmbedOptions.of(precision, ranges, sparse)
        options.check(self.llm_engine.model_config)
        tokens = self.llm_engine.model_config.pooling_task == PoolingTask.TOKEN_EMBED
        request = self._request(prompts, PoolingTask.TOKEN_EMBED if tokens else
                                PoolingTask.EMBED, pooling_params,
                                truncate_prompt_tokens=truncate_prompt_tokens,
                                truncation_side=truncation_side, lora=lora, padding=padding)
        order, parts = self._prompted(request, prompt_name, prompt)
        runs = [self._late_chunking(part, options.precision) for part in parts]
        outs = _in_order(order, self._run([r for r, _ in runs], use_tqdm))
        plans = _in_order(order, [plan for _, part_plans in runs for plan in part_plans])
        for o, plan in zip(outs, plans):
            if plan is not None:
                late_chunking.apply(o, plan, self.get_tokenizer())
        if options.precision != "float32":
            values = options.quantize([o.outputs.data for o in outs], self._calibration)
            for o, v in zip(outs, values):
                o.outputs.data = torch.from_numpy(v)
        if tokens:
            return outs
        convert = EmbeddingRequestOutput.sparse_from_base if sparse else \
            EmbeddingRequestOutput.from_base
        return [convert(o) for o in outs]

    def classify(self, prompts: Prompts, use_tqdm: bool = True,
                 pooling_params: Params = None, truncate_prompt_tokens: Optional[int] = None,
                 *, truncation_side: Optional[str] = None,
                 **kwargs: Any) -> list[ClassificationRequestOutput]:
        padding = padding_kwarg(kwargs.pop("tokenization_kwargs", None))
        lora = _refuse_extra(kwargs)
        outs = self._pool(prompts, PoolingTask.CLASSIFY, pooling_params, use_tqdm,
                          truncate_prompt_tokens=truncate_prompt_tokens,
                          truncation_side=truncation_side, lora=lora, padding=padding)
        return [ClassificationRequestOutput.from_base(o) for o in outs]

    def reward(self, prompts: Prompts, truncate_prompt_tokens: Optional[int] = None,
               use_tqdm: bool = True, pooling_params: Params = None, *,
               truncation_side: Optional[str] = None,
               **kwargs: Any) -> list[PoolingRequestOutput]:
        lora = _refuse_extra(kwargs)
        return self._pool(prompts, PoolingTask.REWARD, pooling_params, use_tqdm,
                          truncate_prompt_tokens=truncate_prompt_tokens,
                          truncation_side=truncation_side, lora=lora)

    def score(self, data_1: Union[str, Sequence[str]], data_2: Union[str, Sequence[str]],
              truncate_prompt_tokens: Optional[int] = None, use_tqdm: bool = True,
              pooling_params: Optional[PoolingParams] = None, *,
              truncation_side: Optional[str] = None,
              chat_template: Optional[str] = None,
              chat_template_kwargs: Optional[dict[str, Any]] = None,
              **kwargs: Any) -> list[ScoringRequestOutput]:
        """Cross-encoders score each (data_1, data_2) pair; embedding models score the
        cosine similarity of the two embeddings. Pairs: 1->1, 1->N, N->N.
        `chat_template` (a file path or the Jinja text; default: the engine's) renders an LLM
        reranker's pair as messages [{role: query}, {role: document}]."""
        lora = _refuse_extra(kwargs)
        engine = self.llm_engine
        engine.verify_task(PoolingTask.SCORE)
        pairs = pair_texts(_texts(data_1), _texts(data_2))
        template = load_score_template(chat_template)
        if engine.model_config.is_cross_encoder:
            request = self._request(pairs, PoolingTask.SCORE, pooling_params, lora=lora,
                                    pairs=True, truncate_prompt_tokens=truncate_prompt_tokens,
                                    truncation_side=truncation_side, chat_template=template,
                                    chat_template_kwargs=chat_template_kwargs)
            outs = self._run(request, use_tqdm)
            return [ScoringRequestOutput.from_base(o) for o in outs]
        if isinstance(lora, (list, tuple)):
            if any(x != lora[0] for x in lora):
                raise ValueError("score on an embedding model takes one lora_request for "
                                 "all texts (a list is for cross-encoders: one per pair).")
            lora = lora[0] if lora else None
        if template is not None or chat_template_kwargs:
            raise ValueError("chat_template applies to cross-encoder scoring; this model "
                             "scores by the similarity of two embeddings.")
        return self._embedding_scores(pairs, truncate_prompt_tokens, use_tqdm, pooling_params,
                                      truncation_side, lora)

    # ----- internals -------------------------------------------------------------------
    def _prompted(self, request: PoolingRequest, prompt_name: Any,
                  prompt: Optional[str]) -> tuple[list[int], list[PoolingRequest]]:
        """(the prompts' indices in run order, the requests to run) after the
        sentence-transformers prompt step: one request, or with a list of names one per
        distinct name."""
        processor = self.llm_engine.processor
        if not isinstance(prompt_name, (list, tuple)):
            return list(range(len(request.prompts))), [request_front.apply_prompt(
                processor, request, prompt_name, prompt, default=True)]
        if len(prompt_name) != len(request.prompts):
            raise ValueError(f"Got {len(prompt_name)} prompt_name entries for "
                             f"{len(request.prompts)} prompts; pass one, or one per prompt.")
        groups: dict[Optional[str], list[int]] = {}
        for i, name in enumerate(prompt_name):
            groups.setdefault(name, []).append(i)
        return [i for idx in groups.values() for i in idx], [
            request_front.apply_prompt(processor, request.subset(idx), name, prompt, True)
            for name, idx in groups.items()]

    def _late_chunking(self, request: PoolingRequest,
                       precision: str) -> tuple[PoolingRequest, list]:
        """(the request to run, one LateChunkPlan or None per prompt): prompts whose params
        ask for late chunking run unnormalised and are pooled per chunk afterwards."""
        if all(p is None or p.late_chunking_params is None for p in request.params):
            return request, [None] * len(request.prompts)
        if precision != "float32":
            raise ValueError("late_chunking_params returns float vectors; leave precision "
                             "unset.")
        mc, how = self.llm_engine.model_config, request.tokenization
        run, plans = [], []
        for prompt, p in zip(request.prompts, request.params):
            if p is None or p.late_chunking_params is None:
                run.append(p)
                plans.append(None)
                continue
            text, = late_chunking.check_inputs([prompt], truncate=how.truncate_prompt_tokens,
                                               padding=how.padding,
                                               prompt_applied=how.prompt_len is not None)
            engine_p, normalize = late_chunking.engine_params(p, request.task, mc)
            run.append(engine_p)
            plans.append(late_chunking.LateChunkPlan(
                text, engine_p.late_chunking_params.chunk_size, normalize))
        return dataclasses.replace(request, params=run), plans

    def _embedding_scores(self, pairs, truncate_prompt_tokens, use_tqdm, params, side=None,
                          lora=None):
        """Cosine of the two embeddings; MaxSim of the token vectors for ColBERT."""
        multi = self.llm_engine.model_config.late_interaction
        items = {_item_key(t): t for pair in pairs for t in pair}  # each text once
        task = PoolingTask.TOKEN_EMBED if multi else PoolingTask.EMBED
        embeds = self._pool(list(items.values()), task, params, use_tqdm,
                            truncate_prompt_tokens=truncate_prompt_tokens,
                            truncation_side=side, lora=lora)
        by_key = dict(zip(items, embeds))
        similarity = maxsim if multi else cosine_score
        results = []
        for a, b in pairs:
            ea, eb = by_key[_item_key(a)], by_key[_item_key(b)]
            base = PoolingRequestOutput(
                f"{ea.request_id}_{eb.request_id}",
                PoolingOutput(similarity(ea.outputs.data, eb.outputs.data)),
                ea.prompt_token_ids + eb.prompt_token_ids, True,
                ea.num_cached_tokens + eb.num_cached_tokens)
            results.append(ScoringRequestOutput.from_base(base))
        return results

    def _request(self, prompts: Prompts, task: PoolingTask, params: Params,
                 **fields: Any) -> PoolingRequest:
        """`prompts` as one typed `PoolingRequest` for `task` (`fields`: its adapter and
        tokenization); ValueError when the engine does not run `task`."""
        self.llm_engine.verify_task(task)
        prompt_list = prompts if isinstance(prompts, list) and fields.get("pairs") else \
            _as_list(prompts)
        return PoolingRequest.of(prompt_list, task, params, **fields)

    def _pool(self, prompts: Prompts, task: PoolingTask, params: Params, use_tqdm: bool,
              **fields: Any) -> list[PoolingRequestOutput]:
        return self._run(self._request(prompts, task, params, **fields), use_tqdm)

    def _run(self, request: Union[PoolingRequest, Sequence[PoolingRequest]],
             use_tqdm: bool) -> list[PoolingRequestOutput]:
        """The shared front's steps (vllm.engine.request_front): verify each distinct
        PoolingParams once, tokenize as the request says; then add every prompt and step
        the engine until all are done. Several requests (one call's prompts under different
        prompt names) are all added before the first step, so they share steps; their
        outputs come back one request after the other."""
        engine: EngineCore = self.llm_engine
        ids: list[str] = []
        try:
            for part in [request] if isinstance(request, PoolingRequest) else request:
                if not part.prompts:
                    continue
                part = request_front.verify_all(part, engine.model_config)
                tokenized = request_front.tokenize_request(engine.processor, part)
                loras = _per_prompt(part.lora, LoRARequest, len(tokenized),
                                    "lora_request entries")
                for prompt, p, adapter in zip(tokenized, request_front.per_prompt(part),
                                              loras):
                    ids.append(str(next(self._ids)))
                    engine.add_request(ids[-1], prompt, p, adapter)
            return self._drain(ids, use_tqdm) if ids else []
        except BaseException:
            engine.abort_request(ids)
            raise

    def _drain(self, ids: list[str], use_tqdm: bool) -> list[PoolingRequestOutput]:
        done: dict[str, PoolingRequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm,
                   dynamic_ncols=True)
        with bar:
            while self.llm_engine.has_unfinished_requests():
                for out in self.llm_engine.step():
                    done[out.request_id] = out
                    bar.update(1)
        return [done[i] for i in ids]


def _in_order(order: list[int], items: list) -> list:
    """`items`, given in `order` (the original index of each), back in the original order."""
    out: list = [None] * len(items)
    for i, item in zip(order, items):
        out[i] = item
    return out


def _as_list(prompts: Prompts) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt given as token ids
    return prompts


def _texts(data: Union[str, dict, Sequence[Union[str, dict]]]) -> Union[str, list[str]]:
    """score's side: one text (a str or {"prompt": str}) or a list of them."""
    if isinstance(data, (str, dict)):
        return [_text(data)]
    return [_text(item) for item in data]


def _item_key(item: Union[str, dict]) -> Union[str, int]:
    """A score item's identity: a text by its value, an image prompt by its object."""
    return item if isinstance(item, str) else id(item)


def _text(item: Union[str, dict]) -> Union[str, dict]:
    """A text, or an image prompt ({"prompt": "", "multi_modal_data": ...}) as it is."""
    if isinstance(item, dict) and "multi_modal_data" in item:
        return item
    if isinstance(item, dict) and "prompt" in item:
        item = item["prompt"]
    if not isinstance(item, str):
        raise ValueError("score takes text prompts (str or {'prompt': str}).")
    return item


def _per_prompt(value, single: type, n: int, what: str) -> list:
    """`value` for each of `n` prompts: None or one `single` for all, else one per prompt."""
    if value is None or isinstance(value, single):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(f"Got {len(values)} {what} for {n} prompts; pass one, or "
                         "one per prompt.")
    return values


def _refuse_extra(kwargs: dict) -> LoRAArg:
    """Pop `lora_request` (returned) and upstream's keywords this engine takes only at
    their off value; anything else is a ValueError, never silently dropped."""
    lora = kwargs.pop("lora_request", None)
    items = lora if isinstance(lora, (list, tuple)) else [lora]
    bad = [x for x in items if x is not None and not isinstance(x, LoRARequest)]
    if bad:
        raise ValueError(f"lora_request must be a LoRARequest (vllm.lora.request), a list "
                         f"of them (or None), or None; got {type(bad[0]).__name__}.")
    if kwargs.get("tokenization_kwargs") is None:
        kwargs.pop("tokenization_kwargs", None)
    if kwargs:
        raise ValueError(f"Unexpected argument(s): {', '.join(sorted(kwargs))}.")
    return lora