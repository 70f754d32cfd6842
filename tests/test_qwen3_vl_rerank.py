"""Qwen3-VL-Reranker scoring (query, document) pairs whose items are texts, images or both,
through a score template (upstream 0.33's `--chat-template` recipe): `LLM.score`, `/score`
and `/rerank`. Each score is checked against transformers on the same prompt (the rendered
template with each image placeholder expanded to the image's merged patches, the LM head's
no/yes logits at the last position, softmax, P(yes))."""
from __future__ import annotations

import pytest

import mm_models as mm
import qwen3_vl_models as q3
from vllm import LLM

TOL = 1e-4
PH = "<|vision_start|><|image_pad|><|vision_end|>"
INSTRUCTION = "find the picture or passage that shows the query"
SYSTEM = ("Judge whether the Document meets the requirements based on the Query and the "
          "Instruct provided. Note that the answer can only be \"yes\" or \"no\".")
# Qwen3-VL-Reranker's prompt as a score template written for this test: an item's content
# is its text with the image placeholders in front (as upstream lays a content list out).
TEMPLATE = (
    "<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: {{ instruction | default('" + INSTRUCTION + "') }}\n"
    "<Query>: {{ (messages | selectattr('role', 'equalto', 'query') | first).content }}\n"
    "<Document>: {{ (messages | selectattr('role', 'equalto', 'document') | first).content }}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>{{ '\\n\\n' }}")


def rendered(query: str, document: str, instruction: str = INSTRUCTION) -> str:
    """TEMPLATE's output, written out by hand."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n<Instruct>: "
            f"{instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def image_item(*images, text: str = "") -> dict:
    return {"prompt": text, "multi_modal_data": {"image": list(images)}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(q3.make_qwen3_vl(tmp_path_factory.mktemp("qwen3_vl_rerank") / "model"))


@pytest.fixture(scope="module")
def template_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("template") / "qwen3_vl_reranker.jinja"
    path.write_text(TEMPLATE)
    return str(path)


def scores(outs) -> list[float]:
    return [o.outputs.score for o in outs]


def test_image_and_text_documents_equal_transformers(model_dir, template_file):
    llm = LLM(model_dir, hf_overrides=q3.RERANKER_OVERRIDES, chat_template=template_file,
              limit_mm_per_prompt={"image": 2})
    docs = [image_item(mm.picture(1)), "a small dog", image_item(mm.picture(2), text="a cat"),
            "a cat on a mat"]
    got = scores(llm.score("a cat", docs, use_tqdm=False))
    want = [q3.hf_p_yes(model_dir, rendered("a cat", PH), [mm.picture(1)]),
            q3.hf_p_yes(model_dir, rendered("a cat", "a small dog")),
            q3.hf_p_yes(model_dir, rendered("a cat", PH + "a cat"), [mm.picture(2)]),
            q3.hf_p_yes(model_dir, rendered("a cat", "a cat on a mat"))]
    assert got == pytest.approx(want, abs=TOL)
    assert max(want) - min(want) > 0.02
    # an image query (upstream takes one too): its image first in the prompt, then the
    # document's; and the instruction as a template variable
    got = scores(llm.score(image_item(mm.picture(3)), ["a bird", image_item(mm.picture(4))],
                           chat_template_kwargs={"instruction": "match"}, use_tqdm=False))
    want = [q3.hf_p_yes(model_dir, rendered(PH, "a bird", "match"), [mm.picture(3)]),
            q3.hf_p_yes(model_dir, rendered(PH, PH, "match"), [mm.picture(3), mm.picture(4)])]
    assert got == pytest.approx(want, abs=TOL)


def test_template_order_and_the_untemplated_form(model_dir):
    """A template that puts the document first attaches its image first; without any
    template an LLM reranker's items are joined (upstream's form), images in front."""
    llm = LLM(model_dir, hf_overrides=q3.RERANKER_OVERRIDES, limit_mm_per_prompt={"image": 2})
    doc_first = "D:{{ messages[1].content }} Q:{{ messages[0].content }}"
    got = llm.score(image_item(mm.picture(1), text="x"), image_item(mm.picture(2)),
                    chat_template=doc_first, use_tqdm=False)[0].outputs.score
    assert got == pytest.approx(q3.hf_p_yes(model_dir, f"D:{PH} Q:{PH}x",
                                            [mm.picture(2), mm.picture(1)]), abs=TOL)
    joined = llm.score("a cat", image_item(mm.picture(1), text="on a mat"),
                       use_tqdm=False)[0].outputs.score
    assert joined == pytest.approx(q3.hf_p_yes(model_dir, f"a cat{PH}on a mat",
                                               [mm.picture(1)]), abs=TOL)


def test_second_pass_is_cached_and_equal(model_dir, template_file):
    """The query's prompt is a shared text prefix; the same image documents again hit
    every full block, and another image behind the same query shares the blocks before
    its image only."""
    llm = LLM(model_dir, hf_overrides=q3.RERANKER_OVERRIDES, chat_template=template_file,
              block_size=16)
    docs = [image_item(mm.picture(5)), "a small dog", image_item(mm.picture(6), text="a cat")]
    first = llm.score("a cat", docs, use_tqdm=False)
    again = llm.score("a cat", docs, use_tqdm=False)
    assert scores(again) == pytest.approx(scores(first), abs=1e-6)
    for out in again:
        assert out.num_cached_tokens == (len(out.prompt_token_ids) - 1) // 16 * 16 > 0
    other = llm.score("a cat", image_item(mm.picture(7)), use_tqdm=False)[0]
    image_start = other.prompt_token_ids.index(mm.VISION_IDS(model_dir))
    assert other.num_cached_tokens == image_start // 16 * 16 > 0
    assert other.outputs.score == pytest.approx(
        q3.hf_p_yes(model_dir, rendered("a cat", PH), [mm.picture(7)]), abs=TOL)


def test_what_stays_refused(model_dir):
    llm = LLM(model_dir, hf_overrides=q3.RERANKER_OVERRIDES)
    twice = "{{ messages[1].content }} {{ messages[1].content }}"
    with pytest.raises(ValueError, match="more than once"):
        llm.score("a cat", image_item(mm.picture(1)), chat_template=twice, use_tqdm=False)
    with pytest.raises(ValueError, match="2 image placeholder"):
        llm.score("a cat", image_item(mm.picture(1), text=PH + PH), use_tqdm=False)


def test_rerank_and_score_routes(model_dir, template_file):
    from servers import _model_server
    from test_server import _ok
    server_gen = _model_server(model_dir, hf_overrides=q3.RERANKER_OVERRIDES,
                               chat_template=template_file)
    server = next(server_gen)
    try:
        def part(img) -> dict:
            return {"type": "image_url", "image_url": {"url": mm.data_url(mm.encoded(img))}}
        docs = ["a small dog", {"content": [part(mm.picture(1))]},
                {"content": [{"type": "text", "text": "a cat"}, part(mm.picture(2))]}]
        want = [q3.hf_p_yes(model_dir, rendered("a cat", "a small dog")),
                q3.hf_p_yes(model_dir, rendered("a cat", PH), [mm.picture(1)]),
                q3.hf_p_yes(model_dir, rendered("a cat", PH + "a cat"), [mm.picture(2)])]
        out = _ok(server.post("/rerank", {"query": "a cat", "documents": docs}))
        assert [r["index"] for r in out["results"]] == \
            sorted(range(3), key=lambda k: want[k], reverse=True)
        assert [r["relevance_score"] for r in out["results"]] == \
            pytest.approx(sorted(want, reverse=True), abs=TOL)
        out = _ok(server.post("/score", {"text_1": docs[1], "text_2": "a bird",
                                         "instruction": "match"}))
        assert out["data"][0]["score"] == pytest.approx(q3.hf_p_yes(
            model_dir, rendered(PH, "a bird", "match"), [mm.picture(1)]), abs=TOL)
        # TEI's /rerank (texts only in its protocol) runs the same template
        tei = _ok(server.post("/rerank", {"query": "a cat", "texts": [docs[0]]}))
        assert tei[0]["score"] == pytest.approx(want[0], abs=TOL)
        bad = server.post("/rerank", {"query": "a cat", "documents": docs,
                                      "max_chunks_per_doc": 2})
        assert bad.status_code == 400 and "image" in bad.text
    finally:
        next(server_gen, None)
