"""Hugging Face TEI's gRPC service (tei.v1, `--grpc-port`): clients built from the stubs
generated from vllm/entrypoints/grpc/tei.proto, against servers on the session engines
(MiniLM, a one-label cross-encoder, a three-label classifier). Answers equal the HTTP TEI
routes' on the same engine; refusals carry the gRPC status TEI gives their error type."""
from __future__ import annotations

import math

import grpc
import pytest

from servers import API_KEY, MINILM, Server
from vllm.entrypoints.grpc.stubs import tei_stubs

pb, pb_grpc = tei_stubs()
TEXTS = ["The cat sat on the mat.", "A quick brown fox", "Paris is in France"]
LONG = "word " * 400  # over MiniLM's 256 tokens


def close(a, b, tol=1e-5) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, abs_tol=tol) for x, y in zip(a, b))


class Client:
    """The five TEI stubs on one channel."""

    def __init__(self, target: str, key: str | None = None) -> None:
        self.channel = grpc.insecure_channel(target)
        self.metadata = (("authorization", f"Bearer {key}"),) if key else None
        for name in ("Info", "Embed", "Predict", "Rerank", "Tokenize"):
            setattr(self, name.lower(), getattr(pb_grpc, f"{name}Stub")(self.channel))


def _server(engine, **args):
    server = Server(engine, grpc_port=0, **args)
    client = Client(server.grpc_target)
    yield server, client
    client.channel.close()
    server.close()


@pytest.fixture(scope="module")
def embedder(minilm):
    yield from _server(minilm.engine, served_model_name=[MINILM])


@pytest.fixture(scope="module")
def reranker(cross_encoder):
    yield from _server(cross_encoder.engine)


@pytest.fixture(scope="module")
def classifier(classifier3):
    yield from _server(classifier3.engine)


def refused(call, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        list(result) if hasattr(result, "__iter__") else result
    assert info.value.code() == code, info.value.details()
    return info.value.details()


def test_embed_equals_http_embed(embedder):
    server, client = embedder
    ref = server.post("/embed", {"inputs": TEXTS}).json()
    answer, call = client.embed.Embed.with_call(pb.EmbedRequest(inputs=TEXTS[0],
                                                                normalize=True))
    assert close(answer.embeddings, ref[0])
    assert answer.metadata.compute_chars == len(TEXTS[0])
    assert answer.metadata.compute_tokens > 2 and answer.metadata.total_time_ns > 0
    assert "x-compute-tokens" in dict(call.initial_metadata())
    raw = client.embed.Embed(pb.EmbedRequest(inputs=TEXTS[1]))  # proto3: normalize false
    assert close(raw.embeddings, server.post("/embed", {"inputs": TEXTS[1],
                                                        "normalize": False}).json()[0])
    left = client.embed.Embed(pb.EmbedRequest(
        inputs=LONG, truncate=True, normalize=True,
        truncation_direction=pb.TRUNCATION_DIRECTION_LEFT))
    assert close(left.embeddings, server.post("/embed", {
        "inputs": LONG, "truncation_direction": "Left"}).json()[0])


def test_embed_stream_keeps_request_order(embedder):
    server, client = embedder
    texts = [LONG[:900], "a", TEXTS[0], LONG[:300], "b", TEXTS[2]]  # long ones finish last
    ref = server.post("/embed", {"inputs": texts}).json()
    answers = list(client.embed.EmbedStream(
        iter(pb.EmbedRequest(inputs=t, normalize=True, truncate=True) for t in texts)))
    assert len(answers) == len(texts)
    assert all(close(a.embeddings, r) for a, r in zip(answers, ref))
    assert [a.metadata.compute_chars for a in answers] == [len(t) for t in texts]
    # a refused message ends the stream with its status, after the answers before it
    stream = client.embed.EmbedStream(iter([pb.EmbedRequest(inputs="x"),
                                            pb.EmbedRequest(inputs=LONG)]))
    assert next(stream).embeddings
    refused(lambda: next(stream), grpc.StatusCode.INVALID_ARGUMENT)


def test_embedder_refusals(embedder):
    _, client = embedder
    message = refused(lambda: client.embed.Embed(pb.EmbedRequest(inputs=LONG)),
                      grpc.StatusCode.INVALID_ARGUMENT)  # no auto-truncate on gRPC
    assert "must have less than 256 tokens" in message
    for call in (lambda: client.embed.EmbedAll(pb.EmbedAllRequest(inputs="x")),
                 lambda: client.embed.EmbedSparse(pb.EmbedSparseRequest(inputs="x")),
                 lambda: client.predict.Predict(pb.PredictRequest(inputs="x")),
                 lambda: client.rerank.Rerank(pb.RerankRequest(query="q", texts=["a"]))):
        refused(call, grpc.StatusCode.FAILED_PRECONDITION)  # the wrong model kind
    refused(lambda: list(client.embed.EmbedAllStream(iter([pb.EmbedAllRequest(inputs="x")]))),
            grpc.StatusCode.FAILED_PRECONDITION)
    refused(lambda: client.tokenize.Decode(pb.DecodeRequest(ids=[10 ** 9])),
            grpc.StatusCode.FAILED_PRECONDITION)  # TEI's Tokenizer error


def test_tokenize_decode_and_info(embedder):
    server, client = embedder
    ref = server.post("/tokenize", {"inputs": "Hello world!"}).json()[0]
    tokens = client.tokenize.Tokenize(pb.EncodeRequest(inputs="Hello world!",
                                                       add_special_tokens=True)).tokens
    got = [{"id": t.id, "text": t.text, "special": t.special,
            "start": t.start if t.HasField("start") else None,
            "stop": t.stop if t.HasField("stop") else None} for t in tokens]
    assert got == ref
    plain = list(client.tokenize.TokenizeStream(iter(pb.EncodeRequest(inputs=w)
                                                     for w in ("a", "b c"))))
    assert [[t.text for t in r.tokens] for r in plain] == [["a"], ["b", "c"]]
    ids = [t["id"] for t in ref]
    assert client.tokenize.Decode(pb.DecodeRequest(
        ids=ids, skip_special_tokens=True)).text == server.post("/decode", {"ids": ids}).json()[0]
    decoded = list(client.tokenize.DecodeStream(iter([pb.DecodeRequest(ids=ids),
                                                      pb.DecodeRequest(ids=ids[1:2])])))
    assert decoded[0].text.startswith("[CLS]") and decoded[1].text == "hello"
    info = client.info.Info(pb.InfoRequest())
    http = server.client.get("/info").json()
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING and info.model_id == MINILM
    assert (info.max_input_length, info.max_client_batch_size) == (256, 32)
    assert info.version == http["version"] and info.max_batch_tokens == http["max_batch_tokens"]
    assert not info.HasField("sha") and info.HasField("max_batch_requests")


def test_rerank_equals_http_rerank(reranker):
    server, client = reranker
    ref = server.post("/rerank", {"query": "q", "texts": TEXTS, "return_text": True}).json()
    answer = client.rerank.Rerank(pb.RerankRequest(query="q", texts=TEXTS, truncate=True,
                                                   return_text=True))
    assert [r.index for r in answer.ranks] == [r["index"] for r in ref]
    assert close([r.score for r in answer.ranks], [r["score"] for r in ref])
    assert [r.text for r in answer.ranks] == [r["text"] for r in ref]
    assert answer.metadata.compute_chars == len("q") * 3 + sum(map(len, TEXTS))
    streamed = client.rerank.RerankStream(iter(
        pb.RerankStreamRequest(query="q", text=t, return_text=i == 0)
        for i, t in enumerate(TEXTS)))  # return_text: the first message's
    assert [(r.index, r.text) for r in streamed.ranks] == [(r["index"], r["text"])
                                                           for r in ref]
    assert close([r.score for r in streamed.ranks], [r["score"] for r in ref])
    refused(lambda: client.rerank.Rerank(pb.RerankRequest(query="q")),
            grpc.StatusCode.INVALID_ARGUMENT)  # an empty batch
    message = refused(lambda: client.rerank.Rerank(pb.RerankRequest(query="q",
                                                                     texts=["x"] * 33)),
                      grpc.StatusCode.INVALID_ARGUMENT)
    assert message == "batch size 33 > maximum allowed batch size 32"
    assert client.info.Info(pb.InfoRequest()).model_type == pb.MODEL_TYPE_RERANKER


def test_predict_pairs_on_a_reranker(reranker):
    server, client = reranker
    pair = client.predict.PredictPair(pb.PredictPairRequest(inputs=["q", TEXTS[0]]))
    ref = server.post("/predict", {"inputs": ["q", TEXTS[0]]}).json()
    assert close([pair.predictions[0].score], [ref[0]["score"]])
    refused(lambda: client.predict.PredictPair(pb.PredictPairRequest(inputs=["a", "b", "c"])),
            grpc.StatusCode.INVALID_ARGUMENT)
    streamed = list(client.predict.PredictPairStream(iter(
        pb.PredictPairRequest(inputs=["q", t]) for t in TEXTS)))
    ref = server.post("/predict", {"inputs": [["q", t] for t in TEXTS]}).json()
    assert close([s.predictions[0].score for s in streamed], [r[0]["score"] for r in ref])


def test_predict_equals_http_predict(classifier):
    server, client = classifier
    for raw in (False, True):
        ref = server.post("/predict", {"inputs": TEXTS[0], "raw_scores": raw}).json()
        answer = client.predict.Predict(pb.PredictRequest(inputs=TEXTS[0], raw_scores=raw))
        assert [p.label for p in answer.predictions] == [p["label"] for p in ref]
        assert close([p.score for p in answer.predictions], [p["score"] for p in ref])
    streamed = list(client.predict.PredictStream(iter(pb.PredictRequest(inputs=t)
                                                      for t in TEXTS)))
    ref = server.post("/predict", {"inputs": [[t] for t in TEXTS]}).json()
    assert [[p.label for p in s.predictions] for s in streamed] == \
        [[p["label"] for p in r] for r in ref]
    refused(lambda: client.rerank.Rerank(pb.RerankRequest(query="q", texts=["a"])),
            grpc.StatusCode.FAILED_PRECONDITION)
    refused(lambda: client.embed.Embed(pb.EmbedRequest(inputs="x")),
            grpc.StatusCode.FAILED_PRECONDITION)
    assert client.info.Info(pb.InfoRequest()).model_type == pb.MODEL_TYPE_CLASSIFIER


def test_api_key_body_limit_and_metrics(minilm):
    server = Server(minilm.engine, served_model_name=[MINILM], api_key=API_KEY, grpc_port=0,
                    max_request_body_bytes=4096)
    try:
        for key in (None, "wrong"):
            client = Client(server.grpc_target, key)
            refused(lambda: client.embed.Embed(pb.EmbedRequest(inputs="x"),
                                               metadata=client.metadata),
                    grpc.StatusCode.UNAUTHENTICATED)
            refused(lambda: list(client.embed.EmbedStream(iter([pb.EmbedRequest(inputs="x")]),
                                                          metadata=client.metadata)),
                    grpc.StatusCode.UNAUTHENTICATED)
            client.channel.close()
        before = _successes(server)
        client = Client(server.grpc_target, API_KEY)
        assert client.embed.Embed(pb.EmbedRequest(inputs="x"), metadata=client.metadata)
        refused(lambda: client.embed.Embed(pb.EmbedRequest(inputs="x" * 5000),
                                           metadata=client.metadata),
                grpc.StatusCode.RESOURCE_EXHAUSTED)  # over --max-request-body-bytes
        client.channel.close()
        assert _successes(server) == before + 1  # the te_* metrics the HTTP routes feed
    finally:
        server.close()


def _successes(server) -> float:
    line = 'te_request_success{method="single"} '
    text = server.client.get("/metrics").text
    return next((float(x[len(line):]) for x in text.splitlines() if x.startswith(line)), 0.0)


def test_missing_grpcio_names_the_extra(monkeypatch):
    from vllm.entrypoints.grpc import stubs
    monkeypatch.setattr(stubs.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"\.\[grpc\]"):
        stubs.require_grpc()


def test_grpc_port_flag():
    from vllm.entrypoints.cli.main import _serve, make_parser
    args = make_parser().parse_args(["serve", "m1", "--grpc-port", "0"])
    assert args.grpc_port == 0
    several = make_parser().parse_args(["serve", "m1", "m2", "--grpc-port", "0"])
    with pytest.raises(SystemExit, match="one model"):
        _serve(several)
