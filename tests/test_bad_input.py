"""Bad input is a ValueError whose message says what to change, and the same LLM keeps
working afterwards. Also: truncate_prompt_tokens and the engine keyword arguments."""
from __future__ import annotations

import pytest

import model_factory as mf
from vllm import LLM, PoolingParams


def _ids(model_dir, text):
    return list(mf.hf_tokenizer(model_dir)(text)["input_ids"])


def _assert_embed_works(llm, model_dir, pooling):
    """A normal call right after an error gives the right numbers."""
    text = "hello world, still working"
    out = llm.embed([text, "a second prompt"], use_tqdm=False)
    assert len(out) == 2
    ref = mf.hf_embedding(model_dir, _ids(model_dir, text), pooling)
    assert mf.cosine(out[0].outputs.embedding, ref) >= 0.9999


def _assert_classify_works(llm, model_dir):
    text = "hello world, still working"
    out = llm.classify([text], use_tqdm=False)
    ref = mf.probs_from_logits(mf.hf_seqcls_logits(model_dir, _ids(model_dir, text)))
    assert mf.max_abs_diff(out[0].outputs.probs, ref) <= 1e-4


def _message(excinfo) -> str:
    return str(excinfo.value).lower()


@pytest.fixture(scope="module")
def bert_llm(shared_llm, bert_embed_dir):
    return shared_llm(bert_embed_dir)


@pytest.fixture(scope="module")
def qwen3_llm(shared_llm, qwen3_embed_dir):
    return shared_llm(qwen3_embed_dir)


# ------------------------------------------------------------------ prompts

def test_empty_prompt_list_returns_empty_list(bert_llm, shared_llm, qwen3_cls_dir):
    assert bert_llm.embed([], use_tqdm=False) == []
    assert bert_llm.encode([], use_tqdm=False) == []
    assert shared_llm(qwen3_cls_dir).classify([], use_tqdm=False) == []


def test_prompt_with_zero_tokens(qwen3_llm, qwen3_embed_dir):
    assert _ids(qwen3_embed_dir, "") == []  # the Qwen-style BPE adds no special tokens
    for prompt in ("", {"prompt_token_ids": []}):
        with pytest.raises(ValueError) as err:
            qwen3_llm.embed([prompt], use_tqdm=False)
        assert "empty" in _message(err) or "no tokens" in _message(err) \
            or "zero" in _message(err)
        _assert_embed_works(qwen3_llm, qwen3_embed_dir, "LAST")
    # and a bad prompt among good ones fails the call without leaving requests behind
    with pytest.raises(ValueError):
        qwen3_llm.embed(["fine", ""], use_tqdm=False)
    _assert_embed_works(qwen3_llm, qwen3_embed_dir, "LAST")


def test_empty_string_is_valid_for_bert(bert_llm, bert_embed_dir):
    out = bert_llm.embed("", use_tqdm=False)
    assert out[0].prompt_token_ids == [101, 102]  # [CLS] [SEP]
    ref = mf.hf_embedding(bert_embed_dir, [101, 102], "CLS")
    assert mf.cosine(out[0].outputs.embedding, ref) >= 0.9999


def test_prompt_over_max_model_len(bert_llm, bert_embed_dir):
    max_len = bert_llm.llm_engine.vllm_config.model_config.max_model_len
    assert max_len == 512
    text = mf.text_of_length(mf.hf_tokenizer(bert_embed_dir), 600)
    n = len(_ids(bert_embed_dir, text))
    for prompt in (text, {"prompt_token_ids": [101] + [7592] * 600 + [102]}):
        with pytest.raises(ValueError) as err:
            bert_llm.embed([prompt], use_tqdm=False)
        msg = _message(err)
        assert "512" in msg
        assert "truncate_prompt_tokens" in msg or "max_model_len" in msg \
            or "maximum context length" in msg
        _assert_embed_works(bert_llm, bert_embed_dir, "CLS")
    assert n > 512


def test_token_ids_outside_vocab(qwen3_llm, qwen3_embed_dir):
    with pytest.raises(ValueError) as err:
        qwen3_llm.embed([{"prompt_token_ids": [1, 2, 10 ** 6]}], use_tqdm=False)
    assert "vocab" in _message(err) or "token id" in _message(err)
    _assert_embed_works(qwen3_llm, qwen3_embed_dir, "LAST")


# ------------------------------------------------------------------ parameters and tasks

def test_dimensions_on_non_matryoshka_model(qwen3_llm, qwen3_embed_dir):
    with pytest.raises(ValueError) as err:
        qwen3_llm.embed(["hello"], pooling_params=PoolingParams(dimensions=16), use_tqdm=False)
    assert "matryoshka" in _message(err) or "dimensions" in _message(err)
    _assert_embed_works(qwen3_llm, qwen3_embed_dir, "LAST")


def test_pooler_dimensions_on_non_matryoshka_model_is_refused_at_load(qwen3_embed_dir):
    with pytest.raises(ValueError, match="matryoshka"):
        LLM(model=qwen3_embed_dir, pooler_config={"dimensions": 16})


def test_dimensions_not_in_matryoshka_list(qwen3_embed_dir):
    llm = LLM(model=qwen3_embed_dir, hf_overrides={"matryoshka_dimensions": [16, 32]})
    with pytest.raises(ValueError) as err:
        llm.embed(["hello"], pooling_params=PoolingParams(dimensions=24), use_tqdm=False)
    assert "16" in _message(err) and "32" in _message(err)
    out = llm.embed(["hello"], pooling_params=PoolingParams(dimensions=32), use_tqdm=False)
    assert len(out[0].outputs.embedding) == 32


def test_classify_parameter_on_embed(qwen3_llm, qwen3_embed_dir):
    with pytest.raises(ValueError) as err:
        qwen3_llm.embed(["hello"], pooling_params=PoolingParams(activation=False),
                        use_tqdm=False)
    msg = _message(err)
    assert "activation" in msg
    assert "dimensions" in msg and "normalize" in msg  # names what embed accepts
    _assert_embed_works(qwen3_llm, qwen3_embed_dir, "LAST")


def test_embed_parameter_on_classify(shared_llm, qwen3_cls_dir):
    llm = shared_llm(qwen3_cls_dir)
    with pytest.raises(ValueError) as err:
        llm.classify(["hello"], pooling_params=PoolingParams(normalize=True), use_tqdm=False)
    assert "normalize" in _message(err) and "activation" in _message(err)
    _assert_classify_works(llm, qwen3_cls_dir)


@pytest.mark.parametrize("fixture", ["qwen3_cls_dir", "xlmr_cls_dir"])
def test_embed_on_classifier_names_the_conversion(request, shared_llm, fixture):
    model_dir = request.getfixturevalue(fixture)
    llm = shared_llm(model_dir)
    with pytest.raises(ValueError) as err:
        llm.embed(["hello"], use_tqdm=False)
    msg = _message(err).replace("'", '"')
    assert 'convert="embed"' in msg or "convert embed" in msg or "--convert embed" in msg
    _assert_classify_works(llm, model_dir)


def test_classify_on_embedding_model(qwen3_llm, qwen3_embed_dir):
    with pytest.raises(ValueError) as err:
        qwen3_llm.classify(["hello"], use_tqdm=False)
    assert "classify" in _message(err)
    _assert_embed_works(qwen3_llm, qwen3_embed_dir, "LAST")


def test_cross_encoder_score_needs_one_label(shared_llm, llama_cls_dir):
    llm = shared_llm(llama_cls_dir)  # two labels
    with pytest.raises(ValueError) as err:
        llm.score("query", ["doc one", "doc two"], use_tqdm=False)
    assert "label" in _message(err)
    _assert_classify_works(llm, llama_cls_dir)


def test_score_pair_shapes(shared_llm, qwen3_cls_dir):
    llm = shared_llm(qwen3_cls_dir)
    with pytest.raises(ValueError):
        llm.score(["q1", "q2"], ["d1", "d2", "d3"], use_tqdm=False)
    # One {"prompt": ...} dict is one text (not its keys), on either side.
    plain = llm.score("a query", ["doc one", "doc two"], use_tqdm=False)
    dicts = llm.score({"prompt": "a query"}, [{"prompt": "doc one"}, "doc two"], use_tqdm=False)
    assert [o.outputs.score for o in dicts] == pytest.approx([o.outputs.score for o in plain])
    one = llm.score({"prompt": "a query"}, {"prompt": "doc two"}, use_tqdm=False)
    assert one[0].outputs.score == pytest.approx(plain[1].outputs.score)
    with pytest.raises(ValueError, match="text prompts"):
        llm.score({"prompt_token_ids": [1, 2]}, "doc", use_tqdm=False)
    _assert_classify_works(llm, qwen3_cls_dir)


def test_unknown_architecture(tmp_path, bert_embed_dir):
    path = mf.copy_checkpoint(bert_embed_dir, tmp_path / "unknown",
                              architectures=["FooBarForMagic"])
    with pytest.raises(ValueError) as err:
        LLM(model=str(path))
    msg = str(err.value)
    assert "FooBarForMagic" in msg
    assert "BertModel" in msg and "Qwen3ForCausalLM" in msg  # lists the supported ones


# ------------------------------------------------------------------ truncate_prompt_tokens

def test_truncate_prompt_tokens_keeps_special_tokens(bert_llm, bert_embed_dir):
    out = bert_llm.embed(["Hello world"], truncate_prompt_tokens=3, use_tqdm=False)[0]
    assert out.prompt_token_ids == [101, 7592, 102]  # [CLS] hello [SEP]
    ref = mf.hf_embedding(bert_embed_dir, [101, 7592, 102], "CLS")
    assert mf.cosine(out.outputs.embedding, ref) >= 0.9999


def test_truncate_prompt_tokens_minus_one_is_max_model_len(bert_llm, bert_embed_dir):
    text = mf.text_of_length(mf.hf_tokenizer(bert_embed_dir), 600)
    out = bert_llm.embed([text], truncate_prompt_tokens=-1, use_tqdm=False)[0]
    assert len(out.prompt_token_ids) == 512
    assert out.prompt_token_ids[0] == 101 and out.prompt_token_ids[-1] == 102
    ref = mf.hf_embedding(bert_embed_dir, out.prompt_token_ids, "CLS")
    assert mf.cosine(out.outputs.embedding, ref) >= 0.9999


def test_truncate_prompt_tokens_above_max_model_len(bert_llm, bert_embed_dir):
    with pytest.raises(ValueError) as err:
        bert_llm.embed(["Hello world"], truncate_prompt_tokens=513, use_tqdm=False)
    assert str(err.value) == ("truncate_prompt_tokens=513 cannot be greater than "
                              "max_model_len = 512. Please request a smaller truncation size.")
    _assert_embed_works(bert_llm, bert_embed_dir, "CLS")


# ------------------------------------------------------------------ engine arguments

def test_unknown_engine_argument_is_named(bert_embed_dir):
    with pytest.raises((ValueError, TypeError)) as err:
        LLM(model=bert_embed_dir, not_a_real_engine_arg=3)
    assert "not_a_real_engine_arg" in str(err.value)


def test_a_lora_request_without_enable_lora_is_refused_not_dropped(bert_llm):
    """On an engine started without enable_lora, `lora_request` must not silently give the
    base model's numbers (issue 26): the error says how to enable it; a value that is not a
    LoRARequest is named; None (or one None per prompt) is upstream's "no adapter"; an
    unknown keyword is named."""
    from vllm.lora.request import LoRARequest
    adapter = LoRARequest("tenant-a", 1, "/adapters/tenant-a")
    calls = {"embed": lambda **kw: bert_llm.embed(["a", "b"], **kw),
             "encode": lambda **kw: bert_llm.encode(["a", "b"], **kw),
             "score": lambda **kw: bert_llm.score("a", ["b", "c"], **kw)}
    for name, call in calls.items():
        with pytest.raises(ValueError, match="LoRA is not enabled.*enable_lora=True"):
            call(lora_request=adapter)
        with pytest.raises(ValueError, match="LoRA is not enabled|one lora_request"):
            call(lora_request=[None, adapter])
        with pytest.raises(ValueError, match="must be a LoRARequest"):
            call(lora_request=("tenant-a", 1, "/adapters/tenant-a"))
        assert len(call(lora_request=None)) == 2
        assert len(call(lora_request=[None, None])) == 2
        with pytest.raises(ValueError, match="not_a_real_kwarg"):
            call(not_a_real_kwarg=1)


def test_tensor_parallel_is_refused(bert_embed_dir):
    with pytest.raises(ValueError) as err:
        LLM(model=bert_embed_dir, tensor_parallel_size=2)
    assert "tensor_parallel_size" in str(err.value)


def test_meaningless_arguments_are_accepted(bert_embed_dir):
    llm = LLM(model=bert_embed_dir, enforce_eager=True, gpu_memory_utilization=0.5, seed=7,
              tensor_parallel_size=1)
    _assert_embed_works(llm, bert_embed_dir, "CLS")


def test_max_model_len_above_model_limit(bert_embed_dir):
    with pytest.raises(ValueError) as err:
        LLM(model=bert_embed_dir, max_model_len=1024)
    assert "max_model_len" in str(err.value) and "512" in str(err.value)


def test_smaller_max_model_len_is_honoured(bert_embed_dir):
    llm = LLM(model=bert_embed_dir, max_model_len=32)
    assert llm.llm_engine.vllm_config.model_config.max_model_len == 32
    text = mf.text_of_length(mf.hf_tokenizer(bert_embed_dir), 40)
    with pytest.raises(ValueError):
        llm.embed([text], use_tqdm=False)
    out = llm.embed([text], truncate_prompt_tokens=-1, use_tqdm=False)[0]
    assert len(out.prompt_token_ids) == 32


def test_truncated_token_ids_keep_their_last_tokens(bert_llm, bert_embed_dir):
    """Token-id prompts with truncate_prompt_tokens=k keep their last k ids, as upstream."""
    ids = list(mf.hf_tokenizer(bert_embed_dir)("the quick brown fox jumps")["input_ids"])
    out = bert_llm.embed([{"prompt_token_ids": ids}], truncate_prompt_tokens=3,
                         use_tqdm=False)[0]
    assert out.prompt_token_ids == ids[-3:]


def test_dimensions_not_in_the_list_use_upstreams_wording(qwen3_embed_dir):
    """Upstream 0.33's words (also /v2/embed's output_dimension, which checks the same)."""
    llm = LLM(model=qwen3_embed_dir, hf_overrides={"matryoshka_dimensions": [16, 32]})
    with pytest.raises(ValueError, match=r"only supports Matryoshka dimensions \[16, 32\], "
                                         r"got 24\.$"):
        llm.embed(["hello"], pooling_params=PoolingParams(dimensions=24), use_tqdm=False)
