"""The pooling routes' direct path (direct_routes.py): a valid request skips FastAPI's router
and is answered exactly as FastAPI's route answers it; anything else is left to FastAPI."""
from __future__ import annotations

import pytest

from servers import MINILM, Server
from vllm.entrypoints.openai.direct_routes import DirectRoutes

CASES = {
    "minilm": [
        ("/v1/embeddings", {"model": MINILM, "input": "a sentence to embed"}),
        ("/v1/embeddings", {"input": ["one", "two words", "three more words"]}),
        ("/v1/embeddings", {"input": [101, 7592, 102], "encoding_format": "base64"}),
        ("/v1/embeddings", {"input": "shorter", "embed_dtype": "float16",
                            "encoding_format": "base64"}),
        ("/pooling", {"input": ["pooled text"]}),
        ("/v2/embed", {"model": MINILM, "texts": ["cohere style"],
                       "embedding_types": ["float", "binary"]}),
        ("/score", {"text_1": "a query", "text_2": ["doc one", "doc two"]}),
        ("/rerank", {"query": "a query", "documents": ["doc one", "doc two"], "top_n": 1}),
        ("/v1/rerank", {"query": "q", "documents": ["d"], "return_documents": False}),
    ],
    "cross_encoder": [
        ("/score", {"text_1": "a query", "text_2": "a document"}),
        ("/rerank", {"query": "a query", "documents": ["doc one", "doc two"]}),
        ("/classify", {"input": ["classify me", "and me"]}),
    ],
}
# Bodies that do not validate: FastAPI answers them (with its error text, mapped by errors.py).
INVALID = [
    ("/v1/embeddings", b'{"input": '),
    ("/v1/embeddings", b'{"model": "minilm"}'),
    ("/v1/embeddings", b'{"input": {"not": "a string"}}'),
    ("/v1/embeddings", b'[1, 2, 3]'),
    ("/score", b'{"text_1": 5}'),
    ("/rerank", b'{"query": "q", "documents": ["d"], "top_n": "many"}'),
]
# Valid bodies the handler refuses (its APIError / ValueError mapping).
REFUSED = [
    ("/v1/embeddings", {"model": "another-model", "input": "x"}),
    ("/v1/embeddings", {"input": []}),
    ("/v1/embeddings", {"input": "x", "dimensions": 100000}),
    ("/pooling", {"input": "x", "task": "no-such-task"}),
    ("/rerank", {"query": "q", "documents": []}),
]


class Spy:
    """Counts what the direct path answered and what it left to FastAPI."""

    def __init__(self) -> None:
        self.answered = self.declined = 0

    def wrap(self, monkeypatch) -> None:
        dispatch = DirectRoutes.dispatch

        async def counted(routes, *args, **kwargs):
            answered = await dispatch(routes, *args, **kwargs)
            if routes._routes:  # the FastAPI-only twin has none: not counted
                self.answered += answered
                self.declined += not answered
            return answered
        monkeypatch.setattr(DirectRoutes, "dispatch", counted)


@pytest.fixture
def spy(monkeypatch) -> Spy:
    s = Spy()
    s.wrap(monkeypatch)
    return s


def _twin(server: Server, **args) -> Server:
    """The same engine behind FastAPI's routes only."""
    twin = Server(server.engine, **args)
    twin.app.state.serving.direct._routes.clear()
    return twin


@pytest.fixture(scope="module")
def twins(minilm, cross_encoder):
    made = {"minilm": (minilm, _twin(minilm, served_model_name=[MINILM, "alias"])),
            "cross_encoder": (cross_encoder, _twin(cross_encoder))}
    yield made
    for _, twin in made.values():
        twin.close()


def _comparable(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


@pytest.mark.parametrize("name", list(CASES))
def test_valid_requests_are_answered_directly_and_alike(twins, spy, name):
    server, twin = twins[name]
    for path, body in CASES[name]:
        direct, routed = server.post(path, body), twin.post(path, body)
        assert direct.status_code == routed.status_code == 200, (path, direct.text)
        assert direct.headers["content-type"] == routed.headers["content-type"]
        assert _comparable(direct.json()) == _comparable(routed.json()), path
    assert spy.answered == len(CASES[name]) and spy.declined == 0


def test_invalid_bodies_are_left_to_fastapi(twins, spy):
    server, twin = twins["minilm"]
    headers = {"content-type": "application/json"}
    for path, raw in INVALID:
        direct = server.client.post(path, content=raw, headers=headers)
        routed = twin.client.post(path, content=raw, headers=headers)
        assert direct.status_code == routed.status_code == 400, (path, raw, direct.text)
        assert direct.json() == routed.json()
        assert direct.json()["error"]["message"] and direct.json()["error"]["code"] == 400
    assert spy.answered == 0 and spy.declined == len(INVALID)


def test_refusals_are_mapped_alike(twins, spy):
    server, twin = twins["minilm"]
    for path, body in REFUSED:
        direct, routed = server.post(path, body), twin.post(path, body)
        assert direct.status_code == routed.status_code, (path, direct.text, routed.text)
        assert 400 <= direct.status_code < 500
        assert direct.json() == routed.json()
        assert set(direct.json()["error"]) == {"message", "type", "param", "code"}
    assert spy.answered == len(REFUSED)


def test_route_the_model_cannot_serve_is_not_taken_directly(twins, spy):
    """The cross-encoder serves no embeddings: the edge answers upstream's 404 first."""
    server, _ = twins["cross_encoder"]
    response = server.post("/v1/embeddings", {"input": "x"})
    assert response.status_code == 404 and response.json()["detail"] == "Not Found"
    assert spy.answered == spy.declined == 0


def test_direct_routes_can_be_turned_off(minilm, spy, monkeypatch):
    """VLLM_SERVER_DIRECT_ROUTES=0: FastAPI answers every request, with the same body."""
    monkeypatch.setenv("VLLM_SERVER_DIRECT_ROUTES", "0")
    off = Server(minilm.engine, served_model_name=[MINILM])
    try:
        body = {"input": "routed by FastAPI"}
        response = off.post("/v1/embeddings", body)
        assert response.status_code == 200
        assert spy.answered == spy.declined == 0
        assert response.json()["data"] == minilm.post("/v1/embeddings", body).json()["data"]
        assert spy.answered == 1
    finally:
        off.close()
