"""Engines whose weights were packed at different OpenMP thread counts, in one process.

oneDNN's packed layout may follow the packing thread's thread count (on AVX2 it does), so
each engine here is built at another count, then every engine runs again at another count
than it was packed at. Imported by tests/test_packed_threads.py, and run as a script in a
fresh process where the environment picks oneDNN's ISA (`ONEDNN_MAX_CPU_ISA`) and the kernel
library (`VLLM_CPU_KERNELS_LIB`): prints one JSON object.
"""
from __future__ import annotations

import json
import sys

import torch

QUERY = "what is the capital of France?"
DOCS = ["Paris is the capital of France.", "the quick brown fox", "Berlin Tokyo London"]
THREAD_COUNTS = (1, 2, 1)  # 1 -> 2 and 2 -> 1: both directions of a change


def _outputs(llm, task: str) -> list:
    if task == "score":
        return [o.outputs.score for o in llm.score(QUERY, DOCS)]
    if task == "classify":
        return [o.outputs.probs for o in llm.classify([QUERY] + DOCS)]
    return [o.outputs.embedding for o in llm.embed([QUERY] + DOCS)]


def _skinny_layers(llm) -> int:
    """How many projections of the engine's model run few rows on the C++ kernel."""
    model = llm.llm_engine.runner.model
    return sum(1 for m in model.modules() if getattr(m, "skinny", None) is not None)


def _gemms(llm) -> list[str]:
    """The GEMMs the engine's float32 projections are bound to (layers.linear names)."""
    from vllm.model_executor.layers.linear import Linear
    model = llm.llm_engine.runner.model
    return sorted({m.gemm.name for m in model.modules() if isinstance(m, Linear)})


def run(model_dir: str, task: str) -> dict:
    """{"built": outputs of each engine right after it was built at THREAD_COUNTS[i],
    "rerun": each engine's outputs again at the caller's thread count, "skinny": each
    engine's count of kernel-bound projections, "gemms": the first engine's GEMMs,
    "kernel": the kernel's status}."""
    from vllm import LLM
    from vllm._kernels.cpu_kernels import kernel_status
    before = torch.get_num_threads()
    engines, built = [], []
    try:
        for threads in THREAD_COUNTS:
            torch.set_num_threads(threads)
            engines.append(LLM(model_dir))
            built.append(_outputs(engines[-1], task))
    finally:
        torch.set_num_threads(before)
    return {"built": built, "rerun": [_outputs(llm, task) for llm in engines],
            "skinny": [_skinny_layers(llm) for llm in engines], "gemms": _gemms(engines[0]),
            "kernel": kernel_status("skinny_gemm")}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2])))
