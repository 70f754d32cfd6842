"""PoolTracker: CLS / MEAN / ALL / STEP pooling across chunks and cached blocks.

Active only on a causal model whose pooling is one of those and only when the user turned
chunked prefill or prefix caching on (the gate's defaults keep both off for them). Each
step it writes the blocks' pooling payloads (prefix caching), brings every scheduled
request's `RequestPoolState` up to date (reading the payloads of its cached blocks first),
and pools the finishing requests from their states through the ordinary `Pooler`, whose
heads and post-processing therefore run exactly as in an unchunked, uncached pass.
"""
from __future__ import annotations

from typing import Optional

import torch

from vllm.core.request import Request
from vllm.core.scheduler import SchedulerOutput
from vllm.logger import init_logger
from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.pool_state import (PAYLOAD_KINDS, BlockPayloadStore,
                                                   RequestPoolState, describe_payload,
                                                   pool_key, pool_position)
from vllm.model_executor.layers.pooler import Pooler, PoolingSlice

logger = init_logger(__name__)


def tracked_kind(vllm_config) -> Optional[str]:
    """The pooling kind the tracker runs for, or None when the ordinary path suffices."""
    mc = vllm_config.model_config
    kind = mc.gate_pooling_type  # a token task reads every token: ALL
    on = vllm_config.cache_config.enable_prefix_caching or \
        vllm_config.scheduler_config.enable_chunked_prefill
    return kind if on and mc.is_causal and kind in PAYLOAD_KINDS else None


def hidden_size(hf_config) -> int:
    """The width of the backbone's final hidden states."""
    cfg = getattr(hf_config, "text_config", None) or hf_config
    return int(getattr(cfg, "hidden_size", None) or hf_config.hidden_size)


class PoolTracker:
    def __init__(self, kind: str, pooler: Pooler, pool_prompt: bool,
                 store: Optional[BlockPayloadStore]) -> None:
        self.kind = kind
        self.pooler = pooler
        self.pool_prompt = pool_prompt
        self.store = store
        self._cls_rows: dict[int, int] = {}
        if store is not None:
            logger.info("%s pooling runs exactly across chunks and cached blocks; a cached "
                        "block carries %s.", kind, describe_payload(kind))
        else:
            logger.info("%s pooling runs exactly across chunks (its partial result kept per "
                        "request); prefix caching is off, so no pooling payload is cached.",
                        kind)

    # ----- per request ----------------------------------------------------------------
    def _skip(self, req: Request) -> int:
        return 0 if self.pool_prompt else (req.prompt_len or 0)

    def key(self, num_tokens: int, prompt_len: Optional[int]) -> Optional[str]:
        """The payload setting a request's block hashes carry (None: none needed)."""
        return pool_key(self.kind, 0 if self.pool_prompt else (prompt_len or 0), num_tokens)

    def _state(self, req: Request, num_computed: int, block_ids: list[int]) -> RequestPoolState:
        """`req`'s state with every position below `num_computed` accounted."""
        st = req.pool_state
        if st is None or st.done != num_computed:  # new, or preempted and re-admitted
            st = RequestPoolState(self.kind, pool_position(self.kind, self._skip(req),
                                                           req.num_tokens), req.num_tokens)
            req.pool_state = st
        if st.done < num_computed:  # whole blocks found in the prefix cache
            if self.store is None:
                raise RuntimeError("a cached prefix without a pooling payload store")
            st.load(self.store, block_ids, num_computed)
        return st

    # ----- one step -------------------------------------------------------------------
    def rows_needed(self, out: SchedulerOutput, meta: AttentionMetadata,
                    device) -> Optional[torch.Tensor]:
        """CLS: the flat rows holding a scheduled request's CLS position (the last layer
        computes only those); None for the kinds that read every row."""
        if self.kind != "CLS":
            return None
        rows: list[int] = []
        self._cls_rows = {}
        for i, s in enumerate(out.scheduled):
            c = pool_position("CLS", self._skip(s.request), s.request.num_tokens)
            if s.num_computed <= c < s.num_computed + s.num_new:
                self._cls_rows[i] = len(rows)
                rows.append(meta.query_start_loc[i] + c - s.num_computed)
        return torch.tensor(rows or [0], dtype=torch.long, device=device)

    def run(self, hidden: torch.Tensor, out: SchedulerOutput,
            meta: AttentionMetadata) -> dict[str, torch.Tensor]:
        """Write payloads, advance every scheduled request, pool the finishing ones."""
        if self.store is not None:
            self._write_payloads(hidden, out, meta)
        finishing: list[tuple[Request, RequestPoolState]] = []
        for i, s in enumerate(out.scheduled):
            req = s.request
            st = self._state(req, s.num_computed, s.block_ids)
            st.add(self._rows(hidden, meta, i), s.num_computed, s.num_new)
            if s.finishes:
                finishing.append((req, st))
                req.pool_state = None
        return self._pool(finishing, hidden)

    def _rows(self, hidden: torch.Tensor, meta: AttentionMetadata,
              i: int) -> Optional[torch.Tensor]:
        if self.kind == "CLS":
            j = self._cls_rows.get(i)
            return None if j is None else hidden[j]
        start = meta.query_start_loc[i]
        return hidden[start: start + meta.num_new[i]]

    def _write_payloads(self, hidden: torch.Tensor, out: SchedulerOutput,
                        meta: AttentionMetadata) -> None:
        store, bs = self.store, self.store.block_size
        if self.kind == "CLS":
            for i, j in self._cls_rows.items():
                s = out.scheduled[i]
                c = pool_position("CLS", self._skip(s.request), s.request.num_tokens)
                store.write_cls(s.block_ids[c // bs], hidden[j])
            return
        counted = None
        if self.kind == "MEAN" and not self.pool_prompt:
            counted = torch.ones(hidden.shape[0], dtype=torch.bool)
            for i, s in enumerate(out.scheduled):
                p = pool_position("MEAN", self._skip(s.request), s.request.num_tokens)
                start = meta.query_start_loc[i]
                counted[start: start + min(max(p - s.num_computed, 0), s.num_new)] = False
            counted = counted.to(hidden.device)
        store.write(hidden, meta.slot_mapping, counted)

    def _pool(self, finishing: list[tuple[Request, RequestPoolState]],
              hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        if not finishing:
            return {}
        slices = [PoolingSlice(0, r.num_tokens, 0, r.prompt_token_ids, r.pooling_params,
                               self._skip(r)) for r, _ in finishing]
        ids = [r.request_id for r, _ in finishing]
        if self.kind in ("ALL", "STEP"):
            return {rid: self.pooler(st.all_rows(), [s])[0]
                    for rid, (_, st), s in zip(ids, finishing, slices)}
        width = hidden.shape[-1]
        vecs = [st.vector() for _, st in finishing]
        vecs = [v if v is not None else torch.zeros(width, device=hidden.device) for v in vecs]
        pooled = torch.stack(vecs)
        if self.kind == "CLS" or self.pooler.head is not None or self.pooler.dense:
            pooled = pooled.to(hidden.dtype)  # as the unchunked pooler hands its heads
        return dict(zip(ids, self.pooler(pooled, slices, selected=True)))
