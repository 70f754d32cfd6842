"""Encoder task heads on the Transformers backend: the transformers task class's own head.

An encoder `*ForSequenceClassification` (Electra, Camembert, DistilBERT, MPNet, ...) or
`*ForTokenClassification` keeps its head code inside the task class's `forward` (Electra's
dense + gelu + out_proj over the first token, DistilBERT's pre_classifier + ReLU, a
BERT-like base's own pooler). Rather than re-writing each, `TaskHead` runs that forward on
a shallow copy of the task model whose backbone is replaced by `_PooledRows`: a stand-in
that hands back the engine's pooled rows as one-token sequences (plus the base model's own
pooler output, where the base has one). The head's arithmetic is then transformers' own.

That is exact only for a head that reads the first token alone (sequence classifiers,
pooled as CLS) or each token alone (token classifiers). `check_reads_its_rows` proves it
once, at load, on random states, and refuses a head that reads more (a last-token or mean
summary, an attention-based head) with a ValueError.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn


class _PooledRows(nn.Module):
    """The backbone's stand-in: `inputs_embeds` [N, L, H] is returned as the final states."""

    def __init__(self, pooler: Optional[nn.Module]) -> None:
        super().__init__()
        self.pooler = pooler

    def forward(self, *args, inputs_embeds: Optional[torch.Tensor] = None, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPooling
        if inputs_embeds is None:
            raise RuntimeError("the task head's stand-in backbone takes inputs_embeds only")
        pooled = self.pooler(inputs_embeds) if self.pooler is not None else None
        return BaseModelOutputWithPooling(last_hidden_state=inputs_embeds, pooler_output=pooled)


class TaskHead(nn.Module):
    """transformers' task head of `task_model`, applied to pooled rows [N, H] -> [N, L].
    Its parameters are the task model's (transformers loaded them): `preloaded`."""

    preloaded = True

    def __init__(self, task_model: nn.Module, per_token: bool) -> None:
        super().__init__()
        prefix = task_model.base_model_prefix
        base = getattr(task_model, prefix)
        pooler = getattr(base, "pooler", None)
        head = copy.copy(task_model)
        head._modules = dict(task_model._modules)
        head._modules[prefix] = _PooledRows(pooler if isinstance(pooler, nn.Module) else None)
        self.task = head
        self.per_token_head = per_token
        # The head's own modules by name as well (shared, not copied): a LoRA adapter that
        # saved its `classifier` replaces that module in a copy of this head.
        for name, child in task_model.named_children():
            if name != prefix and name not in self._modules:
                self.add_module(name, child)

    def _logits(self, states: torch.Tensor) -> torch.Tensor:
        return self.task(inputs_embeds=states).logits

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """Each row as a one-token sequence through the head: [N, H] -> [N, num_labels]."""
        return self._logits(rows[:, None]).reshape(rows.shape[0], -1)

    def per_token(self, rows: torch.Tensor) -> torch.Tensor:
        """`token_classify`: the same head on every token's state."""
        return self.forward(rows)


def check_reads_its_rows(head: TaskHead, hidden_size: int, arch: str) -> None:
    """Refuse a head whose output on a sequence is not its output on the rows the engine
    hands it: the first row (sequence classifier) or each row alone (token classifier)."""
    gen = torch.Generator().manual_seed(0)
    dtype = next(head.parameters()).dtype
    seq = torch.randn(1, 5, hidden_size, generator=gen).to(dtype)
    try:
        with torch.inference_mode():
            whole = head._logits(seq)[0]
            alone = head(seq[0])
    except Exception as exc:  # a task forward that needs more than hidden states
        raise ValueError(f"{arch}'s classification head cannot run on hidden states alone "
                         f"({type(exc).__name__}: {exc}), so the Transformers backend cannot "
                         "serve it as a classifier; convert='embed' serves its encoder.") from exc
    expected = alone if head.per_token_head else alone[0]
    if whole.shape != expected.shape or not torch.allclose(whole, expected, atol=1e-5,
                                                           rtol=1e-4):
        what = "each token alone" if head.per_token_head else "the first token alone"
        raise ValueError(f"{arch}'s classification head reads more than {what}, so the "
                         "Transformers backend cannot run it on the engine's pooled rows.")
