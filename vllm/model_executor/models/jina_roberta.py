"""Jina's rotary XLM-RoBERTa (jina-embeddings-v3, the backbone of jina-colbert-v2).

The checkpoints are `XLMRobertaModel` configs (`model_type` xlm-roberta) whose
`position_embedding_type` is "rotary": the remote "XLM-R flash" code, a post-norm XLM-R
without absolute positions (rotate-half rotary on queries and keys, base
`rotary_emb_base`), GELU MLP, biases everywhere. Tensor names are the flash layout's:
`roberta.emb_ln`, `roberta.encoder.layers.N.mixer.Wqkv` / `mixer.out_proj` / `norm1` /
`mlp.fc1` / `mlp.fc2` / `norm2`.

jina-embeddings-v3 also ships one LoRA adapter per task (`lora_adaptations`, rank
`lora_rank`, scaling `lora_alpha / lora_rank`) as torch parametrizations of every linear
layer and embedding table: `<module>.parametrizations.weight.original` is the base weight,
`...weight.0.lora_A` / `lora_B` hold all tasks stacked on dim 0, in `lora_adaptations`
order. A linear layer's are A [n, r, in], B [n, out, r] (W + s B A); an embedding table's
(weights [V, H]) are A [n, V, r], B [n, r, H] (E + s A B). The model keeps them apart
(`task_factors`) instead of merging one task into the weights, so that each request runs
its own task: `vllm.lora.task_adapters` applies them per row.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional

import torch
from torch import nn

from vllm.model_executor.layers.rotary import rope_parameters
from vllm.model_executor.models.registry import is_rotary_xlmr
from vllm.model_executor.models.rope_encoder import EncoderSpec, RopeEncoderModel

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}

_FLASH_LAYER_NAMES: dict[str, tuple[str, Optional[int]]] = {
    "mixer.Wqkv": ("qkv", None), "mixer.out_proj": ("attn_out", None),
    "norm1": ("attn_norm", None), "mlp.fc1": ("up", None), "mlp.fc2": ("down", None),
    "norm2": ("mlp_norm", None),
}

_ORIGINAL = ".parametrizations.weight.original"
_LORA = ".parametrizations.weight.0.lora_"

# (A-side, B-side) per task: delta rows = A-side rows (gathered by id for a table, x @ it
# for a projection) @ B-side.
Factors = list[tuple[torch.Tensor, torch.Tensor]]


def task_names(config) -> tuple[str, ...]:
    """The config's task adapters, in their stacking order (empty: none)."""
    return tuple(getattr(config, "lora_adaptations", None) or ())


def jina_spec(config) -> EncoderSpec:
    h, heads = int(config.hidden_size), int(config.num_attention_heads)
    act = getattr(config, "hidden_act", "gelu")
    bad = [what for failed, what in (
        (not is_rotary_xlmr(config), "position_embedding_type other than rotary"),
        (getattr(config, "rotary_emb_dim", None) not in (None, h // heads),
         "rotary_emb_dim < head size (partial rotary)"),
        (act not in _ACTIVATIONS, f"hidden_act {act!r}"),
    ) if failed]
    if bad:
        raise ValueError(f"JinaRobertaModel: {', '.join(bad)} is not supported.")
    rope = rope_parameters(config)
    rope["rope_theta"] = float(getattr(config, "rotary_emb_base", None) or rope["rope_theta"])
    bias = bool(getattr(config, "bias", True))
    return EncoderSpec(
        vocab_size=int(config.vocab_size), hidden_size=h,
        num_layers=int(config.num_hidden_layers), num_heads=heads,
        intermediate_size=int(config.intermediate_size),
        type_vocab_size=int(getattr(config, "type_vocab_size", 0) or 0),
        eps=float(getattr(config, "layer_norm_eps", 1e-5)), attn_bias=bias,
        gate_up_bias=bias, down_bias=bias, activation=_ACTIVATIONS[act], rope=rope,
        max_positions=max(int(getattr(config, "max_position_embeddings", 0) or 0), 512),
        gated=False)


class JinaRobertaModel(RopeEncoderModel):
    """The rotary XLM-R encoder; CLS pooling by default (jina-embeddings-v3's
    sentence-transformers files say MEAN). Its task adapters are never merged: the
    runner attaches them per row (`task_factors`); PEFT adapters are refused."""

    weight_prefix = "roberta."
    layer_prefixes = ("encoder.layers.",)
    layer_names = _FLASH_LAYER_NAMES
    top_names = {"emb_ln": "embeddings.LayerNorm"}
    lora_target = None  # the checkpoint's own task adapters take the LoRA slots

    def __init__(self, config) -> None:
        super().__init__(config)
        self.tasks = task_names(config)
        # our module path -> one (A-side, B-side) pair per task; plain tensors, not
        # parameters: `vllm.lora.task_adapters` casts and places them.
        self._task_factors: dict[str, Factors] = {}

    @staticmethod
    def spec_of(config) -> EncoderSpec:
        return jina_spec(config)

    def expand(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """A parametrized module's base weight under its plain name."""
        yield (name[: -len(_ORIGINAL)] + ".weight" if name.endswith(_ORIGINAL) else name), \
            tensor

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        lora: dict[str, dict[str, torch.Tensor]] = {}

        def base_weights():
            for name, tensor in weights:
                if _LORA in name:
                    module, kind = name.split(_LORA)
                    lora.setdefault(module, {})[kind] = tensor
                else:
                    yield name, tensor

        loaded = super().load_weights(base_weights())
        for module, pair in lora.items():
            self._task_factors[self._our_path(module)] = self._factors(module, pair)
        return loaded

    def _our_path(self, module: str) -> str:
        ours, shard = self.map_name(module + ".weight")
        if shard is not None:
            raise ValueError(f"task adapter of {module!r}: a shard of a fused projection")
        return ours[: -len(".weight")]

    def _factors(self, module: str, pair: dict[str, torch.Tensor]) -> Factors:
        """Per task, the (A-side, B-side) pair with the scaling folded into the B-side and
        the query/key rows interleaved as the loader stored the base weight."""
        if set(pair) != {"A", "B"} or not self.tasks or \
                pair["A"].shape[0] != len(self.tasks) or pair["B"].shape[0] != len(self.tasks):
            raise ValueError(
                f"task adapters of {module!r}: need lora_A and lora_B with one adapter per "
                f"entry of the config's lora_adaptations ({len(self.tasks)}); got "
                f"{ {k: tuple(v.shape) for k, v in pair.items()} }.")
        scale = float(self.config.lora_alpha) / float(self.config.lora_rank)
        a, b = pair["A"].float(), pair["B"].float()
        path = self._our_path(module)
        if isinstance(self.get_submodule(path), nn.Embedding):
            return [(a[t], b[t] * scale) for t in range(len(self.tasks))]
        out = []
        for t in range(len(self.tasks)):
            rows = self._qk_interleaved(b[t], None) if path.endswith(".qkv") else b[t]
            out.append((a[t].t(), (rows * scale).t()))
        return out

    def task_factors(self) -> dict[str, Factors]:
        """Our module path -> per task (in `tasks` order) the pair whose product is that
        task's weight delta: a projection's (A^T [in, r], s B^T [r, out]), a table's
        (A [V, r], s B [r, H]). Empty when the checkpoint has no task adapters."""
        return self._task_factors

