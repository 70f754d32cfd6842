"""What LoRA support refuses, with errors that name the problem (issue 26 A1, A2), and an
engine that keeps serving after a refused adapter."""
from __future__ import annotations

import pytest
import torch

import lora_factory as lf
import model_factory as mf
from test_lora import DECODER
from vllm import LLM
from vllm.lora.request import LoRARequest


@pytest.fixture(scope="module")
def qwen3_lora_llm(qwen3_embed_dir):
    return LLM(qwen3_embed_dir, enable_lora=True, max_loras=2, max_lora_rank=8)


def _adapter(base, path, lora_id: int = 1, **kw) -> LoRARequest:
    kw.setdefault("targets", ("q_proj", "v_proj"))
    return LoRARequest(path.name, lora_id, lf.make_adapter(base, path, **kw))


def _ref(base, lora, ids) -> torch.Tensor:
    model = lf.peft_model(base, lora.lora_path, "base") if lora else lf._load(base, "base")
    return torch.nn.functional.normalize(lf.run(model, ids)[-1], dim=-1)


def test_rank_above_max_fails_that_call_and_the_engine_keeps_serving(
        qwen3_lora_llm, qwen3_embed_dir, tmp_path):
    llm = qwen3_lora_llm
    big = _adapter(qwen3_embed_dir, tmp_path / "r16", 7, r=16, targets=DECODER)
    good = _adapter(qwen3_embed_dir, tmp_path / "r4", 8, r=4)
    with pytest.raises(ValueError, match=r"^LoRA rank 16 is greater than max_lora_rank 8\.$"):
        llm.embed(["hello world"], lora_request=big, use_tqdm=False)
    with pytest.raises(ValueError, match="LoRA rank 16 is greater than max_lora_rank 8"):
        llm.embed(["hello world", "a cat"], lora_request=[good, big], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert 7 not in llm.llm_engine.list_loras()
    outs = llm.embed(["hello world", "a cat"], lora_request=[good, None], use_tqdm=False)
    for out, lora in zip(outs, [good, None]):
        assert mf.max_abs_diff(out.outputs.embedding,
                               _ref(qwen3_embed_dir, lora, out.prompt_token_ids)) <= 1e-4


@pytest.mark.parametrize("edits,message", [
    ({"use_dora": True}, "DoRA adapters"),
    ({"bias": "all"}, "Adapter bias is not supported"),
    ({"lora_bias": True}, r"LoRA bias \(lora_bias: true\)"),
    ({"modules_to_save": ["embed_tokens"]}, r"unsupported modules_to_save: \['embed_tokens'\]"),
    ({"init_lora_weights": "pissa"}, "init_lora_weights='pissa'"),
    ({"peft_type": "IA3"}, "not a LoRA adapter"),
])
def test_unsupported_adapter_features_are_named(qwen3_lora_llm, qwen3_embed_dir, tmp_path,
                                                edits, message):
    lora = _adapter(qwen3_embed_dir, tmp_path / "bad", 20, config_edits=edits)
    with pytest.raises(ValueError, match=message):
        qwen3_lora_llm.embed(["hello"], lora_request=lora, use_tqdm=False)


def test_adapters_that_do_not_fit_the_model_are_named(qwen3_lora_llm, qwen3_embed_dir,
                                                      qwen2_embed_dir, qwen3_cls_dir,
                                                      tmp_path):
    llm = qwen3_lora_llm
    lm_head = _adapter(qwen3_embed_dir, tmp_path / "lm", 30, kind="causal",
                       targets=("q_proj", "lm_head"))
    with pytest.raises(ValueError, match="targets 'lm_head', which is not a projection"):
        llm.embed(["hello"], lora_request=lm_head, use_tqdm=False)
    other_base = _adapter(qwen2_embed_dir, tmp_path / "q2", 31)
    with pytest.raises(ValueError, match="trained on this base model"):
        llm.embed(["hello"], lora_request=other_base, use_tqdm=False)
    head = _adapter(qwen3_cls_dir, tmp_path / "head", 32, kind="seqcls",
                    modules_to_save=["score"])
    with pytest.raises(ValueError, match="has no classification head"):
        llm.embed(["hello"], lora_request=head, use_tqdm=False)
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("x", 0, str(tmp_path))
    missing = LoRARequest("missing", 33, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="No adapter_config.json"):
        llm.embed(["hello"], lora_request=missing, use_tqdm=False)
    assert len(llm.embed(["hello"], use_tqdm=False)) == 1


def test_engine_options_that_cannot_take_adapters(qwen3_embed_dir, deberta_ce_dir):
    with pytest.raises(ValueError, match="quantization='int8'"):
        LLM(qwen3_embed_dir, enable_lora=True, quantization="int8")
    with pytest.raises(ValueError, match="not supported on DebertaV2"):
        LLM(deberta_ce_dir, enable_lora=True)
    with pytest.raises(ValueError, match=r"max_cpu_loras \(1\) must be >= max_loras \(2\)"):
        LLM(qwen3_embed_dir, enable_lora=True, max_loras=2, max_cpu_loras=1)
