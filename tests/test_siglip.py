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


# ----- upstream's `padding` ("max_length": SigLIP's fixed 64-token training length) -----
@pytest.fixture(scope="module")
def padded(siglip_dir):
    return mm.hf_padded_text_features(siglip_dir, TEXTS)


def test_offline_padding_max_length_matches_transformers(shared_llm, siglip_dir, padded,
                                                         reference):
    """tokenization_kwargs={"padding": "max_length"}: the processor's padded ids (64, the
    tokenizer's model_max_length and max_model_len) and get_text_features on them, which
    differ from the unpadded embedding."""
    llm = shared_llm(siglip_dir)
    ids, want = padded
    outs = llm.embed(TEXTS, use_tqdm=False, tokenization_kwargs={"padding": "max_length"})
    assert [o.prompt_token_ids for o in outs] == ids
    assert len(ids[0]) == 64 == llm.llm_engine.model_config.max_model_len
    for out, ref, unpadded in zip(outs, want, reference["text"]):
        assert _cos(out.outputs.embedding, ref) >= 0.9999
        assert _cos(out.outputs.embedding, unpadded) < 0.999
    plain = llm.embed(TEXTS[:1], use_tqdm=False, tokenization_kwargs={"padding": "do_not_pad"})
    assert _cos(plain[0].outputs.embedding, reference["text"][0]) >= 0.9999


@pytest.mark.parametrize("kwargs,match", [({"padding": "longest"}, "padding must be one of"),
                                          ({"truncation": True}, "only 'padding'")])
def test_offline_padding_refuses_what_it_cannot_do(shared_llm, siglip_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        shared_llm(siglip_dir).embed(TEXTS, use_tqdm=False, tokenization_kwargs=kwargs)


def test_offline_padding_refuses_an_image_prompt(shared_llm, siglip_dir):
    with pytest.raises(ValueError, match="applies to text prompts"):
        shared_llm(siglip_dir).embed([TEXTS[0], image_prompt(mm.picture(1))], use_tqdm=False,
                                     tokenization_kwargs={"padding": "max_length"})


@pytest.mark.parametrize("route", ["/v1/embeddings", "/pooling"])
def test_online_padding_max_length_matches_transformers(server, padded, route):
    ids, want = padded
    out = _ok(server.post(route, {"input": TEXTS, "padding": "max_length"}))
    for item, ref in zip(out["data"], want):
        got = item["embedding"] if route == "/v1/embeddings" else item["data"]
        assert _cos(got, ref) >= 0.9999
    assert out["usage"]["prompt_tokens"] == 64 * len(TEXTS)


@pytest.mark.parametrize("route,body,match", [
    ("/v1/embeddings", {"input": "a", "padding": "longest"}, "literal_error"),
    ("/v1/embeddings", {"messages": image_message(png_url(1)), "padding": "max_length"},
     "applies to text prompts"),
    ("/rerank", {"query": "a", "documents": ["b"], "padding": "max_length"},
     "not supported"),
])
def test_online_padding_errors_name_the_field(server, route, body, match):
    r = server.post(route, body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "padding", r.text
    assert match in error["message"]


def test_pad_prompts_on_other_tokenizers():
    """Any model pads as upstream does (token type ids with 0); a tokenizer without a pad
    token is an error naming `padding`, never a prompt left unpadded."""
    from types import SimpleNamespace

    from vllm.engine.padding import PaddingError, pad_prompts
    from vllm.engine.prompt_types import TokenizedPrompt
    p = TokenizedPrompt([101, 7, 102], token_type_ids=[0, 0, 0])
    (p,) = pad_prompts([p], "max_length", SimpleNamespace(pad_token_id=0), 5)  # a new prompt
    assert (p.prompt_token_ids, p.token_type_ids) == ([101, 7, 102, 0, 0], [0] * 5)
    with pytest.raises(PaddingError, match="needs a pad token") as err:
        pad_prompts([TokenizedPrompt([5])], "max_length", SimpleNamespace(pad_token_id=None), 4)
    assert err.value.field == "padding"


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
