"""ONNX Runtime baseline for bench_embed: a sentence-transformers model run as ONNX.

sentence-transformers' own `backend="onnx"` needs optimum, whose releases pin an older
transformers than this project uses, so this module does what that backend does with the
parts it uses: the Transformer module's Hugging Face model exported once to ONNX (torch's
dynamo exporter, eager attention, dynamic batch and length; cached next to the results), run
by onnxruntime's CPU provider with torch's thread count, batches of `batch_size` texts sorted
by length and padded (as `SentenceTransformer.encode`), then the checkpoint's mean pooling and
normalisation in numpy. `OnnxEmbedder.available()` says why it cannot run (no onnxruntime /
onnx / onnxscript: `pip install -e .[bench]`).
"""
from __future__ import annotations

import hashlib
import pathlib
from typing import Optional

import numpy as np

from common import RESULTS

CACHE = RESULTS / ".onnx"


def missing() -> Optional[str]:
    """The package that is missing for this baseline, or None."""
    for name in ("onnxruntime", "onnx", "onnxscript"):
        try:
            __import__(name)
        except ImportError:
            return name
    return None


def _export(model_dir: pathlib.Path, path: pathlib.Path) -> None:
    import torch
    from transformers import AutoModel

    class Hidden(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    from transformers import AutoTokenizer
    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    # A padded batch of real text as the example: with an all-ones mask (as before)
    # transformers 5 traces its no-padding shortcut, and the export gave cosine ~0.06.
    example = AutoTokenizer.from_pretrained(str(model_dir))(
        ["an example sentence to trace", "short"], padding=True, return_tensors="pt")
    dims = {0: torch.export.Dim("batch", max=4096), 1: torch.export.Dim("length", max=512)}
    names = ["input_ids", "attention_mask", "token_type_ids"]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(Hidden(model), tuple(example[n] for n in names), str(path),
                      input_names=names, output_names=["last_hidden_state"],
                      dynamic_shapes={n: dims for n in names}, dynamo=True)


class OnnxEmbedder:
    """`encode(texts)` -> normalised mean-pooled float32 embeddings, through onnxruntime."""

    def __init__(self, model_dir: pathlib.Path, max_length: int, threads: int,
                 path: Optional[pathlib.Path] = None) -> None:
        """`path`: an ONNX file of the model to run instead of the float32 export."""
        import onnxruntime as ort
        from transformers import AutoTokenizer
        tag = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:10]
        path = path or CACHE / f"{model_dir.name}_{tag}_v2.onnx"  # v2: a padded example
        if not path.exists():
            _export(model_dir, path)
        self.path = path
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options,
                                            providers=["CPUExecutionProvider"])
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.max_length = max_length

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), 0), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            chosen = order[start:start + batch_size]
            enc = self.tokenizer([texts[i] for i in chosen], padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="np")
            feed = {k: enc[k].astype(np.int64) for k in
                    ("input_ids", "attention_mask", "token_type_ids")}
            hidden = self.session.run(None, feed)[0]
            mask = feed["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            if out.shape[1] == 0:
                out = np.empty((len(texts), pooled.shape[1]), dtype=np.float32)
            out[chosen] = pooled
        return out
