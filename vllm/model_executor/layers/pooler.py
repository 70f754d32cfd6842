"""Pooling (LAST, CLS, MEAN, ALL, STEP, SPLADE) and the per-task heads applied after it.

The pooler runs only for requests whose final prompt token was computed in this step.
CLS/MEAN/ALL/STEP read every token in the step; when chunked prefill or prefix caching
was asked for on a causal model, `worker/pool_steps.py` assembles the request's pooled
vector or rows across steps and cached blocks first and hands them here whole. LAST needs
only the final token, which is always computed. SPLADE reduces a
request's rows through the backbone's own `sparse_pool` (MLM logits -> vocabulary weights).
Where the attention backend offers device reductions (TRITON_ATTN's `pool_rows`), LAST /
CLS / MEAN rows the model did not select already and the embeddings' L2 normalize run
there, and the embeddings come back to the host in one transfer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from vllm.attention.backends.registry import get_backend
from vllm.pooling_params import PoolingParams
from vllm.tasks import TOKEN_TASKS, PoolingTask as T

_VECTOR_POOLING = ("LAST", "CLS", "MEAN", "SPLADE")


@dataclass
class PoolingSlice:
    """Where one finishing request's tokens sit in the step's flat hidden states."""

    start: int
    num_new: int
    num_computed: int
    token_ids: list[int]
    params: PoolingParams
    # Leading tokens left out of MEAN pooling, whose CLS is the token after them: a
    # sentence-transformers prompt when the model's Pooling has include_prompt false.
    skip: int = 0


class Pooler:
    def __init__(self, pooling_type: str, model, score_activation: str) -> None:
        self.pooling_type = pooling_type
        self.head = model.head
        self.dense = list(model.dense)
        self.score_activation = score_activation
        self.sparse_pool = getattr(model.model, "sparse_pool", None)
        # A backbone's own per-token outputs (BGE-M3's lexical weights and ColBERT vectors).
        self.token_weights = getattr(model.model, "token_weights", None)
        self.token_vectors = getattr(model.model, "token_vectors", None)
        # The backend's device reductions (see module doc), or None: the torch path.
        self.pool_rows = getattr(get_backend(getattr(model, "attention_backend", "TORCH_SDPA")),
                                 "pool_rows", None)
        if pooling_type == "SPLADE" and self.sparse_pool is None:
            raise ValueError(f"SPLADE pooling needs a sparse model such as "
                             f"BertSpladeSparseEmbeddingModel, not {type(model.model).__name__}.")

    def rows_needed(self, slices: list[PoolingSlice], device) -> Optional[torch.Tensor]:
        """The flat rows LAST/CLS pooling reads (one per finishing request, in order), so
        the model can skip the last layer's output for every other token; None when
        pooling reads every token (MEAN, ALL, STEP)."""
        if self.pooling_type not in ("LAST", "CLS") or any(map(self._per_token, slices)):
            return None
        return self._row_index(slices, device)

    def _per_token(self, s: PoolingSlice) -> bool:
        """One row per token: the token tasks, and the seed's tasks under ALL / STEP."""
        return s.params.task in TOKEN_TASKS or self.pooling_type not in _VECTOR_POOLING

    def __call__(self, hidden: torch.Tensor, slices: list[PoolingSlice],
                 selected: bool = False) -> list[torch.Tensor]:
        """Pool and post-process; returns one float32 CPU tensor per slice. `selected`:
        `hidden` already holds just the `rows_needed` rows."""
        if not slices:
            return []
        vector = [i for i, s in enumerate(slices) if not self._per_token(s)]
        if len(vector) == len(slices):
            return self._vectors(hidden, slices, selected)
        out: list = [None] * len(slices)
        if vector:
            pooled = self._vectors(hidden, [slices[i] for i in vector], selected)
            for i, vec in zip(vector, pooled):
                out[i] = vec
        return [o if o is not None else self._token_rows(hidden, s)
                for o, s in zip(out, slices)]

    # ----- one vector per request ----------------------------------------------------
    def _vectors(self, hidden: torch.Tensor, slices: list[PoolingSlice],
                 selected: bool) -> list[torch.Tensor]:
        if selected:
            pooled = hidden
        elif self.pooling_type == "SPLADE":
            pooled = torch.stack([self.sparse_pool(_whole(hidden, s, "SPLADE")) for s in slices])
        elif self.pool_rows is not None:  # float32 rows (LAST / CLS: exact copies)
            pooled = self.pool_rows(hidden, *self._segments(slices))
        elif self.pooling_type == "MEAN":
            pooled = _mean_pool(hidden, slices)
        else:
            pooled = hidden[self._row_index(slices, hidden.device)]
        tasks = {s.params.task for s in slices}
        if self.head is not None and tasks & {T.CLASSIFY, T.SCORE, T.ENCODE, T.REWARD}:
            pooled = self.head(pooled.to(hidden.dtype))
        vectors = list(pooled.float())
        if self.dense and T.EMBED in tasks:
            # The sentence-transformers Dense modules belong to embeddings only: a raw
            # /pooling request in the same step keeps the transformer's pooled state.
            rows = [i for i, s in enumerate(slices) if s.params.task == T.EMBED]
            projected = pooled[rows].to(hidden.dtype)
            for layer in self.dense:
                projected = layer(projected)
            for i, vec in zip(rows, projected.float()):
                vectors[i] = vec
        if self.pool_rows is not None:
            return self._post_on_device(vectors, slices)
        return [_own(self._post(vectors[i], s.params)) for i, s in enumerate(slices)]

    def _row_index(self, slices: list[PoolingSlice], device) -> torch.Tensor:
        return torch.tensor(self._segments(slices)[0], dtype=torch.long, device=device)

    def _segments(self, slices: list[PoolingSlice]) -> tuple[list[int], list[int]]:
        """Per slice, the first flat row pooled and how many rows: LAST / CLS one, MEAN
        the request's rows after a left-out prompt (maybe none)."""
        starts, counts = [], []
        for s in slices:
            if self.pooling_type == "LAST":
                starts.append(s.start + s.num_new - 1)
                counts.append(1)
                continue
            _require_whole(s, self.pooling_type)
            first = min(s.skip, s.num_new) if self.pooling_type == "MEAN" else \
                (s.skip if s.skip < s.num_new else 0)
            starts.append(s.start + first)
            counts.append(s.num_new - first if self.pooling_type == "MEAN" else 1)
        return starts, counts

    def _post_on_device(self, vectors: list[torch.Tensor],
                        slices: list[PoolingSlice]) -> list[torch.Tensor]:
        """`_post` with the embeddings cut and normalized by the backend's kernel in one
        launch and copied to the host in one transfer (other tasks as `_post`)."""
        out = [None] * len(slices)
        embed = [i for i, s in enumerate(slices) if s.params.task == T.EMBED]
        if embed:
            rows = torch.stack([vectors[i] for i in embed])
            cut = [min(slices[i].params.dimensions or rows.shape[1], rows.shape[1])
                   for i in embed]
            norm = [c if slices[i].params.normalize else 0 for c, i in zip(cut, embed)]
            done = self.pool_rows(rows, list(range(len(embed))), [1] * len(embed), norm).cpu()
            for j, (i, c) in enumerate(zip(embed, cut)):
                out[i] = _own(done[j, :c])
        return [o if o is not None else _own(self._post(vectors[i], s.params))
                for i, (o, s) in enumerate(zip(out, slices))]

    def _post(self, vec: torch.Tensor, p: PoolingParams) -> torch.Tensor:
        if p.task == T.EMBED:
            if p.dimensions is not None:
                vec = vec[: p.dimensions]
            return F.normalize(vec, dim=-1) if p.normalize else vec
        if p.task == T.CLASSIFY:
            return _label_activation(vec) if p.activation else vec
        if p.task == T.SCORE:
            return _apply(self.score_activation, vec) if p.activation else vec
        return _label_activation(vec) if p.softmax else vec

    # ----- one row per token (ALL, STEP) ---------------------------------------------
    def _token_rows(self, hidden: torch.Tensor, s: PoolingSlice) -> torch.Tensor:
        _require_whole(s, self.pooling_type)
        rows = hidden[s.start: s.start + s.num_new]
        p = s.params
        if p.task == T.TOKEN_EMBED:  # ST Dense per token, cut, then unit length
            if self.token_vectors is not None:
                rows = self.token_vectors(rows, s.token_ids)
            for layer in self.dense:
                rows = layer(rows.to(hidden.dtype))
            rows = rows.float()[:, : p.dimensions] if p.dimensions else rows.float()
            return _own(F.normalize(rows, dim=-1) if p.normalize else rows)
        if p.task == T.TOKEN_CLASSIFY and self.token_weights is not None:
            return _own(self.token_weights(rows, s.token_ids, bool(p.activation)))
        if self.head is not None:
            rows = getattr(self.head, "per_token", self.head)(rows) \
                if p.task == T.TOKEN_CLASSIFY else self.head(rows)
        rows = rows.float()
        if self.pooling_type == "STEP":  # as upstream: columns, then tag rows, then activation
            if p.returned_token_ids:
                rows = rows[:, p.returned_token_ids]
            if p.step_tag_id is not None:
                ids = torch.tensor(s.token_ids, device=rows.device)
                rows = rows[ids == p.step_tag_id]
        if p.softmax or (p.task == T.TOKEN_CLASSIFY and p.activation):
            rows = _label_activation(rows)  # one column: sigmoid (softmax of one is 1)
        return _own(rows)


def _own(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU in a buffer of its own. Without a head or an activation an output
    is a view of the step's buffer (the hidden states of every token in the step, or the
    step's pooled matrix), and one output kept alive would keep all of it: a /pooling ALL
    answer of 10k inputs pinned every step's hidden states until it was sent."""
    t = t.cpu()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def _mean_pool(hidden: torch.Tensor, slices: list[PoolingSlice]) -> torch.Tensor:
    """Per-request mean of its rows, summed in float32 in one pass over the step."""
    segment = torch.full((hidden.shape[0],), len(slices), dtype=torch.long)
    for i, s in enumerate(slices):
        _require_whole(s, "MEAN")
        segment[s.start + min(s.skip, s.num_new): s.start + s.num_new] = i
    sums = torch.zeros(len(slices) + 1, hidden.shape[1], dtype=torch.float32,
                       device=hidden.device)
    sums.index_add_(0, segment.to(hidden.device), hidden.float())
    # No token left (a prompt covering the whole input): zeros, as ST's clamped mean.
    counts = torch.tensor([max(s.num_new - s.skip, 1) for s in slices], dtype=torch.float32,
                          device=hidden.device)
    return sums[:-1] / counts[:, None]  # float32, as upstream (heads cast to their dtype)


def _whole(hidden: torch.Tensor, s: PoolingSlice, kind: str) -> torch.Tensor:
    _require_whole(s, kind)
    return hidden[s.start: s.start + s.num_new]


def _require_whole(s: PoolingSlice, kind: str) -> None:
    if s.num_computed != 0 or s.num_new != len(s.token_ids):
        raise RuntimeError(f"{kind} pooling needs the whole prompt in one step; chunked "
                           "prefill / prefix caching must be off for this model")


def _label_activation(logits: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(logits) if logits.shape[-1] == 1 else F.softmax(logits, dim=-1)


def _apply(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "softmax":  # over one value it would always be 1: a sigmoid, as upstream
        return _label_activation(x)
    if name == "tanh":
        return torch.tanh(x)
    return x
