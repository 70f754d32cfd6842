"""TEI's gRPC messages mapped onto TEI's JSON bodies and back: each unary RPC becomes the
body of the HTTP route it mirrors (answered by `tei_front.run_tei`, the same path the HTTP
routes take), and that route's JSON answer becomes the RPC's response message.

Defaults are the wire's: proto3 bools are false unless sent, so `truncate` and `normalize`
are off and `add_special_tokens` is off unless the client sets them (TEI's gRPC has no
auto-truncate: a too-long input with `truncate` false is refused)."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from vllm.entrypoints.openai.tei_front import TeiAnswer
from vllm.entrypoints.openai.tei_protocol import TeiError

DIRECTIONS = {0: "Right", 1: "Left"}  # TruncationDirection's values
MODEL_TYPES = {"embedding": 0, "classifier": 1, "reranker": 2}  # ModelType's values


class Rpc(NamedTuple):
    """One unary RPC: the TEI path it runs, its message -> TEI body, and (pb2 module,
    answer) -> response message. `batch`: TEI's te_request_count label."""
    path: str
    body: Callable[[Any], dict]
    response: Callable[[Any, TeiAnswer], Any]
    batch: bool = False


def _truncation(message: Any) -> dict[str, Any]:
    return {"truncate": message.truncate,
            "truncation_direction": DIRECTIONS.get(message.truncation_direction, "Right")}


def _optional(message: Any, *names: str) -> dict[str, Any]:
    return {name: getattr(message, name) for name in names if message.HasField(name)}


def metadata(pb: Any, answer: TeiAnswer) -> Any:
    """TEI's Metadata message: the answer's characters, tokens and times (ns)."""
    result, times = answer
    return pb.Metadata(compute_chars=result.chars, compute_tokens=result.tokens,
                       total_time_ns=int(times.total * 1e9),
                       tokenization_time_ns=int(times.tokenization * 1e9),
                       queue_time_ns=int(times.queue * 1e9),
                       inference_time_ns=int(times.inference * 1e9))


def pair_inputs(message: Any) -> list[str]:
    """PredictPair's inputs: one text or a pair, else TEI's validation error."""
    if len(message.inputs) not in (1, 2):
        raise TeiError("Validation", "`inputs` must have a single or two elements. Given: "
                       f"{len(message.inputs)}")
    return list(message.inputs)


def _embed(pb: Any, a: TeiAnswer) -> Any:
    return pb.EmbedResponse(embeddings=a.result.body[0], metadata=metadata(pb, a))


def _sparse(pb: Any, a: TeiAnswer) -> Any:
    values = [pb.SparseValue(index=v["index"], value=v["value"]) for v in a.result.body[0]]
    return pb.EmbedSparseResponse(sparse_embeddings=values, metadata=metadata(pb, a))


def _embed_all(pb: Any, a: TeiAnswer) -> Any:
    rows = [pb.TokenEmbedding(embeddings=row) for row in a.result.body[0]]
    return pb.EmbedAllResponse(token_embeddings=rows, metadata=metadata(pb, a))


def _predict(pb: Any, a: TeiAnswer) -> Any:
    return pb.PredictResponse(predictions=[pb.Prediction(score=p["score"], label=p["label"])
                                           for p in a.result.body], metadata=metadata(pb, a))


def ranks(pb: Any, items: list[dict]) -> list[Any]:
    return [pb.Rank(index=r["index"], score=r["score"], **({"text": r["text"]} if "text" in r
                                                           else {})) for r in items]


def _rerank(pb: Any, a: TeiAnswer) -> Any:
    return pb.RerankResponse(ranks=ranks(pb, a.result.body), metadata=metadata(pb, a))


def _token(pb: Any, t: dict) -> Any:
    offsets = {} if t["start"] is None else {"start": t["start"], "stop": t["stop"]}
    return pb.SimpleToken(id=t["id"], text=t["text"], special=t["special"], **offsets)


def _tokens(pb: Any, a: TeiAnswer) -> Any:
    return pb.EncodeResponse(tokens=[_token(pb, t) for t in a.result.body[0]])


def _decoded(pb: Any, a: TeiAnswer) -> Any:
    return pb.DecodeResponse(text=a.result.body[0])


# "Service/Method" -> the unary mapping; a stream of a unary RPC's messages ("...Stream")
# answers each message as that RPC does.
UNARY: dict[str, Rpc] = {
    "Embed/Embed": Rpc("/embed", lambda m: {
        "inputs": m.inputs, "normalize": m.normalize, **_truncation(m),
        **_optional(m, "prompt_name")}, _embed),
    "Embed/EmbedSparse": Rpc("/embed_sparse", lambda m: {
        "inputs": m.inputs, **_truncation(m), **_optional(m, "prompt_name")}, _sparse),
    "Embed/EmbedAll": Rpc("/embed_all", lambda m: {
        "inputs": m.inputs, **_truncation(m), **_optional(m, "prompt_name")}, _embed_all),
    "Predict/Predict": Rpc("/predict", lambda m: {
        "inputs": m.inputs, "raw_scores": m.raw_scores, **_truncation(m)}, _predict),
    "Predict/PredictPair": Rpc("/predict", lambda m: {
        "inputs": pair_inputs(m), "raw_scores": m.raw_scores, **_truncation(m)}, _predict),
    "Rerank/Rerank": Rpc("/rerank", lambda m: {
        "query": m.query, "texts": list(m.texts), "raw_scores": m.raw_scores,
        "return_text": m.return_text, **_truncation(m)}, _rerank, batch=True),
    "Tokenize/Tokenize": Rpc("/tokenize", lambda m: {
        "inputs": m.inputs, "add_special_tokens": m.add_special_tokens,
        **_optional(m, "prompt_name")}, _tokens),
    "Tokenize/Decode": Rpc("/decode", lambda m: {
        "ids": list(m.ids), "skip_special_tokens": m.skip_special_tokens}, _decoded),
}
STREAMS: dict[str, str] = {
    "Embed/EmbedStream": "Embed/Embed", "Embed/EmbedSparseStream": "Embed/EmbedSparse",
    "Embed/EmbedAllStream": "Embed/EmbedAll", "Predict/PredictStream": "Predict/Predict",
    "Predict/PredictPairStream": "Predict/PredictPair",
    "Tokenize/TokenizeStream": "Tokenize/Tokenize", "Tokenize/DecodeStream": "Tokenize/Decode",
}


def info_response(pb: Any, info: dict[str, Any]) -> Any:
    """TEI's /info body as the Info RPC's message (unset optionals stay unset)."""
    kind = next(iter(info["model_type"]))
    fields = {k: info[k] for k in (
        "version", "model_id", "model_dtype", "max_concurrent_requests", "max_input_length",
        "max_batch_tokens", "max_client_batch_size", "tokenization_workers")}
    optional = {k: info[k] for k in ("sha", "docker_label", "model_sha", "max_batch_requests")
                if info.get(k) is not None}
    return pb.InfoResponse(model_type=MODEL_TYPES[kind], **fields, **optional)
