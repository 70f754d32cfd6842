"""Qwen2-VL as an embedding model (issue 24 part 2): images replace their placeholder tokens
with the vision tower's output, multimodal rotary positions, LAST pooling on the causal LM
with prefix caching and chunked prefill on; against Transformers' last hidden state."""
from __future__ import annotations

import pytest
import torch

import mm_models as mm
from vllm import LLM

LONG = "the quick brown fox jumps over the lazy dog in the city near the river " * 2


@pytest.fixture(scope="module")
def qwen2_vl_dir(tmp_path_factory) -> str:
    return str(mm.make_qwen2_vl(tmp_path_factory.mktemp("qwen2_vl") / "model"))


def prompt(text: str, *images, before: str = "") -> dict:
    return {"prompt": mm.vlm_text(text, len(images), before),
            "multi_modal_data": {"image": list(images)}}


def reference(path, text: str, *images, before: str = "") -> torch.Tensor:
    return torch.nn.functional.normalize(
        mm.hf_vlm_last_hidden(path, mm.vlm_text(text, len(images), before), images), dim=0)


def _cos(out, ref) -> float:
    return float(torch.nn.functional.cosine_similarity(
        torch.as_tensor(out.outputs.embedding), ref, dim=0))


@pytest.fixture(scope="module")
def cases(qwen2_vl_dir):
    specs = [("a cat", (mm.picture(1),)), ("a cat", ()), ("two", (mm.picture(2), mm.picture(1))),
             (LONG, (mm.picture(3),))]
    return [(prompt(t, *imgs) if imgs else mm.vlm_text(t, 0), reference(qwen2_vl_dir, t, *imgs))
            for t, imgs in specs]


@pytest.mark.parametrize("settings", [{}, {"enable_prefix_caching": False,
                                           "enable_chunked_prefill": False},
                                      {"max_num_batched_tokens": 16}],
                         ids=["default", "off", "chunks-of-16"])
def test_matches_transformers(qwen2_vl_dir, cases, settings, attention_backend):
    llm = LLM(qwen2_vl_dir, limit_mm_per_prompt={"image": 2}, **settings)
    config = llm.llm_engine.vllm_config
    assert config.cache_config.enable_prefix_caching is settings.get("enable_prefix_caching",
                                                                      True)
    outs = llm.embed([p for p, _ in cases], use_tqdm=False)
    for out, (_, ref) in zip(outs, cases):
        assert _cos(out, ref) >= 0.9999
    # an image stands as its merged patches: 48x40 -> a 10x12 patch grid -> 30 tokens
    assert outs[0].prompt_token_ids.count(mm.VISION_IDS(qwen2_vl_dir)) == 30


def test_image_aware_prefix_cache(qwen2_vl_dir, cases):
    """A block's hash covers the images whose tokens fall in it: the same image is a hit,
    another image behind the same text shares only the blocks before it."""
    llm = LLM(qwen2_vl_dir, block_size=16)
    first = llm.embed(prompt("x", mm.picture(3), before=LONG), use_tqdm=False)[0]
    again = llm.embed(prompt("x", mm.picture(3), before=LONG), use_tqdm=False)[0]
    other = llm.embed(prompt("x", mm.picture(4), before=LONG), use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == (len(again.prompt_token_ids) - 1) // 16 * 16
    assert again.outputs.embedding == pytest.approx(first.outputs.embedding, abs=1e-6)
    image_start = other.prompt_token_ids.index(mm.VISION_IDS(qwen2_vl_dir))
    assert other.num_cached_tokens == image_start // 16 * 16 > 0
    assert _cos(other, reference(qwen2_vl_dir, "x", mm.picture(4), before=LONG)) >= 0.9999


def test_a_shared_image_runs_the_vision_tower_once(qwen2_vl_dir):
    """The rerank shape: one document image behind several queries; and an image split
    across chunks is encoded once for all its chunks."""
    llm = LLM(qwen2_vl_dir, max_num_batched_tokens=16)
    cache = llm.llm_engine.runner.model.model.encoder_cache
    before = cache.misses
    outs = llm.embed([prompt(q, mm.picture(5)) for q in ("a cat", "a dog", "a bird")],
                     use_tqdm=False)
    assert cache.misses - before == 1
    for q, out in zip(("a cat", "a dog", "a bird"), outs):
        assert _cos(out, reference(qwen2_vl_dir, q, mm.picture(5))) >= 0.9999


def test_placeholders_must_match_the_images(qwen2_vl_dir):
    llm = LLM(qwen2_vl_dir, limit_mm_per_prompt={"image": 2})
    with pytest.raises(ValueError, match="1 image placeholder"):
        llm.embed({"prompt": mm.vlm_text("x", 1),
                   "multi_modal_data": {"image": [mm.picture(1), mm.picture(2)]}})
    with pytest.raises(ValueError, match="At most 2 image"):
        llm.embed(prompt("x", mm.picture(1), mm.picture(2), mm.picture(3)))
