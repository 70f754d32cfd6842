"""The checks and timings of gpu_check.py (see its docstring); imported after vllm."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import pathlib
import random
import tempfile
import traceback
from typing import Callable

import torch

import model_factory as mf
from common import (block_linear_params, interleave, make_texts, median, minilm_dir,
                    model_flops)
from vllm import LLM

PEAK_BF16 = 790e12
TOL = {"float32": {"cos": 0.9999, "prob": 1e-4, "same_cos": 0.99999, "same_prob": 1e-5},
       "bfloat16": {"cos": 0.99, "prob": 2e-2, "same_cos": 0.999, "same_prob": 1e-2}}
# checkpoint -> (task, pooling, bidirectional reference)
PARITY = {"bert_embed_dir": ("embed", "CLS", False), "roberta_embed_dir": ("embed", "CLS", False),
          "qwen2_embed_dir": ("embed", "LAST", False), "qwen3_embed_dir": ("embed", "LAST", False),
          "llama_embed_dir": ("embed", "LAST", False), "qwen2_bidir_dir": ("embed", "LAST", True),
          "bert_cls3_dir": ("classify", None, False), "xlmr_cls_dir": ("classify", None, False),
          "qwen3_cls_dir": ("classify", None, False), "llama_cls_dir": ("classify", None, False)}
QUICK_PARITY = ("qwen3_cls_dir",)  # + MiniLM (BERT) vs sentence-transformers
TRITON = "TRITON_ATTN"
# the causal families (whose cache readers TRITON_ATTN reads in place), and one decoder
# made bidirectional, so the kernel's non-causal variant compiles and runs on the GPU too
TRITON_PARITY = ("qwen2_embed_dir", "qwen3_embed_dir", "llama_embed_dir", "qwen3_cls_dir",
                 "llama_cls_dir", "qwen2_bidir_dir")
# report key -> backend forced in a second pass over the causal families (the default pass
# runs what the platform picks: on CUDA TRITON_ATTN for cache readers, FLASH_ATTN otherwise)
BACKEND_PASSES = (("triton_attn", TRITON), ("flash_attn", "FLASH_ATTN"))
_REFERENCES: dict = {}   # checkpoint name -> (texts, transformers outputs), for both passes


def machine(device: str) -> dict:
    info = {"torch": torch.__version__}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    with contextlib.suppress(ImportError):
        import triton
        info["triton"] = triton.__version__
    return info


@contextlib.contextmanager
def workdir():
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        yield pathlib.Path(tmp)


def _free(llm) -> None:
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _reference(path: str, task: str, pooling, bidir: bool, ids: list[int]) -> torch.Tensor:
    if task == "classify":
        return mf.probs_from_logits(mf.hf_seqcls_logits(path, ids))
    return mf.hf_embedding(path, ids, pooling, normalize=True, bidirectional=bidir)


def _vectors(llm, task: str, prompts) -> list[torch.Tensor]:
    outs = getattr(llm, task)(prompts, use_tqdm=False)
    return [torch.tensor(o.outputs.probs if task == "classify" else o.outputs.embedding)
            for o in outs]


def _agreement(task: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Embeddings: the lowest cosine; probabilities: the largest absolute difference."""
    if task == "classify":
        return max(mf.max_abs_diff(g, w) for g, w in zip(got, want))
    return min(mf.cosine(g, w) for g, w in zip(got, want))


def _ok(task: str, value: float, tol: dict, same: bool = False) -> bool:
    prefix = "same_" if same else ""
    return value <= tol[prefix + "prob"] if task == "classify" else value >= tol[prefix + "cos"]


def guarded(results: list, name: str, task: str, check: Callable[[], list]) -> None:
    """Append `check()`'s results, or one failed result holding the traceback: a check
    that raises (a first run on a new device) leaves the others to run."""
    try:
        results.extend(check())
    except Exception:  # noqa: BLE001 - recorded and reported, never hidden
        error = traceback.format_exc()
        print(f"FAIL {name}:\n{error}", flush=True)
        results.append({"name": name, "task": task, "value": float("nan"), "ok": False,
                        "error": error[-4000:]})


def parity(work: pathlib.Path, device: str, dtypes: list[str], quick: bool) -> list[dict]:
    """Every family vs transformers (float32, CPU), on `device` in each dtype."""
    results: list[dict] = []
    for name in (QUICK_PARITY if quick else PARITY):
        guarded(results, f"parity {name}", PARITY[name][0],
                lambda name=name: _family_parity(work, device, dtypes, name))
    guarded(results, "parity minilm", "embed", lambda: [_minilm_parity(device, dtypes)])
    return results


def _family_parity(work: pathlib.Path, device: str, dtypes: list[str], name: str,
                   suffix: str = "") -> list:
    task, pooling, bidir = PARITY[name]
    path = str(mf.build(name, work))
    if name not in _REFERENCES:
        tok = mf.hf_tokenizer(path)
        texts = mf.mixed_prompts(tok)
        _REFERENCES[name] = texts, [_reference(path, task, pooling, bidir,
                                               list(tok(t)["input_ids"])) for t in texts]
    texts, want = _REFERENCES[name]
    results = []
    for dtype in dtypes:
        llm = LLM(path, device=device, dtype=dtype)
        value = _agreement(task, _vectors(llm, task, texts), want)
        results.append({"name": f"parity {name} {dtype}{suffix}", "task": task, "value": value,
                        "backend": llm.llm_engine.runner.attention_backend,
                        "ok": _ok(task, value, TOL[dtype])})
        _free(llm)
    return results


def _minilm_parity(device: str, dtypes: list[str]) -> dict:
    from sentence_transformers import SentenceTransformer
    texts = make_texts(16, 8, 200, seed=3)
    st = SentenceTransformer(str(minilm_dir()), device="cpu")
    want = [torch.tensor(v) for v in st.encode(texts, batch_size=16)]
    llm = LLM(str(minilm_dir()), device=device, dtype=dtypes[0])
    value = _agreement("embed", _vectors(llm, "embed", texts), want)
    _free(llm)
    return {"name": f"parity minilm vs sentence-transformers {dtypes[0]}", "task": "embed",
            "value": value, "ok": _ok("embed", value, TOL[dtypes[0]])}


def _shared_prefix_prompts(lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(lo, hi) for _ in range(100)]
    prompts = [prefix + [rng.randrange(lo, hi) for _ in range(rng.randrange(5, 120))]
               for _ in range(10)]
    prompts.append(list(prompts[1]))  # an exact duplicate
    return prompts


def exactness(work: pathlib.Path, device: str, dtypes: list[str], quick: bool) -> list[dict]:
    """Prefix caching + chunked prefill on vs off: the same numbers, real cache hits."""
    results: list[dict] = []
    cases = (("qwen3_embed_dir", "embed"), ("qwen3_cls_dir", "classify"))
    for name, task in cases[1:] if quick else cases:
        guarded(results, f"exactness {name}", task,
                lambda name=name, task=task: _exactness(work, device, dtypes, name, task))
    return results


def _exactness(work: pathlib.Path, device: str, dtypes: list[str], name: str,
               task: str, suffix: str = "") -> list[dict]:
    results = []
    path = str(mf.build(name, work))
    prompts = [{"prompt_token_ids": p} for p in _shared_prefix_prompts(4, 480)]
    for dtype in dtypes:
        on = LLM(path, device=device, dtype=dtype, block_size=16,
                 max_num_batched_tokens=32)
        off = LLM(path, device=device, dtype=dtype, enable_prefix_caching=False,
                  enable_chunked_prefill=False)
        ref = _vectors(off, task, prompts)
        first = _vectors(on, task, prompts)
        outs = getattr(on, task)(prompts, use_tqdm=False)
        second = [torch.tensor(o.outputs.probs if task == "classify"
                               else o.outputs.embedding) for o in outs]
        cached = sum(o.num_cached_tokens for o in outs)
        value = _agreement(task, first + second, ref + ref)
        results.append({"name": f"exactness {name} {dtype}{suffix}", "task": task,
                        "value": value,
                        "cached_tokens_second_pass": cached,
                        "backend": on.llm_engine.runner.attention_backend,
                        "ok": cached > 0 and _ok(task, value, TOL[dtype], same=True)})
        _free(on)
        _free(off)
    return results


@contextlib.contextmanager
def attention_backend(name: str):
    """VLLM_ATTENTION_BACKEND=name while the block runs: `LLM` reads it (through vllm.envs)
    when it builds the model, so every engine made inside runs on `name`."""
    old = os.environ.get("VLLM_ATTENTION_BACKEND")
    os.environ["VLLM_ATTENTION_BACKEND"] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_ATTENTION_BACKEND")
        else:
            os.environ["VLLM_ATTENTION_BACKEND"] = old


def backend_unavailable(device: str, backend: str, dtype: str) -> str:
    """Why `backend` cannot run `dtype` on `device` ('' where it can), as the engine would
    refuse it at start-up (TRITON_ATTN on the CPU: without TRITON_INTERPRET=1)."""
    from vllm.platforms import platform_for
    return platform_for(device).backend_unavailable(backend, getattr(torch, dtype),
                                                    [32, 128]) or ""


def backend_pass(work: pathlib.Path, device: str, dtypes: list[str], quick: bool,
                 repeats: int, timing_dtype: str, backend: str = TRITON) -> dict:
    """The causal families' parity, the exactness cases and the prefix-rerank timing again
    with VLLM_ATTENTION_BACKEND=backend, in the dtypes it runs here (FLASH_ATTN: not
    float32); {"skipped": why} where it runs none of them."""
    runnable = [d for d in dtypes if not backend_unavailable(device, backend, d)]
    if not runnable:
        why_not = backend_unavailable(device, backend, dtypes[0])
        print(f"skip {backend}: {why_not}", flush=True)
        return {"skipped": why_not}
    dtypes, why_not = runnable, backend_unavailable(device, backend, timing_dtype)
    result: dict = {"parity": [], "exactness": []}
    suffix = f" {backend}"
    with attention_backend(backend):
        for name in (QUICK_PARITY if quick else TRITON_PARITY):
            guarded(result["parity"], f"parity {name}{suffix}", PARITY[name][0],
                    lambda name=name: _family_parity(work, device, dtypes, name, suffix))
        cases = (("qwen3_embed_dir", "embed"), ("qwen3_cls_dir", "classify"))
        for name, task in cases[1:] if quick else cases:
            guarded(result["exactness"], f"exactness {name}{suffix}", task,
                    lambda name=name, task=task: _exactness(work, device, dtypes, name, task,
                                                            suffix))
        timing: list = [{"skipped": why_not}] if why_not else []
        if not why_not:
            guarded(timing, "prefix_rerank" + suffix, "timing", lambda: [time_prefix_rerank(
                work, device, quick, repeats, timing_dtype)])
        result["prefix_rerank"] = timing[0]
    return result


def backend_failures(result: dict, backend: str = TRITON) -> list[str]:
    if "skipped" in result:
        return []
    failed = [c["name"] for c in result["parity"] + result["exactness"] if not c["ok"]]
    return failed + ([f"prefix_rerank {backend}"] if "error" in result["prefix_rerank"]
                     else [])


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_minilm(device: str, quick: bool, repeats: int, dtype: str) -> dict:
    """This engine vs sentence-transformers, MiniLM, mixed texts, both in `dtype`."""
    from sentence_transformers import SentenceTransformer
    texts = make_texts(8 if quick else 512, 8, 200)
    path = str(minilm_dir())
    llm = LLM(path, device=device, dtype=dtype)
    st = SentenceTransformer(path, device=device).to(getattr(torch, dtype))
    runs = {"engine": lambda: (llm.embed(texts, use_tqdm=False), _sync(device)),
            "sentence_transformers": lambda: (st.encode(texts, batch_size=32), _sync(device))}
    for fn in runs.values():
        fn()  # warm-up
    times = interleave(runs, repeats)
    tok = llm.get_tokenizer()
    lengths = [min(256, len(tok(t)["input_ids"])) for t in texts]
    bert = st[0].auto_model
    flops = model_flops(lengths, block_linear_params(bert.encoder), bert.config.num_hidden_layers,
                        bert.config.hidden_size)
    med = {k: median(v) for k, v in times.items()}
    _free(llm)
    return {"dtype": dtype, "texts": len(texts), "tokens": sum(lengths), "seconds": times,
            "texts_per_s": {k: len(texts) / t for k, t in med.items()},
            "speedup": med["sentence_transformers"] / med["engine"], "goal": 1.5,
            "mfu": {k: flops / t / PEAK_BF16 for k, t in med.items()}}


def _qwen3_classifier(path: pathlib.Path, quick: bool) -> pathlib.Path:
    """Qwen3-0.6B's shapes (tiny with quick), random weights, one label, bfloat16."""
    from transformers import Qwen3Config, Qwen3ForSequenceClassification
    shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, intermediate_size=128) if quick else \
        dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, intermediate_size=3072)
    cfg = Qwen3Config(vocab_size=151936 if not quick else 32000, max_position_embeddings=4096,
                      num_labels=1, pad_token_id=0, tie_word_embeddings=False, **shape)
    torch.manual_seed(0)
    model = Qwen3ForSequenceClassification(cfg).to(torch.bfloat16).eval()
    model.save_pretrained(path)
    mf.save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    tok_config = path / "tokenizer_config.json"  # the model's 4096 positions, not BERT's 512
    tok_config.write_text(json.dumps({**json.loads(tok_config.read_text()),
                                      "model_max_length": 4096}))
    return path


def time_prefix_rerank(work: pathlib.Path, device: str, quick: bool, repeats: int,
                       dtype: str) -> dict:
    """Shared-prefix reranking, prefix cache on vs off (fresh cache every run)."""
    n, prefix_len, doc_len = (8, 48, 8) if quick else (256, 800, 64)
    path = work / "qwen3_0.6b_shape"
    if not (path / "config.json").exists():   # built once for both backends' timings
        _qwen3_classifier(path, quick)
    rng = random.Random(0)
    prefix = [rng.randrange(1000, 30000) for _ in range(prefix_len)]
    prompts = [{"prompt_token_ids": prefix + [rng.randrange(1000, 30000) for _ in range(doc_len)]}
               for _ in range(n)]
    llms = {"cache_on": LLM(str(path), device=device, dtype=dtype,
                            enable_prefix_caching=True),
            "cache_off": LLM(str(path), device=device, dtype=dtype,
                             enable_prefix_caching=False)}

    def run(name):
        def go():
            llms[name].reset_prefix_cache()
            llms[name].classify(prompts, use_tqdm=False)
            _sync(device)
        return go
    for name in llms:
        run(name)()
    a = [o.outputs.probs[0] for o in llms["cache_on"].classify(prompts, use_tqdm=False)]
    b = [o.outputs.probs[0] for o in llms["cache_off"].classify(prompts, use_tqdm=False)]
    times = interleave({k: run(k) for k in llms}, repeats)
    med = {k: median(v) for k, v in times.items()}
    backend = llms["cache_on"].llm_engine.runner.attention_backend
    block = llms["cache_on"].llm_engine.vllm_config.cache_config.block_size
    total = n * (prefix_len + doc_len)
    ideal = total / (total - (n - 1) * (prefix_len // block) * block)
    model = llms["cache_off"].llm_engine.runner.model.model
    cfg = model.config
    flops = model_flops([prefix_len + doc_len] * n, _linear_params(model),
                        cfg.num_hidden_layers, cfg.num_attention_heads * cfg.head_dim, causal=True)
    speedup = med["cache_off"] / med["cache_on"]
    for name in list(llms):   # before another backend's pair is built
        _free(llms.pop(name))
    del model
    return {"dtype": dtype, "prompts": n, "prefix_tokens": prefix_len, "doc_tokens": doc_len,
            "block_size": block,
            "seconds": times, "speedup": speedup, "ideal_speedup": ideal,
            "fraction_of_ideal": speedup / ideal, "goal_fraction": 0.8,
            "max_abs_prob_diff": max(abs(x - y) for x, y in zip(a, b)),
            "backend": backend, "mfu_uncached": flops / med["cache_off"] / PEAK_BF16}


def _linear_params(backbone: torch.nn.Module) -> int:
    """Weights of the transformer blocks' projections (packed layers keep a meta shape)."""
    return sum(m.weight.numel() for m in backbone.layers.modules()
               if isinstance(m, torch.nn.Linear))


def print_summary(report: dict) -> None:
    for check in report["parity"] + report["exactness"]:
        kind = "max |diff|" if check["task"] == "classify" else "min cos"
        print(f"{'ok  ' if check['ok'] else 'FAIL'} {check['name']:<52} {kind} "
              f"{check['value']:.6f} {check.get('backend', '')}")
    for name in ("minilm_embed", "prefix_rerank"):
        if "error" in report[name]:
            print(f"FAIL {name}: {report[name]['error'].strip().splitlines()[-1]}")
    m = report["minilm_embed"]
    if "error" not in m:
        print(f"MiniLM {m['dtype']}, {m['texts']} texts: engine "
              f"{m['texts_per_s']['engine']:.0f}/s, sentence-transformers "
              f"{m['texts_per_s']['sentence_transformers']:.0f}/s, {m['speedup']:.2f}x "
              f"(goal 1.5x); MFU engine {100 * m['mfu']['engine']:.2f}%")
    p = report["prefix_rerank"]
    if "error" not in p:
        print(f"Prefix rerank: cached {p['speedup']:.2f}x vs uncached, ideal "
              f"{p['ideal_speedup']:.2f}x = {100 * p['fraction_of_ideal']:.0f}% of ideal "
              f"(goal 80%); uncached MFU {100 * p['mfu_uncached']:.2f}%; backend {p['backend']}")
    for key, backend in BACKEND_PASSES:
        _print_backend(report.get(key, {}), report["prefix_rerank"], backend)
    print(f"total {report['seconds']:.0f} s; failed: {report['failed'] or 'none'}")


def _print_backend(result: dict, default: dict, backend: str) -> None:
    if "skipped" in result:
        print(f"{backend}: skipped ({result['skipped']})")
        return
    for check in result.get("parity", []) + result.get("exactness", []):
        kind = "max |diff|" if check["task"] == "classify" else "min cos"
        print(f"{'ok  ' if check['ok'] else 'FAIL'} {check['name']:<52} {kind} "
              f"{check['value']:.6f} {check.get('backend', '')}")
    p = result.get("prefix_rerank", {})
    if "error" in p:
        print(f"FAIL prefix_rerank {backend}: {p['error'].strip().splitlines()[-1]}")
    elif "skipped" in p:
        print(f"Prefix rerank {backend}: skipped ({p['skipped']})")
    elif p:
        cached = {b["backend"]: median(b["seconds"]["cache_on"]) for b in (default, p)
                  if "seconds" in b}
        print(f"Prefix rerank {backend}: cached {p['speedup']:.2f}x vs uncached "
              f"({100 * p['fraction_of_ideal']:.0f}% of ideal); cached-run medians: " +
              ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in cached.items()))
