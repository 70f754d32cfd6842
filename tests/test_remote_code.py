"""Checkpoints that ship their own model classes (config.json `auto_map`, a model type
transformers does not know) on the Transformers backend, as upstream serves them with
`trust_remote_code=True`: equal to the same class run by transformers; a class that calls
transformers' attention interface runs on the engine's attention (a causal one with prefix
caching and chunked prefill, exactly), one that computes attention itself runs each
request whole; without `trust_remote_code` the checkpoint is refused, naming the flag, and
a native implementation still wins over the checkpoint's code."""
from __future__ import annotations

import functools
import json
import pathlib

import pytest
import torch

import model_factory as mf
import remote_code_models as rc
from vllm import LLM
from vllm.model_executor.models.transformers_refusals import ArchitectureRefused

ATOL = 1e-4
FLAG = r"trust_remote_code=True.*--trust-remote-code"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("remote_code")


@pytest.fixture(scope="module")
def encoder_dir(root) -> str:
    """A BERT-like encoder calling transformers' attention interface."""
    return rc.write_checkpoint(root / "rc_encoder", "TinyModel", causal=False,
                               own_attention=False, seed=70)


@pytest.fixture(scope="module")
def own_attention_dir(root) -> str:
    """The same encoder computing attention itself (no external attention function)."""
    return rc.write_checkpoint(root / "rc_own_attention", "TinyModel", causal=False,
                               own_attention=True, seed=71)


@pytest.fixture(scope="module")
def classifier_dir(root) -> str:
    """The encoder's own first-token classifier (AutoModelForSequenceClassification)."""
    return rc.write_checkpoint(root / "rc_classifier", "TinyForSequenceClassification",
                               causal=False, own_attention=False, seed=72, num_labels=3)


@pytest.fixture(scope="module")
def decoder_dir(root) -> str:
    """A GPT-like causal LM (grouped-query attention) through the attention interface."""
    return rc.write_checkpoint(root / "rc_decoder", "TinyForCausalLM", causal=True,
                               own_attention=False, seed=73, num_key_value_heads=2)


@functools.lru_cache(maxsize=None)
def _tokenizer(path: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, trust_remote_code=True)


def _prompts(path: str, lengths=(3, 70, 17, 41)) -> list[str]:
    return mf.mixed_prompts(_tokenizer(path), lengths)


def _pooled(path: str, token_ids, pooling: str) -> torch.Tensor:
    states = rc.reference_states(path, token_ids)
    return torch.nn.functional.normalize(states[0 if pooling == "CLS" else -1], dim=-1)


def _check_embeddings(got, ref: torch.Tensor) -> None:
    got = torch.as_tensor(got)
    assert mf.cosine(got, ref) >= 0.9999
    assert abs(got.norm().item() / ref.norm().item() - 1) <= 1e-3


def _backend_warnings(vllm_log) -> list[str]:
    return [r.getMessage() for r in vllm_log.records
            if r.levelname == "WARNING" and "Transformers backend" in r.getMessage()]


@pytest.mark.parametrize("name,whole", [("encoder_dir", False), ("own_attention_dir", True)])
def test_remote_encoder_embeddings_equal_transformers(name, whole, request, vllm_log):
    """CLS embeddings equal the checkpoint's class run by transformers. The interface
    class takes the engine's attention (bidirectional, no cache); the class computing its
    own runs each request whole, with one WARNING."""
    path = request.getfixturevalue(name)
    llm = LLM(path, dtype="float32", trust_remote_code=True)
    cfg = llm.llm_engine.vllm_config
    mc = cfg.model_config
    assert mc.impl == "transformers" and mc.remote_code is not None
    assert type(mc.hf_config).__name__ == "TinyRemoteConfig"  # its own config class
    assert "checkpoint's own code modeling_tiny.TinyModel" in vllm_log.text
    assert mc.whole_sequences is whole and mc.pooler_config.pooling_type == "CLS"
    assert not cfg.cache_config.enable_prefix_caching
    assert not cfg.scheduler_config.enable_chunked_prefill
    assert len(_backend_warnings(vllm_log)) == (1 if whole else 0)
    assert len(llm.llm_engine.runner.model.model.attention_layers()) == (0 if whole else 2)
    for out in llm.embed(_prompts(path), use_tqdm=False):
        _check_embeddings(out.outputs.embedding, _pooled(path, out.prompt_token_ids, "CLS"))


def test_remote_classifier_equals_transformers(classifier_dir):
    """The checkpoint's own *ForSequenceClassification head over the engine's CLS row
    equals transformers' probabilities."""
    llm = LLM(classifier_dir, dtype="float32", trust_remote_code=True)
    mc = llm.llm_engine.vllm_config.model_config
    assert mc.impl == "transformers" and mc.convert == "classify"
    assert mc.pooler_config.pooling_type == "CLS"
    for out in llm.classify(_prompts(classifier_dir), use_tqdm=False):
        ref = mf.probs_from_logits(rc.reference_logits(classifier_dir, out.prompt_token_ids))
        assert mf.max_abs_diff(torch.tensor(out.outputs.probs), ref) <= ATOL


def test_remote_decoder_last_cached_and_chunked(decoder_dir):
    """A causal LM of the checkpoint's own code, served as LAST embeddings: prefix caching
    and chunked prefill on by default; the chunked pass, the cached rerun and a whole run
    with both off all equal transformers."""
    llm = LLM(decoder_dir, dtype="float32", trust_remote_code=True,
              max_num_batched_tokens=32, block_size=16)
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.impl == "transformers" and cfg.model_config.is_causal
    assert cfg.cache_config.enable_prefix_caching and cfg.scheduler_config.enable_chunked_prefill
    shared = mf.text_of_length(_tokenizer(decoder_dir), 40, seed=3)
    prompts = [shared + " " + p for p in _prompts(decoder_dir)]
    first = llm.embed(prompts, use_tqdm=False)
    second = llm.embed(prompts, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in second)
    assert llm.llm_engine.stats.num_split_requests > 0
    whole = LLM(decoder_dir, dtype="float32", trust_remote_code=True,
                enable_prefix_caching=False, enable_chunked_prefill=False)
    for a, b, c in zip(first, second, whole.embed(prompts, use_tqdm=False)):
        assert c.num_cached_tokens == 0
        assert mf.max_abs_diff(a.outputs.embedding, c.outputs.embedding) <= ATOL
        assert mf.max_abs_diff(b.outputs.embedding, c.outputs.embedding) <= ATOL
        _check_embeddings(a.outputs.embedding, _pooled(decoder_dir, a.prompt_token_ids, "LAST"))


@pytest.mark.parametrize("name", ["encoder_dir", "decoder_dir"])
def test_refused_without_trust_remote_code(name, request):
    """Never run silently: the refusal names the flag (upstream asks for it too)."""
    with pytest.raises(ArchitectureRefused, match=FLAG) as info:
        LLM(request.getfixturevalue(name))
    assert info.value.kind == "remote-code"


def test_serve_flag_reaches_the_backend(encoder_dir):
    """`vllm serve --trust-remote-code` sets it on the engine; without it: refused."""
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace, parse_serve_args
    args = parse_serve_args(["--model", encoder_dir, "--trust-remote-code"])
    engine_args = engine_args_from_namespace(args)
    assert engine_args.trust_remote_code is True
    assert engine_args.create_engine_config().model_config.impl == "transformers"
    plain = engine_args_from_namespace(parse_serve_args(["--model", encoder_dir]))
    with pytest.raises(ValueError, match=FLAG):
        plain.create_engine_config()


def test_native_class_wins_over_the_checkpoints_code(tmp_path, vllm_log):
    """A NomicBert checkpoint with an auto_map stays native under trust_remote_code=True
    (its code, in another repository, is never fetched or run); the log says why."""
    import rope_encoder_models as rm
    from vllm.engine.arg_utils import EngineArgs
    auto_map = {"AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert."
                              "NomicBertConfig",
                "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"}
    path = rm.write_checkpoint(tmp_path / "nomic", rm.nomic_config(auto_map=auto_map))
    assert json.loads((path / "config.json").read_text())["auto_map"] == auto_map
    mc = EngineArgs(model=str(path), trust_remote_code=True).create_engine_config().model_config
    assert mc.impl == "vllm" and mc.remote_code is None
    assert "natively; the checkpoint's own code (auto_map) is not run" in vllm_log.text
