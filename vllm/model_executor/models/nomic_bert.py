"""NomicBERT (nomic-embed-text v1 / v1.5, snowflake-arctic-embed-m-long): a post-norm
BERT with rotary positions, a SwiGLU MLP and (in the released checkpoints) no biases.

The checkpoints ship their own modeling code, whose config spells the sizes GPT-2's way
(`n_embd`, `n_head`, `n_layer`, `n_inner`, `layer_norm_epsilon`, `rotary_emb_base`, ...).
transformers 5 reads the same config.json as its own `NomicBertConfig`, which ignores
those keys and keeps its defaults, so the original keys win here and the standard names
are only the fallback (a checkpoint saved in transformers' own layout). Tensor names are
the original ones (`emb_ln`, `encoder.layers.N.attn.Wqkv`, `mlp.fc11` = up, `mlp.fc12` =
gate, `norm1`/`norm2`) or transformers' (`layers.N.self_attn.q_proj`, ...).
"""
from __future__ import annotations

from typing import Any, Optional

from vllm.model_executor.models.rope_encoder import (TRANSFORMERS_LAYER_NAMES, EncoderSpec,
                                                     RopeEncoderModel)
from vllm.model_executor.layers.rotary import rope_parameters

# activation_function -> the gate's activation (SwiGLU: silu; GeGLU: gelu)
_GATED = {"swiglu": "silu", "geglu": "gelu"}

_NOMIC_LAYER_NAMES: dict[str, tuple[str, Optional[int]]] = {
    "attn.Wqkv": ("qkv", None), "attn.out_proj": ("attn_out", None),
    "norm1": ("attn_norm", None), "mlp.fc12": ("gate_up", 0), "mlp.fc11": ("gate_up", 1),
    "mlp.fc2": ("down", None), "norm2": ("mlp_norm", None),
}


def _first(config, *names: str, default: Any = None) -> Any:
    """The first of `names` the config sets (not None)."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _refuse_unsupported(config) -> None:
    """Variants of the remote code this implementation does not reproduce: a clear error
    rather than different numbers."""
    checks = [
        (bool(getattr(config, "prenorm", False)), "prenorm=true (pre-norm layers)"),
        (bool(getattr(config, "rotary_emb_interleaved", False)),
         "rotary_emb_interleaved=true"),
        (getattr(config, "rotary_emb_scale_base", None) is not None,
         "rotary_emb_scale_base (xPos scaling)"),
        (float(getattr(config, "rotary_emb_fraction", 1.0) or 1.0) != 1.0,
         "rotary_emb_fraction < 1 (partial rotary)"),
        ((getattr(config, "moe_every_n_layers", 0) or 0) > 0,
         "moe_every_n_layers (nomic-embed-text-v2-moe's mixture of experts)"),
        (bool(getattr(config, "parallel_block", False)), "parallel_block=true"),
        (bool(getattr(config, "use_rms_norm", False)), "use_rms_norm=true"),
    ]
    bad = [what for failed, what in checks if failed]
    if bad:
        raise ValueError(f"NomicBertModel: {', '.join(bad)} is not supported by the native "
                         "implementation (nomic-embed-text v1/v1.5 use none of these).")


def nomic_spec(config) -> EncoderSpec:
    """The model's sizes and settings from a NomicBERT config.json (either spelling)."""
    _refuse_unsupported(config)
    act = getattr(config, "activation_function", None)
    if act is None:  # transformers' own layout
        act = {"silu": "swiglu", "gelu": "geglu"}.get(getattr(config, "hidden_act", "silu"))
    if act not in _GATED:
        raise ValueError(f"NomicBertModel: activation_function {act!r} is not supported "
                         f"(supported: {', '.join(_GATED)}).")
    hidden = int(_first(config, "n_embd", "hidden_size"))
    rope = rope_parameters(config)
    rope["rope_theta"] = float(_first(config, "rotary_emb_base", default=rope["rope_theta"]))
    return EncoderSpec(
        vocab_size=int(config.vocab_size), hidden_size=hidden,
        num_layers=int(_first(config, "n_layer", "num_hidden_layers")),
        num_heads=int(_first(config, "n_head", "num_attention_heads")),
        intermediate_size=int(_first(config, "n_inner", "intermediate_size")),
        type_vocab_size=int(_first(config, "type_vocab_size", default=0)),
        eps=float(_first(config, "layer_norm_epsilon", "layer_norm_eps", default=1e-12)),
        attn_bias=bool(getattr(config, "qkv_proj_bias", False)),
        gate_up_bias=bool(getattr(config, "mlp_fc1_bias", False)),
        down_bias=bool(getattr(config, "mlp_fc2_bias", False)),
        activation=_GATED[act], rope=rope,
        max_positions=max(int(_first(config, "n_positions", default=0)),
                          int(_first(config, "max_position_embeddings", default=0)), 512))


class NomicBertModel(RopeEncoderModel):
    """NomicBERT; CLS pooling unless the checkpoint's sentence-transformers files say
    otherwise (nomic-embed-text's say MEAN), as upstream."""

    layer_prefixes = ("encoder.layers.", "layers.")
    layer_names = {**TRANSFORMERS_LAYER_NAMES, **_NOMIC_LAYER_NAMES}
    top_names = {"emb_ln": "embeddings.LayerNorm"}

    @staticmethod
    def spec_of(config) -> EncoderSpec:
        return nomic_spec(config)
