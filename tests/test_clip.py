"""CLIP as a dual encoder (issue 24 part 1): text prompts through the text tower, image
prompts through the vision tower, each against Transformers' get_text_features /
get_image_features; upstream's offline and online request shapes."""
from __future__ import annotations

import pytest
import torch

import mm_models as mm
from servers import _model_server
from test_server import _ok

TEXTS = mm.TEXTS


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> str:
    return str(mm.make_clip(tmp_path_factory.mktemp("clip") / "model"))


@pytest.fixture(scope="module")
def llm(shared_llm, clip_dir):
    return shared_llm(clip_dir)


@pytest.fixture(scope="module")
def reference(clip_dir):
    return mm.references(clip_dir)


@pytest.fixture(scope="module")
def server(clip_dir):
    yield from _model_server(clip_dir)


def image_prompt(img) -> dict:
    return {"prompt": "", "multi_modal_data": {"image": img}}


def _vec(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float32)


def _cos(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(_vec(a), _vec(b), dim=0))


def image_message(url: str, text: str = "") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}}]
    if text:
        parts.append({"type": "text", "text": text})
    return [{"role": "user", "content": parts}]


def png_url(seed: int) -> str:
    return mm.data_url(mm.encoded(mm.picture(seed)))


def test_text_and_image_prompts_mixed_in_one_call_match_transformers(shared_llm, clip_dir,
                                                                     reference,
                                                                     attention_backend):
    llm = shared_llm(clip_dir)
    assert llm.llm_engine.runner.attention_backend == attention_backend
    outs = llm.embed([TEXTS[0], image_prompt(mm.picture(1)), TEXTS[1],
                      image_prompt(mm.picture(2))], use_tqdm=False)
    want = [reference["text"][0], reference["image"][0], reference["text"][1],
            reference["image"][1]]
    for out, ref in zip(outs, want):
        assert _cos(out.outputs.embedding, ref) >= 0.9999
        assert torch.allclose(_vec(out.outputs.embedding), ref, atol=1e-5)
    # an image stands as one placeholder per position of its vision tower: 4x4 patches + CLS
    assert len(outs[1].prompt_token_ids) == 17


def test_caching_and_chunking_stay_off(llm):
    config = llm.llm_engine.vllm_config
    assert config.cache_config.enable_prefix_caching is False
    assert config.scheduler_config.enable_chunked_prefill is False


def test_text_with_an_image_is_refused(llm):
    with pytest.raises(ValueError, match="text-only or image-only"):
        llm.embed({"prompt": "a cat", "multi_modal_data": {"image": mm.picture(1)}})


def test_more_images_than_the_limit_are_refused(llm):
    with pytest.raises(ValueError, match="At most 1 image"):
        llm.embed(image_prompt([mm.picture(1), mm.picture(2)]), use_tqdm=False)


def test_different_images_in_one_call_are_never_merged(llm, reference):
    """The prompts' placeholder ids are equal; the images' content hashes keep them apart
    (and the same image twice is computed once, with equal answers)."""
    outs = llm.embed([image_prompt(mm.picture(2)), image_prompt(mm.picture(1)),
                      image_prompt(mm.picture(2))], use_tqdm=False)
    assert _cos(outs[0].outputs.embedding, reference["image"][1]) >= 0.9999
    assert _cos(outs[1].outputs.embedding, reference["image"][0]) >= 0.9999
    assert outs[0].outputs.embedding == outs[2].outputs.embedding


def test_offline_score_text_against_images_is_the_cosine(llm, reference):
    outs = llm.score(TEXTS[0], [image_prompt(mm.picture(1)), TEXTS[1],
                                image_prompt(mm.picture(2))], use_tqdm=False)
    want = [float(reference["text"][0] @ v) for v in
            (reference["image"][0], reference["text"][1], reference["image"][1])]
    assert [o.outputs.score for o in outs] == pytest.approx(want, abs=1e-4)


def test_limit_zero_takes_no_images(clip_dir):
    from vllm import LLM
    llm = LLM(clip_dir, limit_mm_per_prompt={"image": 0})
    with pytest.raises(ValueError, match="At most 0 image"):
        llm.embed(image_prompt(mm.picture(1)), use_tqdm=False)
    with pytest.raises(ValueError, match="one image per prompt"):
        LLM(clip_dir, limit_mm_per_prompt={"image": 2})


# ----- online ------------------------------------------------------------------------
@pytest.mark.parametrize("route,key", [("/v1/embeddings", "embedding"), ("/pooling", "data")])
def test_messages_with_an_image_equal_the_offline_image_prompt(server, reference, route, key):
    out = _ok(server.post(route, {"messages": image_message(png_url(1))}))
    assert _cos(out["data"][0][key], reference["image"][0]) >= 0.9999
    assert out["usage"]["prompt_tokens"] == 17


def test_text_message_equals_the_text_input(server):
    msg = [{"role": "user", "content": [{"type": "text", "text": TEXTS[0]}]}]
    by_message = _ok(server.post("/v1/embeddings", {"messages": msg}))["data"][0]["embedding"]
    by_input = _ok(server.post("/v1/embeddings", {"input": TEXTS[0]}))["data"][0]["embedding"]
    assert _cos(by_message, by_input) >= 0.99999


def test_text_and_image_in_one_message_is_a_400(server):
    r = server.post("/v1/embeddings", {"messages": image_message(png_url(1), "a cat")})
    assert r.status_code == 400
    assert "text-only or image-only" in r.json()["error"]["message"]


def test_input_and_messages_together_is_a_400(server):
    r = server.post("/v1/embeddings", {"input": "x", "messages": image_message(png_url(1))})
    assert r.status_code == 400


def test_rerank_image_documents_score_by_cosine(server, reference):
    docs = [{"content": [{"type": "image_url", "image_url": {"url": png_url(1)}}]},
            TEXTS[1], {"content": [{"type": "image_url", "image_url": {"url": png_url(2)}}]}]
    out = _ok(server.post("/rerank", {"query": TEXTS[0], "documents": docs}))
    want = [float(reference["text"][0] @ v) for v in
            (reference["image"][0], reference["text"][1], reference["image"][1])]
    got = {r["index"]: r["relevance_score"] for r in out["results"]}
    assert got == pytest.approx(dict(enumerate(want)), abs=1e-4)
    by_index = {r["index"]: r["document"] for r in out["results"]}
    assert by_index[1] == {"text": TEXTS[1], "multi_modal": None}
    assert by_index[0]["multi_modal"] == docs[0] and by_index[0]["text"] is None


def test_score_text_against_image_items(server, reference):
    item = {"content": [{"type": "image_url", "image_url": {"url": png_url(2)}}]}
    out = _ok(server.post("/score", {"text_1": TEXTS[1], "text_2": [item, TEXTS[0]]}))
    want = [float(reference["text"][1] @ reference["image"][1]),
            float(reference["text"][1] @ reference["text"][0])]
    assert [d["score"] for d in out["data"]] == pytest.approx(want, abs=1e-4)
