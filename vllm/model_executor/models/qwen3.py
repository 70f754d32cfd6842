from vllm.model_executor.models.decoder import DecoderModel


class Qwen3Model(DecoderModel):
    """Qwen3: per-head RMSNorm on queries and keys before rotary; explicit head_dim."""

    qk_norm = True
