from vllm.model_executor.models.decoder import DecoderModel


class LlamaModel(DecoderModel):
    """Llama / Mistral: the plain decoder (`attention_bias` read from the config)."""
