"""The gate: may prefix caching and chunked prefill run for this model, exactly?

By default both run only when the pooled state needs nothing but the final token (LAST
pooling) and each token's state depends only on the tokens before it (causal attention).
On request (`enable_prefix_caching=True` / `enable_chunked_prefill=True`) they also run,
exactly, for CLS / MEAN / ALL / STEP pooling on causal models: the pooler keeps its
partial result across chunks and a cached block carries its pooling payload (see
`model_executor/layers/pool_state.py`). Bidirectional models never get them.
"""
from __future__ import annotations

from typing import Optional

from vllm.config.model import ModelConfig
from vllm.logger import init_logger

logger = init_logger(__name__)

# Pooling types that run exactly with both features when the user asks (causal models).
ON_REQUEST_POOLING = ("CLS", "MEAN", "ALL", "STEP")


def prefix_features_supported(model_config: ModelConfig) -> tuple[bool, str]:
    """(supported, reason) for prefix caching and chunked prefill on this model."""
    pooling = model_config.gate_pooling_type
    if not model_config.arch.base.is_causal:
        return False, f"{model_config.architecture} is an encoder-only (bidirectional) model"
    if not model_config.is_causal:
        return False, ("the model's attention is bidirectional (is_causal: false or "
                       "use_bidirectional_attention: true)")
    if model_config.whole_sequences:
        return False, (f"the Transformers backend runs {model_config.architecture} whole "
                       f"({model_config.whole_reason})")
    if pooling != "LAST":
        return False, f"pooling type is {_pooling_name(model_config)}, not LAST"
    return True, "LAST pooling with causal attention"


def _pooling_name(model_config: ModelConfig) -> str:
    """The configured pooling type, and the task when a token task makes it read every
    token (judged as ALL)."""
    pooling, judged = model_config.pooler_config.pooling_type, model_config.gate_pooling_type
    if pooling == judged:
        return pooling
    return f"{pooling} (the {model_config.pooling_task} task reads every token, as {judged})"


def exact_on_request(model_config: ModelConfig) -> Optional[str]:
    """The pooling type when asking turns both features on exactly (a causal model with
    CLS/MEAN/ALL/STEP pooling), else None."""
    supported, _ = prefix_features_supported(model_config)
    pooling = model_config.gate_pooling_type
    causal = model_config.arch.base.is_causal and model_config.is_causal and \
        not model_config.whole_sequences
    return _pooling_name(model_config) if causal and not supported and \
        pooling in ON_REQUEST_POOLING else None


def resolve_feature(name: str, user_value: Optional[bool], model_config: ModelConfig) -> bool:
    """Apply the gate to one feature flag and log the decision with its reason."""
    supported, reason = prefix_features_supported(model_config)
    if user_value is None:
        logger.info("%s %s by default: %s.", name, "enabled" if supported else "disabled",
                    reason)
        return supported
    pooling = exact_on_request(model_config) if user_value and not supported else None
    if pooling is not None:
        logger.info("%s enabled as requested: %s pooling on a causal model runs exactly "
                    "(the pooler keeps its partial result across chunks and cached blocks "
                    "carry its pooling payload).", name, pooling)
        return True
    if user_value and not supported:
        logger.warning("%s was requested but is disabled: %s, so it could not be exact.",
                       name, reason)
        return False
    logger.info("%s %s as requested (%s).", name, "enabled" if user_value else "disabled",
                reason)
    return bool(user_value)
