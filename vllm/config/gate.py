"""The gate: may prefix caching and chunked prefill run for this model, exactly?

Both features are exact only when the pooled state needs nothing but the final token
(LAST pooling) and each token's state depends only on the tokens before it (causal
attention). Everything else keeps them off.
"""
from __future__ import annotations

from typing import Optional

from vllm.config.model import ModelConfig
from vllm.logger import init_logger

logger = init_logger(__name__)


def prefix_features_supported(model_config: ModelConfig) -> tuple[bool, str]:
    """(supported, reason) for prefix caching and chunked prefill on this model."""
    pooling = model_config.pooler_config.pooling_type
    if not model_config.arch.base.is_causal:
        return False, f"{model_config.architecture} is an encoder-only (bidirectional) model"
    if not model_config.is_causal:
        return False, ("the model's attention is bidirectional (is_causal: false or "
                       "use_bidirectional_attention: true)")
    if pooling != "LAST":
        return False, f"pooling type is {pooling}, not LAST"
    return True, "LAST pooling with causal attention"


def resolve_feature(name: str, user_value: Optional[bool], model_config: ModelConfig) -> bool:
    """Apply the gate to one feature flag and log the decision with its reason."""
    supported, reason = prefix_features_supported(model_config)
    if user_value is None:
        logger.info("%s %s by default: %s.", name, "enabled" if supported else "disabled",
                    reason)
        return supported
    if user_value and not supported:
        logger.warning("%s was requested but is disabled: %s, so it could not be exact.",
                       name, reason)
        return False
    logger.info("%s %s as requested (%s).", name, "enabled" if user_value else "disabled",
                reason)
    return bool(user_value)
