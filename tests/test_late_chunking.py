"""Late chunking (upstream 0.33's `late_chunking_params`) on a token_embed (ColBERT) engine:
each chunk vector is the normalised mean of its tokens' projected vectors, equal to a
Transformers reference; the ranges and refusals offline and on /v1/embeddings."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import family_models as fm
import model_factory as mf
from servers import Server, _engine
from vllm import PoolingParams
from vllm.pooling_params import LateChunkingParams

COS_MIN = 0.9999
TEXT = "late chunking pools the contextual token vectors of a whole document per chunk"


def _reference(model_dir: str, ids: list[int], size: int) -> torch.Tensor:
    """normalize(mean(projected hidden states)) per run of `size` tokens."""
    weight = load_file(f"{model_dir}/model.safetensors")["linear.weight"]
    projected = fm.hf_hidden(model_dir, ids) @ weight.T
    means = torch.stack([c.mean(0) for c in torch.split(projected, size)])
    return torch.nn.functional.normalize(means, dim=-1)


def _check_ranges(meta, n: int, size: int, text: str) -> None:
    assert meta.chunk_size == size and meta.input_tokens == n
    assert meta.strategy == "fixed_tokens"
    assert [c.token_range for c in meta.chunks] == \
        [(s, min(s + size, n)) for s in range(0, n, size)]
    starts = [c.char_range[0] for c in meta.chunks if c.char_range]
    assert starts == sorted(starts) and meta.chunks[0].char_range[0] == 0
    assert meta.chunks[-1].char_range[1] == len(text)


def test_offline_chunks_equal_reference(shared_llm, hf_colbert_dir):
    llm = shared_llm(hf_colbert_dir)
    size = 5
    params = PoolingParams(late_chunking_params=LateChunkingParams(size))
    plain, chunked = llm.embed([TEXT, "short"], pooling_params=[None, params], use_tqdm=False)
    assert plain.late_chunking is None and plain.outputs.data.shape[0] == \
        len(plain.prompt_token_ids)
    ids = chunked.prompt_token_ids
    got, ref = chunked.outputs.data, _reference(hf_colbert_dir, ids, size)
    assert got.shape == ref.shape == (-(-len(ids) // size), 32)
    assert min(mf.cosine(g, r) for g, r in zip(got, ref)) >= COS_MIN
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(got)), atol=1e-5)
    _check_ranges(chunked.late_chunking, len(ids), size, "short")
    dict_form = llm.embed("short", pooling_params=PoolingParams(
        late_chunking_params={"chunk_size": size}), use_tqdm=False)[0]
    assert torch.allclose(dict_form.outputs.data, got, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    ({"pooling_params": PoolingParams(late_chunking_params={"chunk_size": 0})}, "chunk_size"),
    ({"pooling_params": PoolingParams(dimensions=8, late_chunking_params={"chunk_size": 2})},
     "dimensions"),
    ({"truncate_prompt_tokens": 4}, "truncation"),
    ({"tokenization_kwargs": {"padding": "max_length"}}, "padding"),
    ({"precision": "int8", "ranges": [[-1.0] * 32, [1.0] * 32]}, "precision"),
])
def test_offline_refusals(shared_llm, hf_colbert_dir, kwargs, match):
    llm = shared_llm(hf_colbert_dir)
    kwargs.setdefault("pooling_params", PoolingParams(late_chunking_params={"chunk_size": 2}))
    with pytest.raises(ValueError, match=match):
        llm.embed(TEXT, use_tqdm=False, **kwargs)
    with pytest.raises(ValueError, match="plain-text"):
        llm.embed([[101, 2000, 102]], use_tqdm=False,
                  pooling_params=PoolingParams(late_chunking_params={"chunk_size": 2}))


def test_server_late_chunking_and_refusals(hf_colbert_dir):
    engine = _engine(hf_colbert_dir)
    server = Server(engine)
    size = 4
    try:
        r = server.post("/v1/embeddings", {"input": [TEXT, "short"],
                                            "late_chunking_params": {"chunk_size": size}})
        assert r.status_code == 200, r.text
        tok = mf.hf_tokenizer(hf_colbert_dir)
        for item, text in zip(r.json()["data"], [TEXT, "short"]):
            ids = tok(text)["input_ids"]
            got, ref = torch.tensor(item["embedding"]), _reference(hf_colbert_dir, ids, size)
            assert got.shape == ref.shape
            assert min(mf.cosine(g, v) for g, v in zip(got, ref)) >= COS_MIN
            meta = item["late_chunking"]
            assert set(meta) == {"chunk_size", "input_tokens", "chunks", "strategy"}
            assert meta["strategy"] == "fixed_tokens" and meta["input_tokens"] == len(ids)
            assert meta["chunks"][0]["token_range"] == [0, min(size, len(ids))]
            first = meta["chunks"][0]["char_range"]
            assert first[0] == 0 and text[first[0]:first[1]] in text
        lc = {"chunk_size": 2}
        for extra, param in [({"encoding_format": "base64"}, "encoding_format"),
                             ({"dimensions": 8}, "dimensions"),
                             ({"truncate_prompt_tokens": 3}, "truncate_prompt_tokens"),
                             ({"padding": "max_length"}, "padding"),
                             ({"input": [101, 2000, 102]}, "input")]:
            body = {"input": TEXT, "late_chunking_params": lc, **extra}
            bad = server.post("/v1/embeddings", body)
            assert bad.status_code == 400, (extra, bad.text)
            assert bad.json()["error"]["param"] == param, (extra, bad.text)
        for lc_bad in ({"chunk_size": 0}, {"chunk_size": "2"}, {"size": 2}):
            bad = server.post("/v1/embeddings", {"input": TEXT, "late_chunking_params": lc_bad})
            assert bad.status_code == 400 and "late_chunking_params" in bad.text, bad.text
    finally:
        server.close()
        engine.shutdown()
