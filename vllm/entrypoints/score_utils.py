"""Pairing rules and cosine scoring shared by `LLM.score` and the HTTP score routes."""
from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F


def pair_texts(text_1: Union[str, list[str]],
               text_2: Union[str, list[str]]) -> list[tuple[str, str]]:
    """1 -> 1, 1 -> N (the query repeated) or N -> N; anything else is a ValueError."""
    left = [text_1] if isinstance(text_1, str) else list(text_1)
    right = [text_2] if isinstance(text_2, str) else list(text_2)
    if not left or not right:
        raise ValueError("score needs at least one text on each side.")
    if len(left) == 1:
        left = left * len(right)
    if len(left) != len(right):
        raise ValueError(f"score pairs texts 1 -> 1, 1 -> N or N -> N; got {len(left)} "
                         f"and {len(right)} texts.")
    return list(zip(left, right))


def maxsim(query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """ColBERT's late interaction: for every query token the best dot product over the
    document's tokens, summed; a one-element float32 tensor."""
    return (query.float() @ doc.float().T).amax(dim=1).sum().reshape(1)


def cosine_score(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of two embeddings, as a one-element float32 tensor."""
    return F.cosine_similarity(a.float()[None], b.float()[None]).reshape(1)
