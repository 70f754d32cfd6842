from vllm.model_executor.models.decoder import DecoderModel


class Qwen2Model(DecoderModel):
    """Qwen2: QKV projections carry a bias."""

    qkv_bias = True
