"""LoRA adapters on sequence classifiers and cross-encoders (issue 26 A2, A6).

An adapter trained with PEFT's `modules_to_save` on the classifier (`classifier` for the
encoders, `score` for the decoders) brings its own head: only its requests use it, in the
same step as the base model's and other adapters' requests. Encoder classifiers and
cross-encoders take adapters too (upstream refuses them).
"""
from __future__ import annotations

import pytest
import torch

import lora_factory as lf
import model_factory as mf
from test_lora import BERT, DECODER, MODERNBERT
from vllm import LLM
from vllm.lora.request import LoRARequest

ATOL = 1e-4
# fixture -> (targets, the head PEFT saves)
CLASSIFIERS = {
    "qwen3_cls_dir": (DECODER, "score"),
    "llama_cls_dir": (("q_proj", "v_proj", "o_proj"), "score"),
    "gemma3_cls_dir": (DECODER, "score"),
    "bert_cls3_dir": (BERT, "classifier"),
    "xlmr_cls_dir": (BERT, "classifier"),
    "modernbert_cls_dir": (MODERNBERT, "classifier"),
}


def _two_adapters(base: str, tmp_path, targets, head: str) -> list[LoRARequest]:
    """One adapter that replaces the head, one that keeps the base head."""
    return [LoRARequest(f"h{i}", i + 1, lf.make_adapter(
        base, tmp_path / f"h{i}", kind="seqcls", targets=targets, seed=10 + i,
        modules_to_save=[head] if i == 0 else None)) for i in range(2)]


def _probs(base: str, lora, ids) -> list[torch.Tensor]:
    """[PEFT, hand-merged] probabilities (the base model twice when `lora` is None)."""
    if lora is None:
        models = [lf._load(base, "seqcls")] * 2
    else:
        models = [m(base, lora.lora_path, "seqcls") for m in (lf.peft_model, lf.merged_model)]
    return [mf.probs_from_logits(lf.run(m, ids)) for m in models]


@pytest.mark.parametrize("fixture", list(CLASSIFIERS))
def test_classify_mixes_adapter_heads_and_the_base(fixture, request, tmp_path):
    base = request.getfixturevalue(fixture)
    targets, head = CLASSIFIERS[fixture]
    own_head, plain = _two_adapters(base, tmp_path, targets, head)
    llm = LLM(base, enable_lora=True, max_loras=2, max_lora_rank=8)
    prompts = mf.mixed_prompts(mf.hf_tokenizer(base), lengths=(4, 40, 11, 25, 7, 60))
    loras = [own_head, None, plain, own_head, None, plain]
    outs = llm.classify(prompts, lora_request=loras, use_tqdm=False)
    for out, lora in zip(outs, loras):
        for ref in _probs(base, lora, out.prompt_token_ids):
            assert mf.max_abs_diff(out.outputs.probs, ref) <= ATOL, (fixture, lora)
    # the saved head mattered: the same prompt under the head adapter and the plain one
    again = llm.classify([prompts[0]] * 2, lora_request=[own_head, plain], use_tqdm=False)
    assert mf.max_abs_diff(again[0].outputs.probs, again[1].outputs.probs) > 1e-4


@pytest.mark.parametrize("fixture", ["xlmr_cls_dir", "modernbert_cls_dir", "qwen3_cls_dir"])
def test_cross_encoder_score_with_one_adapter_per_pair(fixture, request, tmp_path):
    base = request.getfixturevalue(fixture)
    targets, head = CLASSIFIERS[fixture]
    own_head, plain = _two_adapters(base, tmp_path, targets, head)
    llm = LLM(base, enable_lora=True, max_loras=2, max_lora_rank=8)
    docs = ["the quick brown fox", "a cat on the mountain", "water is blue", "paris"]
    loras = [own_head, None, plain, own_head]
    outs = llm.score("which city is large", docs, lora_request=loras, use_tqdm=False)
    for out, lora in zip(outs, loras):
        ref = _probs(base, lora, out.prompt_token_ids)[0]
        assert abs(out.outputs.score - float(ref[0])) <= ATOL, (fixture, lora)
    single = llm.score("which city is large", docs, lora_request=own_head, use_tqdm=False)
    assert [o.outputs.score for o in single][0] == pytest.approx(outs[0].outputs.score,
                                                                abs=1e-6)
