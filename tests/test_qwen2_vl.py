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


# ----- a Qwen2-VL reranker (jina-reranker-m0's layout) ---------------------------------------
@pytest.fixture(scope="module")
def reranker_dir(qwen2_vl_dir, tmp_path_factory) -> str:
    return str(mm.make_jina_reranker(tmp_path_factory.mktemp("jina") / "model", qwen2_vl_dir))


def image_item(img) -> dict:
    return {"prompt": "", "multi_modal_data": {"image": img}}


def test_reranker_scores_text_and_image_documents(reranker_dir):
    llm = LLM(reranker_dir)
    docs = [image_item(mm.picture(1)), "a small dog", image_item(mm.picture(2))]
    outs = llm.score("a cat", docs, use_tqdm=False)
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    want = [mm.jina_reference(reranker_dir, "a cat", placeholder, [mm.picture(1)]),
            mm.jina_reference(reranker_dir, "a cat", "a small dog"),
            mm.jina_reference(reranker_dir, "a cat", placeholder, [mm.picture(2)])]
    assert [o.outputs.score for o in outs] == pytest.approx(want, abs=1e-4)


def test_a_document_image_shared_by_queries_is_computed_once(reranker_dir):
    """The rerank shape: the template puts the document first, so its image's encoder
    output and its blocks serve every query."""
    llm = LLM(reranker_dir)
    cache = llm.llm_engine.runner.model.model.encoder_cache
    before = cache.misses
    doc = image_item(mm.picture(6))
    queries = ["a cat", "a dog on a mountain", "blue water"]
    outs = llm.score(queries, [doc] * 3, use_tqdm=False)
    assert cache.misses - before == 1
    assert all(o.num_cached_tokens > 0 for o in outs[1:])
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    want = [mm.jina_reference(reranker_dir, q, placeholder, [mm.picture(6)]) for q in queries]
    assert [o.outputs.score for o in outs] == pytest.approx(want, abs=1e-4)


def test_rerank_route_takes_image_documents(reranker_dir):
    from servers import _model_server
    from test_server import _ok
    server_gen = _model_server(reranker_dir)
    server = next(server_gen)
    try:
        url = mm.data_url(mm.encoded(mm.picture(1)))
        doc = {"content": [{"type": "image_url", "image_url": {"url": url}}]}
        out = _ok(server.post("/rerank", {"query": "a cat", "documents": ["a small dog", doc]}))
        got = {r["index"]: r["relevance_score"] for r in out["results"]}
        placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
        assert got[0] == pytest.approx(mm.jina_reference(reranker_dir, "a cat", "a small dog"),
                                       abs=1e-4)
        assert got[1] == pytest.approx(mm.jina_reference(reranker_dir, "a cat", placeholder,
                                                         [mm.picture(1)]), abs=1e-4)
    finally:
        next(server_gen, None)


def test_embeddings_messages_use_the_chat_template(qwen2_vl_dir):
    from servers import _model_server
    from test_server import _ok
    server_gen = _model_server(qwen2_vl_dir)
    server = next(server_gen)
    try:
        url = mm.data_url(mm.encoded(mm.picture(1)))
        messages = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "a cat"}]}]
        out = _ok(server.post("/v1/embeddings", {"messages": messages,
                                                 "add_generation_prompt": True}))
        text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>a cat<|im_end|>\n" \
            "<|im_start|>assistant\n"
        ref = torch.nn.functional.normalize(
            mm.hf_vlm_last_hidden(qwen2_vl_dir, text, [mm.picture(1)]), dim=0)
        got = torch.as_tensor(out["data"][0]["embedding"])
        assert float(torch.nn.functional.cosine_similarity(got, ref, dim=0)) >= 0.9999
        assert out["usage"]["prompt_tokens"] == len(mm.hf_tokenizer(qwen2_vl_dir)(text)[
            "input_ids"]) - 1 + 30
    finally:
        next(server_gen, None)


def test_encoder_and_processed_image_caches_are_bounded_by_bytes():
    from vllm.multimodal.lru import TensorLRU
    lru = TensorLRU(max_bytes=100)
    for key in "abc":  # 40 bytes each: the third pushes out the first
        lru.get(key, lambda: torch.zeros(10))
    assert lru.misses == 3
    lru.get("c", lambda: torch.ones(10))
    assert lru.misses == 3  # a hit
    assert lru.get("a", lambda: torch.ones(10))[0] == 1 and lru.misses == 4
    assert lru.get("huge", lambda: torch.zeros(1000)).numel() == 1000  # the newest stays
