"""Qwen3-VL as a pooling model (issue 36 item 2): Qwen3-VL-Embedding's LAST-token
embeddings and Qwen3-VL-Reranker's yes/no probability, against Transformers' Qwen3-VL
(deepstack features, interleaved multimodal rotary, the Qwen3 decoder), with the
image-aware prefix cache and chunked prefill on."""
from __future__ import annotations

import pytest
import torch

import mm_models as mm
import qwen3_vl_models as q3
from vllm import LLM

LONG = "the quick brown fox jumps over the lazy dog in the city near the river " * 2
WIDE = (64, 32)  # a second image size: an 8 x 16 patch grid, 32 tokens (48 x 40: 30)


@pytest.fixture(scope="module")
def qwen3_vl_dir(tmp_path_factory) -> str:
    return str(q3.make_qwen3_vl(tmp_path_factory.mktemp("qwen3_vl") / "model"))


def prompt(text: str, *images, before: str = ""):
    if not images:
        return mm.vlm_text(text, 0, before)
    return {"prompt": mm.vlm_text(text, len(images), before),
            "multi_modal_data": {"image": list(images)}}


def reference(path, text: str, *images, before: str = "") -> torch.Tensor:
    return torch.nn.functional.normalize(
        q3.hf_last_hidden(path, mm.vlm_text(text, len(images), before), images), dim=0)


def check(out, ref: torch.Tensor) -> None:
    got = torch.as_tensor(out.outputs.embedding)
    assert float(torch.nn.functional.cosine_similarity(got, ref, dim=0)) >= 0.9999
    assert abs(float(got.norm()) / float(ref.norm()) - 1) <= 1e-3


@pytest.fixture(scope="module")
def cases(qwen3_vl_dir):
    """image + text, text only, image only, two images of two sizes, a long text + image."""
    specs = [("a cat", (mm.picture(1),)), ("a cat", ()), ("", (mm.picture(2),)),
             ("two", (mm.picture(2, WIDE), mm.picture(1))), (LONG, (mm.picture(3),))]
    return [(prompt(t, *imgs), reference(qwen3_vl_dir, t, *imgs)) for t, imgs in specs]


@pytest.mark.parametrize("settings", [{}, {"enable_prefix_caching": False,
                                           "enable_chunked_prefill": False},
                                      {"max_num_batched_tokens": 16}],
                         ids=["default", "off", "chunks-of-16"])
def test_matches_transformers(qwen3_vl_dir, cases, settings, attention_backend):
    llm = LLM(qwen3_vl_dir, limit_mm_per_prompt={"image": 2}, **settings)
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is \
        settings.get("enable_prefix_caching", True)
    outs = llm.embed([p for p, _ in cases], use_tqdm=False)
    for out, (_, ref) in zip(outs, cases):
        check(out, ref)
    pad = mm.VISION_IDS(qwen3_vl_dir)
    assert outs[0].prompt_token_ids.count(pad) == 30
    assert outs[3].prompt_token_ids.count(pad) == 32 + 30


def test_second_pass_is_cached_and_equal(qwen3_vl_dir, cases):
    """Prefix caching is on by default: the same image prompts again hit the cache (the
    blocks before the last token) and give the same embeddings."""
    llm = LLM(qwen3_vl_dir, limit_mm_per_prompt={"image": 2}, block_size=16)
    prompts = [p for p, _ in cases]
    first = llm.embed(prompts, use_tqdm=False)
    again = llm.embed(prompts, use_tqdm=False)
    for a, b in zip(first, again):
        assert b.num_cached_tokens == (len(b.prompt_token_ids) - 1) // 16 * 16
        assert b.outputs.embedding == pytest.approx(a.outputs.embedding, abs=1e-6)
    assert all(b.num_cached_tokens > 0 for b in again if b.prompt_token_ids.count(
        mm.VISION_IDS(qwen3_vl_dir)))
    # another image behind the same text shares only the blocks before the image
    llm.embed(prompt("x", mm.picture(4), before=LONG), use_tqdm=False)
    other = llm.embed(prompt("x", mm.picture(5), before=LONG), use_tqdm=False)[0]
    image_start = other.prompt_token_ids.index(mm.VISION_IDS(qwen3_vl_dir))
    assert other.num_cached_tokens == image_start // 16 * 16 > 0
    check(other, reference(qwen3_vl_dir, "x", mm.picture(5), before=LONG))


def test_chunks_that_split_an_image_equal_the_whole(qwen3_vl_dir, cases):
    """16-token steps split each image (30 or 32 placeholders) and its deepstack rows; the
    vision tower runs once per image for all its chunks."""
    whole = LLM(qwen3_vl_dir, limit_mm_per_prompt={"image": 2}, enable_prefix_caching=False,
                enable_chunked_prefill=False).embed([p for p, _ in cases], use_tqdm=False)
    llm = LLM(qwen3_vl_dir, limit_mm_per_prompt={"image": 2}, max_num_batched_tokens=16,
              enable_prefix_caching=False)
    cache = llm.llm_engine.runner.model.model.encoder_cache
    chunked = llm.embed([p for p, _ in cases], use_tqdm=False)
    for a, b in zip(whole, chunked):
        assert b.outputs.embedding == pytest.approx(a.outputs.embedding, abs=1e-5)
    assert cache.misses == 4  # pictures 1, 2, 2 (wide) and 3


def test_the_older_checkpoint_layout_loads(qwen3_vl_dir, tmp_path):
    """`visual.*` and `model.*` (the decoder) as older checkpoints name them."""
    path = q3.old_layout(qwen3_vl_dir, tmp_path / "old")
    out = LLM(str(path)).embed(prompt("a cat", mm.picture(1)), use_tqdm=False)[0]
    check(out, reference(qwen3_vl_dir, "a cat", mm.picture(1)))


# ----- Qwen3-VL-Reranker: upstream's recipe (Qwen3VLForSequenceClassification + yes/no) ------
def test_reranker_is_p_yes(qwen3_vl_dir):
    llm = LLM(qwen3_vl_dir, hf_overrides=q3.RERANKER_OVERRIDES,
              limit_mm_per_prompt={"image": 2})
    specs = [("a cat", "", (mm.picture(1),)), ("a cat", "a small dog", ()),
             ("two", "pictures", (mm.picture(2, WIDE), mm.picture(6)))]
    texts = [q3.reranker_text(query, doc, len(imgs)) for query, doc, imgs in specs]
    outs = llm.classify([{"prompt": t, "multi_modal_data": {"image": list(imgs)}} if imgs
                         else t for t, (_, _, imgs) in zip(texts, specs)], use_tqdm=False)
    want = [q3.hf_p_yes(qwen3_vl_dir, t, imgs) for t, (_, _, imgs) in zip(texts, specs)]
    assert [o.outputs.probs[0] for o in outs] == pytest.approx(want, abs=1e-4)
    assert max(want) - min(want) > 0.05
    # a text pair through score: the two texts joined (no template given), as classify
    score = llm.score("a cat", "a small dog", use_tqdm=False)[0].outputs.score
    assert score == pytest.approx(q3.hf_p_yes(qwen3_vl_dir, "a cata small dog"), abs=1e-4)


def test_convert_classify_on_the_generation_name(qwen3_vl_dir):
    """The same head through convert="classify" on Qwen3VLForConditionalGeneration."""
    llm = LLM(qwen3_vl_dir, convert="classify", hf_overrides={
        "classifier_from_token": ["no", "yes"], "method": "from_2_way_softmax"})
    text = q3.reranker_text("a cat", "", 1)
    out = llm.classify({"prompt": text, "multi_modal_data": {"image": mm.picture(1)}},
                       use_tqdm=False)[0]
    assert out.outputs.probs[0] == pytest.approx(
        q3.hf_p_yes(qwen3_vl_dir, text, [mm.picture(1)]), abs=1e-4)


def test_names_resolve_natively():
    from test_upstream_names import resolve
    assert resolve("Qwen3VLForConditionalGeneration") == ("vllm", "embed")
    assert resolve("Qwen3VLForConditionalGeneration", "classify") == ("vllm", "classify")
    assert resolve("Qwen3VLForSequenceClassification") == ("vllm", "classify")
