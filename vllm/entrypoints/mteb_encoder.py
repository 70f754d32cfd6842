"""An `mteb`-compatible encoder over an `LLM`, so `mteb.evaluate(VllmEncoder(llm), tasks)`
benchmarks the engine (mteb's EncoderProtocol: `encode` over a DataLoader of batches,
`similarity`, `similarity_pairwise`).

The `mteb` package is optional: this module imports nothing from it. Similarities are
cosine (the embeddings are compared as sentence-transformers compares them by default).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np
import torch
import torch.nn.functional as F


class VllmEncoder:
    """Embed mteb's inputs with `llm.embed`, in the order they come, as a float32 array."""

    mteb_model_meta: Any = None  # mteb builds a placeholder for unregistered models

    def __init__(self, llm: Any, prompts: Optional[dict[str, str]] = None) -> None:
        """`prompts`: optional text prepended per prompt type ("query" / "document") or
        task name, as sentence-transformers' prompts."""
        self.llm = llm
        self.prompts = dict(prompts or {})

    def encode(self, inputs: Iterable[dict], *, task_metadata: Any = None,
               hf_split: str = "", hf_subset: str = "", prompt_type: Any = None,
               **kwargs: Any) -> np.ndarray:
        prefix = self._prefix(task_metadata, prompt_type)
        texts = [prefix + text for batch in inputs for text in batch["text"]]
        outs = self.llm.embed(texts, use_tqdm=False)
        return np.asarray([o.outputs.embedding for o in outs], dtype=np.float32)

    def _prefix(self, task_metadata: Any, prompt_type: Any) -> str:
        name = getattr(task_metadata, "name", None)
        kind = getattr(prompt_type, "value", prompt_type)
        for key in (f"{name}-{kind}", name, kind):
            if key in self.prompts:
                return self.prompts[key]
        return ""

    @staticmethod
    def similarity(a: Any, b: Any) -> torch.Tensor:
        """[n, m] cosine similarities."""
        a, b = torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))
        return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T

    @staticmethod
    def similarity_pairwise(a: Any, b: Any) -> torch.Tensor:
        """[n] cosine similarity of row i of `a` with row i of `b`."""
        a, b = torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))
        return F.cosine_similarity(a.float(), b.float(), dim=-1)
