"""NomicBERT (nomic-embed-text) and GTE "new" (gte-multilingual-base, arctic-embed-m-v2.0,
gte-multilingual-reranker-base) served natively equal an independent float64 reference
(tests/rope_encoder_models.py) on tiny checkpoints with the real names and config keys:
embeddings cos >= 0.9999 with norm ratio within 1e-3, probabilities within 1e-4; and the
sentence-transformers modules (MEAN pooling, Normalize, prompts, Matryoshka dimensions)
apply to the reference's states as sentence-transformers would."""
from __future__ import annotations

import json
import types

import pytest
import torch

import model_factory as mf
import rope_encoder_models as rm
from vllm import LLM, PoolingParams
from vllm.model_executor.models.registry import resolve_architecture

COS_MIN, NORM_TOL, PROB_TOL = 0.9999, 1e-3, 1e-4
PROMPTS = {"query": "search_query: ", "document": "search_document: "}
MATRYOSHKA = {"hf_overrides": {"matryoshka_dimensions": [16, 32, 64]}}
RAW = PoolingParams(normalize=False)


def _close(got, ref: torch.Tensor) -> None:
    got = torch.as_tensor(got, dtype=torch.float64)
    assert mf.cosine(got, ref) >= COS_MIN
    assert abs(float(got.norm() / ref.norm()) - 1) <= NORM_TOL


@pytest.fixture(scope="module")
def nomic_dir(tmp_path_factory) -> str:
    """nomic-embed-text's layout: MEAN pooling + Normalize, search_query/document prompts."""
    path = rm.write_checkpoint(tmp_path_factory.mktemp("nomic") / "m", rm.nomic_config())
    rm.write_mean_st_files(path, rm.HIDDEN, PROMPTS)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    return str(path)


@pytest.fixture(scope="module")
def gte_dir(tmp_path_factory) -> str:
    """gte-multilingual-base's layout (no prefix, NTK rope factor 4); no ST files: CLS."""
    return str(rm.write_checkpoint(tmp_path_factory.mktemp("gte") / "m", rm.gte_config(),
                                   seed=mf.SEED + 1))


@pytest.fixture(scope="module")
def gte_rerank_dir(tmp_path_factory) -> str:
    """gte-multilingual-reranker-base's layout: `new.` encoder + pooler, one-label classifier."""
    cfg = rm.gte_config("GteNewForSequenceClassification")
    return str(rm.write_checkpoint(tmp_path_factory.mktemp("gter") / "m", cfg,
                                   seed=mf.SEED + 2, prefix="new.", num_labels=1))


def _prompts(model_dir: str) -> list[str]:
    return mf.mixed_prompts(mf.hf_tokenizer(model_dir))


def test_registry_names_and_defaults():
    for name in ("NomicBertModel", "GteModel", "GteNewModel", "GteNewForSequenceClassification"):
        arch = resolve_architecture(name)
        assert arch.default_pooling_type == "CLS" and not arch.base.is_causal
    assert resolve_architecture("GteNewForSequenceClassification").native_convert == "classify"


def test_nomic_mean_states_match_reference(shared_llm, nomic_dir):
    llm = shared_llm(nomic_dir, **MATRYOSHKA)
    mc = llm.llm_engine.model_config
    assert mc.pooler_config.pooling_type == "MEAN" and mc.hf_config.hidden_size == rm.HIDDEN
    outs = llm.embed(_prompts(nomic_dir), pooling_params=RAW, prompt="", use_tqdm=False)
    refs = rm.reference_hidden(nomic_dir, [o.prompt_token_ids for o in outs])
    assert max(len(o.prompt_token_ids) for o in outs) > 150
    for out, ref in zip(outs, refs):
        _close(out.outputs.embedding, ref.mean(0))


def test_nomic_prompts_normalize_and_matryoshka(shared_llm, nomic_dir):
    llm = shared_llm(nomic_dir, **MATRYOSHKA)
    tok = mf.hf_tokenizer(nomic_dir)
    texts = ["how do rivers form", "a cat sleeps on the mat in the city"]
    for name, dims in (("query", None), ("document", 16)):
        outs = llm.embed(texts, prompt_name=name, use_tqdm=False,
                         pooling_params=PoolingParams(dimensions=dims))
        ids = [tok(PROMPTS[name] + t)["input_ids"] for t in texts]
        assert [o.prompt_token_ids for o in outs] == ids
        for out, ref in zip(outs, rm.reference_hidden(nomic_dir, ids)):
            pooled = ref.mean(0)[:dims]
            _close(out.outputs.embedding, pooled / pooled.norm())
            assert len(out.outputs.embedding) == (dims or rm.HIDDEN)
    with pytest.raises(ValueError, match=r"Matryoshka dimensions \[16, 32, 64\], got 20"):
        llm.embed(texts, pooling_params=PoolingParams(dimensions=20), use_tqdm=False)


@pytest.mark.parametrize("fixture,kwargs", [("nomic_dir", MATRYOSHKA), ("gte_dir", {}),
                                            ("gte_rerank_dir", {})])
def test_bidirectional_gate_is_off(request, shared_llm, fixture, kwargs):
    cfg = shared_llm(request.getfixturevalue(fixture), **kwargs).llm_engine.vllm_config
    assert not cfg.cache_config.enable_prefix_caching
    assert not cfg.scheduler_config.enable_chunked_prefill


def test_nomic_position_limit_is_the_smallest_stated(shared_llm, nomic_dir, monkeypatch):
    """nomic's config.json says n_positions 8192; transformers' NomicBertConfig adds
    max_position_embeddings 2048 (nomic's max_trained_positions). The smallest stated limit
    holds, as upstream reads it; past the tokenizer's 512 with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1,
    past 2048 never."""
    mc = shared_llm(nomic_dir, **MATRYOSHKA).llm_engine.vllm_config.model_config
    assert mc.hf_config.n_positions == 8192
    assert mc._position_limit() == 2048 and mc.max_model_len == 512
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    with pytest.raises(ValueError, match="position limit"):
        LLM(nomic_dir, max_model_len=4096, **MATRYOSHKA)
    long = LLM(nomic_dir, max_model_len=2048, **MATRYOSHKA)
    [out] = long.embed([" ".join(["word"] * 1500)], use_tqdm=False)
    assert len(out.prompt_token_ids) > 1500 and len(out.outputs.embedding) == rm.HIDDEN


def test_gte_cls_states_match_reference(shared_llm, gte_dir):
    llm = shared_llm(gte_dir)
    assert llm.llm_engine.model_config.pooler_config.pooling_type == "CLS"
    outs = llm.embed(_prompts(gte_dir), pooling_params=RAW, use_tqdm=False)
    ids = [o.prompt_token_ids for o in outs]
    for out, ref in zip(outs, rm.reference_hidden(gte_dir, ids)):
        _close(out.outputs.embedding, ref[0])
    # the NTK scaling is really exercised: without it the long prompt's state differs
    longest = max(range(len(ids)), key=lambda j: len(ids[j]))
    plain = rm.reference_hidden(gte_dir, [ids[longest]], ntk=False)[0][0]
    assert mf.cosine(outs[longest].outputs.embedding, plain) < 0.999


def test_gte_reranker_matches_reference(shared_llm, gte_rerank_dir):
    llm = shared_llm(gte_rerank_dir)
    outs = llm.classify(_prompts(gte_rerank_dir), use_tqdm=False)
    refs = rm.reference_logits(gte_rerank_dir, [o.prompt_token_ids for o in outs])
    for out, logit in zip(outs, refs):
        assert mf.max_abs_diff(out.outputs.probs, torch.sigmoid(logit)) <= PROB_TOL
    tok = mf.hf_tokenizer(gte_rerank_dir)
    query, docs = "what is a river", ["a river is water", mf.text_of_length(tok, 150)]
    scores = llm.score(query, docs, use_tqdm=False)
    pairs = [tok(query, d)["input_ids"] for d in docs]
    for out, logit in zip(scores, rm.reference_logits(gte_rerank_dir, pairs)):
        assert abs(out.outputs.score - float(torch.sigmoid(logit)[0])) <= PROB_TOL


def test_gte_reranker_served_as_embedder(shared_llm, gte_rerank_dir):
    """convert='embed' serves the reranker's encoder (its CLS state) without the head."""
    llm = shared_llm(gte_rerank_dir, convert="embed")
    outs = llm.embed(["a river is water"], pooling_params=RAW, use_tqdm=False)
    ref = rm.reference_hidden(gte_rerank_dir, [outs[0].prompt_token_ids])[0][0]
    _close(outs[0].outputs.embedding, ref)


@pytest.mark.parametrize("change,message", [
    ({"prenorm": True}, "prenorm"), ({"rotary_emb_fraction": 0.5}, "partial rotary"),
    ({"activation_function": "gelu"}, "activation_function 'gelu'"),
    ({"moe_every_n_layers": 2}, "moe_every_n_layers")])
def test_nomic_variants_it_does_not_reproduce_are_refused(change, message):
    from vllm.model_executor.models.nomic_bert import nomic_spec
    with pytest.raises(ValueError, match=message):
        nomic_spec(types.SimpleNamespace(**rm.nomic_config(**change)))


def test_reference_equals_transformers_classes(tmp_path):
    """The reference agrees with transformers 5's own NomicBert / Gte classes, which read the
    original tensor names (rope without NTK scaling: transformers has no 'ntk' rope)."""
    ids = mf.hf_tokenizer(mf.MINILM_DIR)(mf.text_of_length(
        mf.hf_tokenizer(mf.MINILM_DIR), 60))["input_ids"]
    extra = {"hidden_size": rm.HIDDEN, "num_attention_heads": rm.HEADS, "num_hidden_layers":
             rm.LAYERS, "intermediate_size": rm.INNER,
             "rope_parameters": {"rope_theta": 500.0, "rope_type": "default"}}
    for name, cfg in (("nomic", rm.nomic_config(**extra)),
                      ("gte", rm.gte_config("GteModel", rope_scaling=None))):
        path = rm.write_checkpoint(tmp_path / name, cfg)
        got = rm.transformers_hidden(path, ids)
        assert mf.max_abs_diff(got, rm.reference_hidden(path, [ids])[0]) < 1e-4, name


@pytest.mark.parametrize("renamed", [False, True])
@pytest.mark.parametrize("arch", ["NomicBertModel", "GteModel"])
def test_checkpoints_saved_by_transformers(tmp_path, arch, renamed):
    """A checkpoint written by transformers 5's own class (standard config keys; tensors
    under the original names, or under transformers' names) equals that class."""
    from vllm import LLM
    path = rm.write_transformers_checkpoint(tmp_path / "m", arch, renamed)
    llm = LLM(model=str(path))
    outs = llm.embed(_prompts(str(path))[:4], pooling_params=RAW, use_tqdm=False)
    for out in outs:
        _close(out.outputs.embedding, rm.transformers_hidden(path, out.prompt_token_ids)[0])


def test_nomic_with_biases(tmp_path):
    """A NomicBERT config with biases (qkv_proj_bias, mlp_fc1_bias, mlp_fc2_bias): the
    gate/up projection then runs unfused."""
    from vllm import LLM
    cfg = rm.nomic_config(qkv_proj_bias=True, mlp_fc1_bias=True, mlp_fc2_bias=True)
    path = str(rm.write_checkpoint(tmp_path / "m", cfg, seed=mf.SEED + 3))
    outs = LLM(model=path).embed(_prompts(path)[:3], pooling_params=RAW, use_tqdm=False)
    refs = rm.reference_hidden(path, [o.prompt_token_ids for o in outs])
    for out, ref in zip(outs, refs):
        _close(out.outputs.embedding, ref[0])


def test_lora_targets(nomic_dir, gte_dir):
    """PEFT module names (the checkpoints' own) land on rows of the fused projections."""
    from transformers import AutoConfig
    from vllm.model_executor.models.gte import GteNewModel
    from vllm.model_executor.models.nomic_bert import NomicBertModel
    h, i = rm.HIDDEN, rm.INNER
    nomic = NomicBertModel(AutoConfig.from_pretrained(nomic_dir))
    gte = GteNewModel(AutoConfig.from_pretrained(gte_dir))
    cases = [(nomic, "encoder.layers.0.attn.Wqkv", "layers.0.qkv", 0, 3 * h),
             (nomic, "encoder.layers.1.mlp.fc12", "layers.1.gate_up", 0, i),
             (nomic, "encoder.layers.1.mlp.fc11", "layers.1.gate_up", i, i),
             (nomic, "encoder.layers.0.attn.out_proj", "layers.0.attn_out", 0, h),
             (gte, "encoder.layer.0.attention.qkv_proj", "layers.0.qkv", 0, 3 * h),
             (gte, "encoder.layer.1.mlp.up_gate_proj", "layers.1.gate_up", 0, 2 * i),
             (gte, "encoder.layer.1.mlp.down_proj", "layers.1.down", 0, h),
             (gte, "layers.0.self_attn.k_proj", "layers.0.qkv", h, h)]
    for model, module, path, offset, rows in cases:
        target = model.lora_target(module)
        assert (target.path, target.offset, target.rows) == (path, offset, rows), module
    swap = gte.lora_target("encoder.layer.0.mlp.up_gate_proj").reorder
    b = torch.arange(2 * i, dtype=torch.float32)[:, None]
    assert torch.equal(swap(b)[:i], b[i:])  # [up; gate] -> our [gate; up]


@pytest.mark.parametrize("arch", ["NomicBertModel", "GteModel"])
def test_lora_adapter_equals_peft(tmp_path, arch):
    """A PEFT adapter on transformers' own class (q/v rows of our fused qkv, rotary rows
    interleaved; gate/up halves of the fused MLP) gives PEFT's numbers."""
    import lora_factory as lf
    from vllm import LLM
    from vllm.lora.request import LoRARequest
    base = str(rm.write_transformers_checkpoint(tmp_path / "m", arch))
    adapter = lf.make_adapter(base, tmp_path / "a", targets=("q_proj", "v_proj", "up_proj",
                                                             "gate_proj", "o_proj"))
    llm = LLM(base, enable_lora=True, max_lora_rank=8)
    prompts = _prompts(base)[:3]
    outs = llm.embed(prompts, pooling_params=RAW, use_tqdm=False,
                     lora_request=LoRARequest("a", 1, adapter))
    for out in outs:
        ref = lf.run(lf.peft_model(base, adapter, "base"), out.prompt_token_ids)[0]
        _close(out.outputs.embedding, ref.double())
    plain = rm.transformers_hidden(base, outs[0].prompt_token_ids)[0]
    assert mf.cosine(outs[0].outputs.embedding, plain) < 0.999  # the adapter mattered


def test_gte_multilingual_config_with_remote_model_type_loads(tmp_path, gte_dir):
    """gte-multilingual-base's own config.json: `model_type: "new"` with an auto_map into
    another repository (no class in transformers). It is read as a plain config (no remote
    code runs, no interactive prompt), and with upstream's documented override
    `architectures: ["GteNewModel"]` gives the same states as the gte-layout checkpoint."""
    import shutil
    from vllm import LLM
    path = tmp_path / "gte-multilingual"
    shutil.copytree(gte_dir, path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(model_type="new", architectures=["NewModel"],
               auto_map={"AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
                         "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"})
    (path / "config.json").write_text(json.dumps(cfg))
    texts = _prompts(gte_dir)[:3]
    llm = LLM(str(path), hf_overrides={"architectures": ["GteNewModel"]})
    got = llm.embed(texts, pooling_params=RAW, use_tqdm=False)
    want = rm.reference_hidden(gte_dir, [o.prompt_token_ids for o in got])
    for out, ref in zip(got, want):
        _close(out.outputs.embedding, ref[0])
