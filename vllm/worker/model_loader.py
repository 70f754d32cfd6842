"""Build the served model from a ModelConfig, load its checkpoint, bind its ops.

The model is built on its device (a CUDA model never exists on the host: parameters are
allocated on the GPU and the checkpoint's tensors are copied in one by one), then cast to
the served dtype. Then, once, every op takes the implementation the platform chose for
this device and dtype: the projections' GEMM (weights packed where it wants that), the
RMSNorm kernel, and the attention backend."""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn

from vllm.config.model import ModelConfig
from vllm.config.tasks import token_head_method
from vllm.logger import init_logger
from vllm.attention.backends.registry import get_backend
from vllm.model_executor.layers.attention import Attention, bind_attention
from vllm.model_executor.layers.linear import Linear, bind_linear
from vllm.model_executor.layers.norm import RMSNorm, bind_rms_norm
from vllm.model_executor.models.adapters import DenseLayer, RewardHead
from vllm.model_executor.models.registry import load_model_class
from vllm.model_executor.weight_utils import copy_param, iterate_weights
from vllm.platforms.interface import Platform

logger = init_logger(__name__)


# Checkpoint task heads, skipped when a classifier / reward checkpoint is served as embed.
_HEAD_PREFIXES = ("score.", "classifier.")


class PoolingModel(nn.Module):
    """The backbone (`model`), an optional task head (`head`) and sentence-transformers
    Dense layers (`dense`). The pooler applies `head` / `dense` after pooling."""

    def __init__(self, model: nn.Module, head: Optional[nn.Module],
                 dense: list[DenseLayer]) -> None:
        super().__init__()
        self.model = model
        self.head = head
        self.dense = nn.ModuleList(dense)
        self.attention_backend = "TORCH_SDPA"  # set by bind_ops

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.model(*args, **kwargs)


def build_model(mc: ModelConfig, platform: Platform,
                cache_readers: bool = False) -> PoolingModel:
    """Instantiate the backbone + head for `mc` on its device, load weights, cast to the
    dtype, bind the ops (`cache_readers`: see `Platform.attention_backend`)."""
    cls = load_model_class(mc.arch.base)
    names = {name for name, _ in _names_only(mc)}
    with platform.device, _no_random_init():
        # A backbone that loads its own checkpoint (the Transformers backend) is built from
        # the whole ModelConfig; the rest from the HF config, then filled by `_load`.
        backbone = cls.from_model_config(mc) if hasattr(cls, "from_model_config") \
            else cls(mc.hf_config)
        head = _build_head(mc, backbone, names)
        dense = [DenseLayer(s) for s in mc.st_config.dense] \
            if (mc.st_config is not None and mc.convert == "embed") else []
    model = PoolingModel(backbone, head, dense)
    _load(mc, model, str(platform.device), names)
    for layer in dense:
        layer.load()
    model.to(dtype=mc.dtype).eval()
    model.requires_grad_(False)
    bind_ops(model, platform, mc.dtype, mc.quantization, cache_readers)
    logger.info("Loaded %s (%s backbone, head: %s) in %s on %s", mc.architecture,
                cls.__name__, type(head).__name__ if head is not None else "none",
                str(mc.dtype).replace("torch.", ""), mc.device)
    return model


# torch.nn.init's random fills, which the layers' constructors call.
_RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                 "xavier_uniform_", "xavier_normal_", "orthogonal_")


@contextlib.contextmanager
def _no_random_init() -> Iterator[None]:
    """Construct layers without drawing their random initial values: the checkpoint
    overwrites every parameter (`_load` and `DenseLayer.load` refuse a checkpoint that
    misses one). On MiniLM the draws were ~0.3 CPU s of a cold start (issue 18). Constant
    fills (ones, zeros) still run. Like transformers' `no_init_weights`, this swaps the
    functions in `torch.nn.init` while the model is built."""
    saved = {name: getattr(nn.init, name) for name in _RANDOM_INITS}
    for name in _RANDOM_INITS:
        setattr(nn.init, name, _keep)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _keep(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return tensor


def bind_ops(model: PoolingModel, platform: Platform, dtype: torch.dtype,
             quantization: Optional[str] = None, cache_readers: bool = False) -> None:
    """Bind every op of a loaded model to the implementation `platform` chose (logged).
    `quantization="int8"`: the backbone's projections first, to int8 (heads stay float)."""
    count = 0
    if quantization == "int8":
        count = bind_linear(model.model, platform.int8_gemm())
        logger.info("Linear layers: %d backbone projections in int8; heads, embeddings "
                    "and norms in float32.", count)
    gemm = platform.linear_gemm(dtype)
    packed = bind_linear(model, gemm, platform.skinny_gemm(dtype)) - count  # int8 kept
    if packed:
        few = sum(m.skinny is not None for m in model.modules() if isinstance(m, Linear))
        logger.info("Linear layers: %d weights packed once for %s%s.", packed, gemm.name,
                    f" ({few} also run few rows on the C++ kernel)" if few else "")
    if any(isinstance(m, RMSNorm) for m in model.modules()):
        bind_rms_norm(model, platform.rms_norm_kernel(dtype))
    head_dims = [m.head_dim for m in model.modules() if isinstance(m, Attention)]
    model.attention_backend = platform.attention_backend(dtype, head_dims, cache_readers)
    bind_attention(model, get_backend(model.attention_backend))
    if quantization == "int8" and head_dims and \
            platform.int8_bf16_attention(model.attention_backend):
        for layer in model.modules():
            if isinstance(layer, Attention):
                layer.bf16_ok = layer.bf16_pv = True


def _names_only(mc: ModelConfig):
    from safetensors import safe_open

    from vllm.model_executor.weight_utils import checkpoint_files
    for file in checkpoint_files(mc.path):
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield name, None
        else:
            yield from ((n, None) for n in torch.load(file, map_location="cpu",
                                                      weights_only=True))


def _build_head(mc: ModelConfig, backbone: nn.Module, names: set[str]) -> Optional[nn.Module]:
    """The task head; the backbone builds a classifier (a static method on native classes,
    the Transformers backend's own task head where it loaded one)."""
    if mc.convert == "classify":
        return backbone.build_classifier(mc.hf_config, mc.num_labels, names)
    if mc.convert == "reward":
        if not any(n.startswith("score.") for n in names):
            return None  # a causal LM served as a reward model: its hidden states, per token
        return RewardHead(mc.hf_config.hidden_size, mc.num_labels)
    return None


def _tie_plan(mc: ModelConfig, backbone: nn.Module,
              names: set[str]) -> tuple[dict[str, str], dict[str, list[str]], set[str]]:
    """Tied weights, resolved as Transformers' `tie_weights` does on load. A model class's
    `tied_weights` maps a tied name to the name it is tied to (Transformers'
    `_tied_weights_keys`, in the backbone's namespace: prefix stripped). A checkpoint may
    hold either name of a pair, or both: when both, each keeps its own value (Transformers
    ties them only when they are equal); when one, it also fills the other, but only
    under `tie_word_embeddings` (Transformers ties nothing without it).

    Returns (the ties in force, fills: checkpoint name -> the backbone parameters it
    fills, drops: tied names with no parameter here, as the model uses the other one)."""
    ties: dict[str, str] = getattr(backbone, "tied_weights", {})
    params = set(dict(backbone.named_parameters()))
    drops = {name for pair in ties.items() for name in pair} - params
    if not getattr(mc.hf_config, "tie_word_embeddings", True):
        ties = {}
    prefix = backbone.weight_prefix
    present = {n[len(prefix):] if n.startswith(prefix) else n for n in names}
    fills: dict[str, list[str]] = {}
    for a, b in ties.items():
        for target, source in ((a, b), (b, a)):
            if target in params and target not in present and source in present:
                fills.setdefault(source, []).append(target)
    return ties, fills, drops


def _load(mc: ModelConfig, model: PoolingModel, device: str, names: set[str]) -> None:
    backbone, head = model.model, model.head
    # A head that its backbone's library already loaded (the Transformers backend's
    # task heads) takes nothing from here.
    preloaded = getattr(head, "preloaded", False)
    head_params = dict(head.named_parameters()) if head is not None and not preloaded else {}
    from_token = getattr(mc.hf_config, "classifier_from_token", None)
    prefix = backbone.weight_prefix
    ties, fills, drops = _tie_plan(mc, backbone, names)
    loaded_head: set[str] = set()
    lm_head: Optional[torch.Tensor] = None

    def backbone_weights():
        nonlocal lm_head
        for name, tensor in iterate_weights(mc.path, device):
            stripped = name[len(prefix):] if name.startswith(prefix) else name
            key = name if name in head_params else stripped
            if key in head_params:
                copy_param(head_params[key], tensor, name)
                loaded_head.add(key)
                continue
            if stripped == "lm_head.weight" or name == "lm_head.weight":
                lm_head = tensor
            for target in fills.get(stripped, ()):
                yield target, tensor
            if stripped in drops or backbone.skip_weight(stripped) or (
                    head is None and stripped.startswith(_HEAD_PREFIXES)):
                continue  # unused tied names or buffers, or a task head served as embed
            yield stripped, tensor

    loaded = backbone.load_weights(backbone_weights())
    if hasattr(backbone, "load_extra"):  # weights in files of their own (BGE-M3)
        backbone.load_extra(mc.path, device)
        loaded |= backbone.own_parameters()
    missing = set(dict(backbone.named_parameters())) - loaded
    if lm_head is None and ties.get("lm_head.weight") in loaded:
        lm_head = backbone.get_parameter(ties["lm_head.weight"]).data
    if lm_head is None and from_token:
        lm_head = _tied_lm_head(mc, backbone)
    if missing:
        raise ValueError(f"Checkpoint {mc.path} is missing weights for: {sorted(missing)[:8]}")
    if head is None or preloaded:
        return
    if from_token:
        _head_from_tokens(mc, head, lm_head, from_token)
        return
    missing_head = set(head_params) - loaded_head
    if missing_head:
        raise ValueError(f"Checkpoint {mc.path} has no weights for the {mc.convert} head: "
                         f"{sorted(missing_head)}. Is this checkpoint a {mc.convert} model?")


def _tied_lm_head(mc: ModelConfig, backbone: nn.Module) -> Optional[torch.Tensor]:
    """The lm_head of a checkpoint that ties it to the input embeddings and so stores none
    (Gemma), where the backbone names no tie itself (the Transformers backend): its one
    `embed_tokens` matrix."""
    if not getattr(mc.hf_config, "tie_word_embeddings", True):
        return None
    hits = [p for n, p in backbone.named_parameters() if n.endswith("embed_tokens.weight")]
    return hits[0].data if len(hits) == 1 else None


def _head_from_tokens(mc: ModelConfig, head: nn.Module, lm_head: Optional[torch.Tensor],
                      tokens: list[str]) -> None:
    """An LLM reranker's score head from the lm_head rows of its tokens (upstream's
    `method`, see `token_head_method`): from_2_way_softmax (Qwen3-Reranker, mxbai-rerank-v2)
    keeps one row, true - false, so sigmoid(score) = softmax of the two logits at "true";
    no_post_processing (bge-reranker-v2-gemma) keeps each token's row."""
    from transformers import AutoTokenizer
    if lm_head is None:
        raise ValueError("classifier_from_token needs the checkpoint's lm_head weights")
    method = token_head_method(mc.hf_config)
    tok = AutoTokenizer.from_pretrained(mc.tokenizer)
    ids = []
    for t in tokens:
        tid = tok.convert_tokens_to_ids(t)
        if tid is None or tid == tok.unk_token_id:
            raise ValueError(f"classifier_from_token: token {t!r} is not in the vocabulary")
        ids.append(tid)
    rows = lm_head[ids].float()
    if method == "from_2_way_softmax":
        rows = (rows[1] - rows[0])[None]
    head.score.weight.data.copy_(rows)
    logger.info("Built the score head from lm_head rows of tokens %s (%s)", tokens, method)
