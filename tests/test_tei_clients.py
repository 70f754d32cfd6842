"""Real TEI clients against the running server: `huggingface_hub.InferenceClient` pointed at
the server's URL (`model=URL`) posts to TEI's root route, which dispatches by the body and
the model's kind. Its numbers equal sentence-transformers' and the OpenAI routes'.

The client never reaches the hub: its HTTP session is replaced, for these tests, by one
that refuses any host but the loopback server (HF_HUB_OFFLINE=1, set in conftest, would
refuse every request, the local server's too)."""
from __future__ import annotations

import httpx2
import numpy as np
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.utils import _http

TEXTS = ["The cat sat on the mat.", "A dog runs in the park.", "Stocks fell sharply today."]


def _loopback_only(request: httpx2.Request) -> None:
    if request.url.host != "127.0.0.1":
        raise AssertionError(f"the client tried to reach {request.url}")


@pytest.fixture
def hf_client_factory():
    """huggingface_hub's shared HTTP session, limited to the loopback server."""
    _http.set_client_factory(lambda: httpx2.Client(event_hooks={"request": [_loopback_only]},
                                                   timeout=60))
    _http.close_session()
    yield
    _http.set_client_factory(_http.default_client_factory)
    _http.close_session()


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def st_minilm(minilm_dir):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(minilm_dir, device="cpu")


def test_feature_extraction_equals_sentence_transformers(minilm, st_minilm, hf_client_factory):
    client = InferenceClient(model=minilm.url)
    got = client.feature_extraction(TEXTS)
    assert got.shape == (len(TEXTS), 384)
    ref = st_minilm.encode(TEXTS, convert_to_numpy=True)
    openai = minilm.post("/v1/embeddings", {"model": "minilm", "input": TEXTS}).json()["data"]
    for row, r, o in zip(got, ref, openai):
        assert _cos(row, r) >= 0.9999 and _cos(row, o["embedding"]) >= 0.9999
    single = client.feature_extraction(TEXTS[0])
    assert _cos(single, ref[0]) >= 0.9999


def test_sentence_similarity_equals_cosine(minilm, st_minilm, hf_client_factory):
    client = InferenceClient(model=minilm.url)
    got = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    ref = st_minilm.encode(TEXTS, convert_to_numpy=True)
    assert np.allclose(got, [_cos(ref[0], r) for r in ref[1:]], atol=1e-4)


def test_text_classification_equals_classify(classifier3, hf_client_factory):
    """TEI answers a single text's /predict with a flat list sorted by score; the client
    (written for the HF Inference API's nested list) then returns its first element: the
    top label with its probability, as it does against TEI itself."""
    client = InferenceClient(model=classifier3.url)
    labels = ["negative", "neutral", "positive"]
    for text in TEXTS:
        got = client.text_classification(text)
        ref = classifier3.post("/classify", {"input": text}).json()["data"][0]
        probs = dict(zip(labels, ref["probs"]))
        elements = got if isinstance(got, list) else [got]
        assert elements[0].label == ref["label"]
        for element in elements:
            assert abs(element.score - probs[element.label]) < 1e-4


def test_llamaindex_tei_embeddings_equal_sentence_transformers(minilm, st_minilm):
    """LlamaIndex's `TextEmbeddingsInference` embedding class, with its defaults (POST /embed
    with `truncate: true`, batches of 10), sync and async, for texts and queries."""
    import asyncio

    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
    client = TextEmbeddingsInference(model_name="minilm", base_url=minilm.url)
    texts = TEXTS * 5  # two batches of the client's 10
    got = client.get_text_embedding_batch(texts)
    ref = st_minilm.encode(texts, convert_to_numpy=True)
    assert len(got) == len(texts)
    assert min(_cos(g, r) for g, r in zip(got, ref)) >= 0.9999
    assert _cos(client.get_query_embedding(TEXTS[1]), ref[1]) >= 0.9999
    assert _cos(asyncio.run(client.aget_text_embedding(TEXTS[2])), ref[2]) >= 0.9999
