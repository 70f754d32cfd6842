"""Every pooling architecture name upstream vLLM 0.33 registers resolves here, at config
level (no weights): natively, on the Transformers backend, or with a ValueError whose `kind`
names the reason (vllm/model_executor/models/transformers_refusals.py)."""
from __future__ import annotations

import collections
import functools

import pytest

from vllm.model_executor.models.registry import convert_architecture
from vllm.model_executor.models.transformers_arch import (convert_backend_architecture,
                                                          resolve_model_impl)
from vllm.model_executor.models.transformers_refusals import ArchitectureRefused

# Gathered from upstream vLLM 0.33's vllm/model_executor/models/registry.py: the keys of
# _EMBEDDING_MODELS (with the _TEXT_GENERATION_MODELS entries it copies, those served by
# Llama's code), _LATE_INTERACTION_MODELS, _REWARD_MODELS, _TOKEN_CLASSIFICATION_MODELS and
# _SEQUENCE_CLASSIFICATION_MODELS, in that order, without repeats.
POOLING_NAMES = """
BertModel BertForMaskedLM BertSpladeSparseEmbeddingModel BgeM3EmbeddingModel
DeciLMForCausalLM DeepseekV3BidirectionalModel Gemma2Model Gemma3TextModel GteModel
GteNewModel JinaEmbeddingsV5Model Lfm2BidirectionalModel LlamaBidirectionalModel LlamaModel
InternLM3ForCausalLM IQuestCoderForCausalLM LlamaForCausalLM LLaMAForCausalLM
TeleChat3ForCausalLM MistralModel ModernBertModel NomicBertModel Phi3ForCausalLM Qwen2Model
Qwen2ForCausalLM RobertaForMaskedLM RobertaModel TeleChat2ForCausalLM
VoyageQwen3BidirectionalEmbedModel XLMRobertaModel CLIPModel ColPaliForRetrieval
EmbeddingGemma2Model LlamaNemotronVLModel LlavaNextForConditionalGeneration
Phi3VForCausalLM Qwen2VLForConditionalGeneration SiglipModel Terratorch HF_ColBERT
ColBERTModernBertModel ColBERTJinaRobertaModel ColBERTLfm2Model JinaForRanking
ColModernVBertForRetrieval ColUltraVBertForRetrieval ModernVBertModel ColQwen3
OpsColQwen3Model ColQwen3_5 Qwen3VLNemotronEmbedModel InternLM2ForRewardModel
Qwen2ForRewardModel Qwen2ForProcessRewardModel BertForTokenClassification
ClefFlashForJointSchema ClefOmniForJointSchema ModernBertForTokenClassification
OpenAIPrivacyFilterForTokenClassification Qwen3ASRForcedAlignerForTokenClassification
RobertaForTokenClassification XLMRobertaForTokenClassification
BertForSequenceClassification GPT2ForSequenceClassification GteNewForSequenceClassification
JambaForSequenceClassification LlamaBidirectionalForSequenceClassification
ModernBertForSequenceClassification RobertaForSequenceClassification
XLMRobertaForSequenceClassification D3ForSequenceClassification JinaVLForRanking
LlamaNemotronVLForSequenceClassification
""".split()

# The generation architectures of the same registry (_TEXT_GENERATION_MODELS,
# _MULTIMODAL_MODELS, _TRANSFORMERS_SUPPORTED_MODELS) with a suffix upstream's
# as_embedding_model / as_seq_cls_model convert (--convert embed|classify): *ForCausalLM,
# *ForConditionalGeneration, *LMHeadModel, *ChatModel; names already above left out.
CONVERTIBLE_NAMES = """
AfmoeForCausalLM AliceAIForCausalLM ApertusForCausalLM AXK1ForCausalLM
BailingMoeForCausalLM BailingMoeV2ForCausalLM BailingMoeV2_5ForCausalLM
BailingMoeV3ForCausalLM BeamForCausalLM BloomForCausalLM ChatGLMForConditionalGeneration
CohereForCausalLM Cohere2ForCausalLM Cohere2MoeForCausalLM DbrxForCausalLM
DeepseekForCausalLM DeepseekV2ForCausalLM DeepseekV3ForCausalLM DeepseekV32ForCausalLM
DeepseekV4ForCausalLM DomynEdgeForCausalLM DoryForCausalLM Ernie4_5ForCausalLM
Ernie4_5_MoeForCausalLM ExaoneForCausalLM Exaone4ForCausalLM ExaoneMoeForCausalLM
ExaoneMoEForCausalLM FalconForCausalLM FalconMambaForCausalLM FalconH1ForCausalLM
FlintForCausalLM GemmaForCausalLM Gemma2ForCausalLM Gemma3ForCausalLM Rnj1ForCausalLM
Gemma3nForCausalLM Gemma4ForCausalLM Qwen3NextForCausalLM Qwen4ExpForCausalLM
Glm4ForCausalLM Glm4MoeForCausalLM Glm4MoeLiteForCausalLM GlmMoeDsaForCausalLM
Glm5NextForCausalLM GptOssForCausalLM GPT2LMHeadModel GPTJForCausalLM GraniteForCausalLM
GraniteMoeForCausalLM GraniteMoeHybridForCausalLM GraniteMoeSharedForCausalLM
GraniteMoeSWAForCausalLM GraniteSWAForCausalLM HrmTextForCausalLM HYV3ForCausalLM
HYV4ForCausalLM HCXVisionV2ForCausalLM HyperCLOVAXForCausalLM InternLM2ForCausalLM
IQuestLoopCoderForCausalLM JambaForCausalLM K2HorizonForCausalLM KimiLinearForCausalLM
Lfm2ForCausalLM Lfm2MoeForCausalLM LagunaForCausalLM Llama4ForCausalLM
LongcatFlashForCausalLM LongcatFlashNgramForCausalLM MambaForCausalLM Mamba2ForCausalLM
MiniCPMForCausalLM MiniCPM3ForCausalLM MiniMaxM2ForCausalLM MiniMaxM3SparseForCausalLM
InklingForCausalLM InklingForConditionalGeneration Ministral3ForCausalLM MistralForCausalLM
MistralLarge3ForCausalLM MixtralForCausalLM MiMoForCausalLM MiMoV2FlashForCausalLM
MiMoV2ForCausalLM NemotronForCausalLM NemotronHForCausalLM NemotronHPuzzleForCausalLM
MuseGlimmerForCausalLM OlmoHybridForCausalLM OlmoeForCausalLM OPTForCausalLM
OrionForCausalLM PanguEmbeddedForCausalLM PanguProMoEV2ForCausalLM PanguUltraMoEForCausalLM
Param2MoEForCausalLM PhiMoEForCausalLM Plamo3ForCausalLM Qwen2MoeForCausalLM
Qwen3ForCausalLM Qwen3MoeForCausalLM Qwen3_5ForCausalLM Qwen3_5MoeForCausalLM
SarvamMoEForCausalLM SarvamMLAForCausalLM Step1ForCausalLM Step3TextForCausalLM
Step3p5ForCausalLM Step5ForCausalLM StableLmForCausalLM SolarForCausalLM TeleFLMForCausalLM
Zamba2ForCausalLM AriaForConditionalGeneration AudioFlamingo3ForConditionalGeneration
BagelForConditionalGeneration BailingMoeV3VLForConditionalGeneration
BeeForConditionalGeneration Blip2ForConditionalGeneration
Cohere2VisionForConditionalGeneration CohereCompassForConditionalGeneration
Cosmos3ForConditionalGeneration Cosmos3EdgeForConditionalGeneration DeepseekVLV2ForCausalLM
DeepseekOCRForCausalLM DeepseekOCR2ForCausalLM DeepseekV4ForConditionalGeneration
DeepseekV41ForCausalLM Dots3NoteForCausalLM UnlimitedOCRForCausalLM DotsOCRForCausalLM
Eagle2_5_VLForConditionalGeneration Ernie4_5_VLMoeForConditionalGeneration
Exaone4_5_ForConditionalGeneration FireRedASR2ForConditionalGeneration
FunASRForConditionalGeneration FunAudioChatForConditionalGeneration
Gemma3ForConditionalGeneration Gemma3nForConditionalGeneration
Gemma4ForConditionalGeneration Gemma4UnifiedForConditionalGeneration
GlmAsrForConditionalGeneration GLM4VForCausalLM Glm4vForConditionalGeneration
Glm4vMoeForConditionalGeneration GlmOcrForConditionalGeneration
Glm5NextForConditionalGeneration GraniteSpeechForConditionalGeneration
GraniteSpeechPlusForConditionalGeneration Granite4VisionForConditionalGeneration
H2OVLChatModel InternVLChatModel InternS1ForConditionalGeneration
InternVLForConditionalGeneration InternS1ProForConditionalGeneration
InternS2MobiusForConditionalGeneration InternS2PreviewForConditionalGeneration
Idefics3ForConditionalGeneration IsaacForConditionalGeneration
KananaVForConditionalGeneration KeyeForConditionalGeneration
KeyeVL1_5ForConditionalGeneration KimiVLForConditionalGeneration
KimiK25ForConditionalGeneration KimiK3ForConditionalGeneration MoonshotKimiaForCausalLM
MossTranscribeDiarizeForConditionalGeneration LightOnOCRForConditionalGeneration
Lfm2VlForConditionalGeneration Llama4ForConditionalGeneration LlavaForConditionalGeneration
LlavaNextVideoForConditionalGeneration LlavaOnevisionForConditionalGeneration
LlavaOnevision2ForConditionalGeneration MiMoV2OmniForCausalLM
MiniMaxM3SparseForConditionalGeneration MiniCPMOcrForConditionalGeneration
MiniCPMV4_6ForConditionalGeneration MiniCPMV4_7ForConditionalGeneration
Mistral3ForConditionalGeneration MolmoForCausalLM Molmo2ForConditionalGeneration
Moondream3ForCausalLM MuseGlimmerForConditionalGeneration MuseSparkForConditionalGeneration
OpenCUAForConditionalGeneration OpenPanguVLForConditionalGeneration Ovis2_6ForCausalLM
Ovis2_6_MoeForCausalLM PaddleOCRVLForConditionalGeneration
PaliGemmaForConditionalGeneration Phi4MMForCausalLM PixtralForConditionalGeneration
QianfanOCRForConditionalGeneration Qwen2_5_VLForConditionalGeneration
Qwen2AudioForConditionalGeneration Qwen2_5OmniForConditionalGeneration
Qwen3OmniMoeForConditionalGeneration Qwen3ASRForConditionalGeneration
Qwen3VLForConditionalGeneration Qwen3VLMoeForConditionalGeneration
Qwen3_5ForConditionalGeneration Qwen3_5MoeForConditionalGeneration
Qwen4ExpForConditionalGeneration RForConditionalGeneration SkyworkR1VChatModel
SmolVLMForConditionalGeneration StepVLForConditionalGeneration
Step3VLForConditionalGeneration Step3p7ForConditionalGeneration
Step5ForConditionalGeneration VoxtralForConditionalGeneration
CohereAsrForConditionalGeneration NemotronParseForConditionalGeneration
RadioMBartPrefixForCausalLM WhisperForConditionalGeneration ArceeForCausalLM CwmForCausalLM
FlexOlmoForCausalLM GlmForCausalLM GPTBigCodeForCausalLM GPTNeoXForCausalLM
HunYuanDenseV1ForCausalLM HunYuanMoEV1ForCausalLM Jais2ForCausalLM Kolibri1ForCausalLM
MellumForCausalLM NanbeigeForCausalLM OlmoForCausalLM Olmo2ForCausalLM Olmo3ForCausalLM
PhiForCausalLM SeedOssForCausalLM SmolLM3ForCausalLM Starcoder2ForCausalLM
VaultGemmaForCausalLM Emu3ForConditionalGeneration HunYuanVLForConditionalGeneration
VibeVoiceAsrForConditionalGeneration
""".split()


@functools.lru_cache(maxsize=1)
def _model_types() -> dict[str, str]:
    """transformers class name -> its model type, from the auto classes' tables."""
    from transformers.models.auto import modeling_auto
    found: dict[str, str] = {}
    for name in dir(modeling_auto):
        table = getattr(modeling_auto, name)
        if not (name.endswith("_MAPPING_NAMES") and isinstance(table, dict)):
            continue
        for model_type, classes in table.items():
            for cls in classes if isinstance(classes, (list, tuple)) else (classes,):
                found.setdefault(cls, model_type)
    return found


def _config(arch: str):
    """A default config of the class's model type (None where transformers lacks it)."""
    from transformers import AutoConfig
    model_type = _model_types().get(arch)
    if model_type is None:
        return None
    config = AutoConfig.for_model(model_type)
    config.architectures = [arch]
    return config


def resolve(arch: str, convert: str | None = None) -> tuple[str, str]:
    """("vllm" | "transformers", the convert served) or ("refused", the refusal's kind)."""
    try:
        resolved, impl, _ = resolve_model_impl(arch, "auto", _config(arch))
        if convert is not None:
            resolved = (convert_backend_architecture if impl == "transformers"
                        else convert_architecture)(resolved, convert)
    except ArchitectureRefused as exc:
        assert arch in str(exc) and len(str(exc)) > 80, str(exc)  # names it, says why
        return "refused", exc.kind
    return impl, resolved.native_convert


def _tally(names, convert=None) -> tuple[collections.Counter, collections.Counter]:
    impls, kinds = collections.Counter(), collections.Counter()
    for name in names:
        impl, detail = resolve(name, convert)
        impls[impl] += 1
        if impl == "refused":
            kinds[detail] += 1
    return impls, kinds


def test_the_lists_are_upstreams():
    assert len(POOLING_NAMES) == len(set(POOLING_NAMES)) == 73
    assert len(CONVERTIBLE_NAMES) == len(set(CONVERTIBLE_NAMES)) == 240
    assert not set(POOLING_NAMES) & set(CONVERTIBLE_NAMES)


def test_every_upstream_pooling_name_resolves_or_says_why():
    impls, kinds = _tally(POOLING_NAMES)
    # Native since issue 36: BertForMaskedLM, RobertaForMaskedLM, NomicBertModel, GteModel
    # (were on the Transformers backend), GteNewModel, GteNewForSequenceClassification (no
    # class) and LlamaBidirectionalModel / ...ForSequenceClassification (bidirectional);
    # ColBERTJinaRobertaModel (no class: jina-colbert-v2's code is remote).
    assert impls == {"vllm": 42, "transformers": 6, "refused": 25}
    assert kinds == {"no-class": 20, "bidirectional-variant": 2, "no-pooling-class": 2,
                     "multimodal": 1}


@pytest.mark.parametrize("convert", ["embed", "classify"])
def test_every_upstream_generation_name_converts_or_says_why(convert):
    impls, kinds = _tally(CONVERTIBLE_NAMES, convert)
    # Native since issue 36: Qwen3VLForConditionalGeneration (was refused as multimodal).
    assert impls == {"vllm": 5, "transformers": 92, "refused": 143}
    assert kinds == {"no-class": 88, "multimodal": 53, "encoder-decoder": 2}


@pytest.mark.parametrize("arch,expected", [
    ("LlamaForCausalLM", ("vllm", "embed")),
    ("LLaMAForCausalLM", ("vllm", "embed")),           # upstream serves it with Llama's code
    ("Qwen2ForProcessRewardModel", ("vllm", "reward")),
    ("Phi3ForCausalLM", ("transformers", "embed")),
    ("GPT2ForSequenceClassification", ("transformers", "classify")),
    ("NomicBertModel", ("vllm", "embed")),
    ("BertForMaskedLM", ("vllm", "embed")),            # as upstream, an embedding model
    ("RobertaForMaskedLM", ("vllm", "embed")),
    ("MPNetModel", ("vllm", "embed")),                 # upstream serves no MPNet
    ("MPNetForSequenceClassification", ("vllm", "classify")),
    ("LlamaBidirectionalModel", ("vllm", "embed")),    # llama-nemotron-embed
    ("LlamaBidirectionalForSequenceClassification", ("vllm", "classify")),
    ("Gemma3ForConditionalGeneration", ("transformers", "embed")),  # text only, verified
    ("GteNewModel", ("vllm", "embed")),
    ("GteModel", ("vllm", "embed")),                   # arctic-embed-m-v2.0, GTE's code
    ("GteNewForSequenceClassification", ("vllm", "classify")),
    ("JinaEmbeddingsV5Model", ("refused", "no-class")),  # its code ships with the checkpoint
    ("Lfm2BidirectionalModel", ("refused", "bidirectional-variant")),
    ("PaliGemmaForConditionalGeneration", ("refused", "multimodal")),  # a prefix-LM
    ("WhisperForConditionalGeneration", ("refused", "encoder-decoder")),
    ("ColPaliForRetrieval", ("refused", "no-pooling-class")),
])
def test_examples(arch, expected):
    assert resolve(arch) == expected


def test_a_converted_causal_lm_takes_every_task_head():
    assert resolve("Olmo2ForCausalLM", "classify") == ("transformers", "classify")
    assert resolve("GPT2LMHeadModel", "reward") == ("transformers", "reward")
    assert resolve("Gemma3ForConditionalGeneration", "classify") == ("transformers", "classify")


def test_the_refusal_message_points_at_a_way_out():
    with pytest.raises(ValueError, match=r"trust_remote_code.*hf_overrides"):
        resolve_model_impl("JinaEmbeddingsV5Model", "auto", None)
    with pytest.raises(ValueError, match=r"'is_causal': False.*pooling"):
        resolve_model_impl("Lfm2BidirectionalModel", "auto", None)
