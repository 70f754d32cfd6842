"""SigLIP as a dual encoder (issue 24 part 1): the bidirectional text tower with its head on
the last token, the vision tower with its attention-pooling head, against Transformers'
get_text_features / get_image_features; offline and online shapes as for CLIP."""
from __future__ import annotations

import pytest

import mm_models as mm
from mm_models import TEXTS
from servers import _model_server
from test_clip import _cos, image_message, image_prompt, png_url
from test_server import _ok


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory) -> str:
    return str(mm.make_siglip(tmp_path_factory.mktemp("siglip") / "model"))


@pytest.fixture(scope="module")
def reference(siglip_dir):
    return mm.references(siglip_dir)


@pytest.fixture(scope="module")
def server(siglip_dir):
    yield from _model_server(siglip_dir)


def test_text_and_image_prompts_match_transformers(shared_llm, siglip_dir, reference,
                                                   attention_backend):
    llm = shared_llm(siglip_dir)
    assert llm.llm_engine.runner.attention_backend == attention_backend
    outs = llm.embed([image_prompt(mm.picture(2)), TEXTS[0], image_prompt(mm.picture(1)),
                      TEXTS[1]], use_tqdm=False)
    want = [reference["image"][1], reference["text"][0], reference["image"][0],
            reference["text"][1]]
    for out, ref in zip(outs, want):
        assert _cos(out.outputs.embedding, ref) >= 0.9999
    assert len(outs[0].prompt_token_ids) == 16  # 4x4 patches, no class token


def test_engine_tokenizes_as_siglip_processor(shared_llm, siglip_dir):
    """The checkpoint's real SiglipTokenizer (SentencePiece): the engine's ids are
    SiglipProcessor's, including its canonicalisation (case, punctuation) and <unk>."""
    from transformers import AutoProcessor
    proc = AutoProcessor.from_pretrained(siglip_dir)
    assert type(proc).__name__ == "SiglipProcessor"
    assert type(proc.tokenizer).__name__ == "SiglipTokenizer"
    texts = TEXTS + ["Hello, World! A RED car.", "zebra quokka"]
    outs = shared_llm(siglip_dir).embed(texts, use_tqdm=False)
    want = proc(text=texts)["input_ids"]
    assert [o.prompt_token_ids for o in outs] == want
    assert proc.tokenizer.unk_token_id in want[3]
    assert all(ids[-1] == proc.tokenizer.eos_token_id for ids in want)


def test_text_with_an_image_is_refused(shared_llm, siglip_dir):
    with pytest.raises(ValueError, match="text-only or image-only"):
        shared_llm(siglip_dir).embed({"prompt": "x", "multi_modal_data": {
            "image": mm.picture(1)}})


def test_online_image_message_and_rerank(server, reference):
    out = _ok(server.post("/v1/embeddings", {"messages": image_message(png_url(2))}))
    assert _cos(out["data"][0]["embedding"], reference["image"][1]) >= 0.9999
    doc = {"content": [{"type": "image_url", "image_url": {"url": png_url(1)}}]}
    ranked = _ok(server.post("/rerank", {"query": TEXTS[1], "documents": [TEXTS[0], doc]}))
    got = {r["index"]: r["relevance_score"] for r in ranked["results"]}
    assert got[1] == pytest.approx(float(reference["text"][1] @ reference["image"][0]),
                                   abs=1e-4)
    assert got[0] == pytest.approx(float(reference["text"][1] @ reference["text"][0]),
                                   abs=1e-4)


# ----- SigLIP2: the vision tower at native aspect ratio ------------------------------------
@pytest.fixture(scope="module")
def siglip2_dir(tmp_path_factory) -> str:
    return str(mm.make_siglip2(tmp_path_factory.mktemp("siglip2") / "model"))


def test_siglip2_matches_transformers_at_any_aspect_ratio(shared_llm, siglip2_dir,
                                                          attention_backend):
    wide, tall = mm.picture(1), mm.picture(2, (20, 60))
    texts, images = mm.hf_features(siglip2_dir, TEXTS[:1], [wide, tall])
    outs = shared_llm(siglip2_dir).embed([image_prompt(tall), TEXTS[0], image_prompt(wide)],
                                         use_tqdm=False)
    for out, ref in zip(outs, [images[1], texts[0], images[0]]):
        assert _cos(out.outputs.embedding, ref) >= 0.9999
    # each image counts its own patches (at most 16 here): 3x4 for the tall one
    assert [len(o.prompt_token_ids) for o in (outs[0], outs[2])] == [12, 16]
