"""jina-embeddings-v3 (XLMRobertaModel with rotary positions and per-task LoRAs) and
jina-colbert-v2 (ColBERTJinaRobertaModel) served natively equal an independent float64
reference (tests/jina_models.py) on tiny checkpoints with the real names and config keys:
each request's task (its sentence-transformers prompt name) picks the prompt and the LoRA
adapter, tasks mix in one step exactly, and the HTTP route equals the offline API."""
from __future__ import annotations

import pathlib

import pytest
import torch

import jina_models as jm
import model_factory as mf
import servers
from vllm import LLM, PoolingParams
from vllm.model_executor.models.registry import resolve_architecture
from vllm.model_executor.models.transformers_arch import resolve_model_impl
from vllm.transformers_utils.config import load_hf_config

COS_MIN, NORM_TOL = 0.9999, 1e-3
RAW = PoolingParams(normalize=False)
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog near the river",
         "Paris London Berlin"]


@pytest.fixture(scope="module")
def jina_dir(tmp_path_factory) -> str:
    return str(jm.write_checkpoint(tmp_path_factory.mktemp("jina") / "m", jm.jina_config()))


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory) -> str:
    cfg = jm.jina_config("ColBERTJinaRobertaModel", lora=False, colbert_dim=jm.COLBERT_DIM)
    return str(jm.write_checkpoint(tmp_path_factory.mktemp("jcol") / "m", cfg,
                                   seed=mf.SEED + 3, colbert=True, mean_pooling=False))


@pytest.fixture(scope="module")
def jina_server(jina_dir):
    yield from servers._model_server(jina_dir)


def _ids(model_dir: str, text: str, task) -> list[int]:
    prefix = jm.INSTRUCTIONS[task] if task else ""
    return mf.hf_tokenizer(model_dir)(prefix + text)["input_ids"]


def _close(got, ref: torch.Tensor) -> None:
    got = torch.as_tensor(got, dtype=torch.float64)
    assert mf.cosine(got, ref) >= COS_MIN
    assert abs(float(got.norm() / ref.norm()) - 1) <= NORM_TOL


def _mean_state(model_dir: str, text: str, task) -> torch.Tensor:
    return jm.reference_hidden(model_dir, _ids(model_dir, text, task),
                               task or "text-matching").mean(0)


def test_registry_dispatches_rotary_xlmr_to_jina(jina_dir, colbert_dir):
    cfg = load_hf_config(pathlib.Path(jina_dir))
    assert resolve_architecture("XLMRobertaModel", cfg).base.class_name == "JinaRobertaModel"
    assert resolve_architecture("XLMRobertaModel").base.class_name == "RobertaModel"
    cfg.position_embedding_type = "absolute"  # plain XLM-R keeps the roberta path
    assert resolve_architecture("XLMRobertaModel", cfg).base.class_name == "RobertaModel"
    cfg.position_embedding_type = "rotary"
    with pytest.raises(ValueError, match="layout transformers' class does not implement"):
        resolve_model_impl("XLMRobertaModel", "transformers", cfg)
    colbert = resolve_architecture("ColBERTJinaRobertaModel")
    assert colbert.base.multi_vector and colbert.default_pooling_type == "ALL"


def test_each_task_matches_reference(shared_llm, jina_dir):
    llm = shared_llm(jina_dir)
    mc = llm.llm_engine.model_config
    assert mc.task_adapters == tuple(jm.TASKS) and mc.pooler_config.pooling_type == "MEAN"
    for task in (None, *jm.TASKS):
        outs = llm.embed(TEXTS, pooling_params=RAW, prompt_name=task, use_tqdm=False)
        for text, out in zip(TEXTS, outs):
            _close(out.outputs.embedding, _mean_state(jina_dir, text, task))
    # the adapter matters: text-matching's vector is not the bare weights' (or another task's)
    ids = _ids(jina_dir, TEXTS[1], None)
    plain = jm.reference_hidden(jina_dir, ids, None).mean(0)
    assert mf.cosine(_mean_state(jina_dir, TEXTS[1], None), plain) < 0.999
    assert mf.cosine(_mean_state(jina_dir, TEXTS[1], "separation"),
                     _mean_state(jina_dir, TEXTS[1], "classification")) < 0.999


def test_tasks_mix_in_one_call_and_step(shared_llm, jina_dir):
    """Two tasks in one call share steps and equal each task alone; the same tokens under
    two tasks ("separation" and "classification" add no prompt) are never deduplicated."""
    llm = shared_llm(jina_dir)
    names = ["retrieval.query", "retrieval.passage", "separation", "classification"]
    texts = [TEXTS[0], TEXTS[1], TEXTS[2], TEXTS[2]]
    before = llm.llm_engine.stats
    mixed = llm.embed(texts, pooling_params=RAW, prompt_name=names, use_tqdm=False)
    after = llm.llm_engine.stats
    assert after.num_deduplicated == before.num_deduplicated
    assert after.num_steps - before.num_steps == 1  # four tasks, one step
    for text, name, out in zip(texts, names, mixed):
        alone = llm.embed([text], pooling_params=RAW, prompt_name=name, use_tqdm=False)[0]
        torch.testing.assert_close(torch.as_tensor(out.outputs.embedding),
                                   torch.as_tensor(alone.outputs.embedding),
                                   rtol=1e-5, atol=1e-6)
        _close(out.outputs.embedding, _mean_state(jina_dir, text, name))
    assert mf.cosine(torch.as_tensor(mixed[2].outputs.embedding),
                     torch.as_tensor(mixed[3].outputs.embedding)) < 0.999


def test_unknown_task_and_caching_gate(shared_llm, jina_dir):
    llm = shared_llm(jina_dir)
    with pytest.raises(ValueError, match="Unknown prompt_name 'retrieval.document'"):
        llm.embed(TEXTS[:1], prompt_name="retrieval.document", use_tqdm=False)
    cfg = llm.llm_engine.vllm_config
    assert not cfg.cache_config.enable_prefix_caching
    assert not cfg.scheduler_config.enable_chunked_prefill
    forced = LLM(model=jina_dir, enable_prefix_caching=True, enable_chunked_prefill=True)
    fc = forced.llm_engine.vllm_config
    assert not fc.cache_config.enable_prefix_caching
    assert not fc.scheduler_config.enable_chunked_prefill
    with pytest.raises(ValueError, match="task LoRA adapters"):
        LLM(model=jina_dir, enable_lora=True)


def test_http_task_equals_offline(jina_server, shared_llm, jina_dir):
    llm = shared_llm(jina_dir)
    for task in ("retrieval.query", None):
        body = {"input": TEXTS, "model": jina_dir}
        if task is not None:
            body["prompt_name"] = task
        resp = jina_server.post("/v1/embeddings", body)
        assert resp.status_code == 200, resp.text
        offline = llm.embed(TEXTS, prompt_name=task, use_tqdm=False)
        for item, out in zip(resp.json()["data"], offline):
            torch.testing.assert_close(torch.tensor(item["embedding"]),
                                       torch.as_tensor(out.outputs.embedding),
                                       rtol=1e-5, atol=1e-6)
    bad = jina_server.post("/v1/embeddings", {"input": TEXTS[:1], "model": jina_dir,
                                              "prompt_name": "nope"})
    assert bad.status_code == 400 and "nope" in bad.text


def test_colbert_token_vectors_and_maxsim(shared_llm, colbert_dir):
    llm = shared_llm(colbert_dir)
    mc = llm.llm_engine.model_config
    assert mc.pooling_task == "token_embed" and not mc.task_adapters
    query, docs = TEXTS[0], TEXTS[1:]
    outs = llm.encode([query, *docs], pooling_task="token_embed", use_tqdm=False)
    refs = [jm.reference_token_vectors(colbert_dir, _ids(colbert_dir, t, None))
            for t in (query, *docs)]
    for out, ref in zip(outs, refs):
        got = torch.as_tensor(out.outputs.data, dtype=torch.float64)
        assert got.shape == ref.shape == (ref.shape[0], jm.COLBERT_DIM)
        for row, ref_row in zip(got, ref):
            _close(row, ref_row)
    scores = llm.score(query, docs, use_tqdm=False)
    for score, ref in zip(scores, refs[1:]):
        assert abs(score.outputs.score - jm.maxsim(refs[0], ref)) <= 1e-3
