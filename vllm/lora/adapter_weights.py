"""A PEFT adapter's tensors laid out for our projections.

Each PEFT module's `lora_A` [r, in] and `lora_B` [rows, r] land in the `Linear` that holds
it (`targets.locate`); the modules sharing one fused layer (q/k/v, gate/up) are stacked
into one pair per layer: A^T [in, R] and B^T [R, out] with the scaling folded in and zeros
outside each module's own columns, so the add is two small GEMMs per layer and adapter.
"""
from __future__ import annotations

from torch import nn
import torch

from vllm.lora.peft_config import HEAD_MODULES, PeftConfig, load_tensors
from vllm.lora.targets import Target, locate, split_tensor_name, strip_prefix

Factors = tuple[torch.Tensor, torch.Tensor]


def build(backbone: nn.Module, cfg: PeftConfig, path: str, max_rank: int,
          dtype: torch.dtype, device) -> tuple[list[tuple[nn.Module, Factors]],
                                                 dict[str, dict[str, torch.Tensor]]]:
    """([(layer, (A^T, s * B^T))], {head child: its saved tensors})."""
    pairs, heads = _split(load_tensors(path))
    per_layer: dict[str, list[tuple[Target, torch.Tensor, torch.Tensor]]] = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA adapter at {path}: module {module!r} has lora_"
                             f"{''.join(sorted(ab))} only; it needs both lora_A and lora_B.")
        target = locate(backbone, strip_prefix(backbone, module))
        a, b = ab["A"].float(), ab["B"].float()
        _check(module, target, a, b, max_rank)
        _, scale = cfg.rank_and_scale(module)
        if target.reorder is not None:
            b = target.reorder(b)
        per_layer.setdefault(target.path, []).append((target, a, b * scale))
    factors = [(parts[0][0].layer, _stack(parts, dtype, device))
               for parts in per_layer.values()]
    return factors, heads


def _split(tensors: dict[str, torch.Tensor]):
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    heads: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        module, kind = split_tensor_name(name)
        if kind == "base":
            continue
        if kind != "full":
            pairs.setdefault(module, {})[kind] = tensor
            continue
        child, _, param = module.partition(".")
        if child not in HEAD_MODULES:
            raise ValueError(f"The adapter saves the whole module {child!r} ({name}); only "
                             f"the classification head {list(HEAD_MODULES)} may be saved.")
        heads.setdefault(child, {})[param] = tensor
    return pairs, heads


def _check(module: str, target: Target, a: torch.Tensor, b: torch.Tensor,
           max_rank: int) -> None:
    layer = target.layer
    if a.shape[0] > max_rank:
        raise ValueError(f"LoRA rank {a.shape[0]} is greater than max_lora_rank {max_rank}.")
    if a.shape[1] != layer.in_features or b.shape != (target.rows, a.shape[0]):
        raise ValueError(f"LoRA factors of {module!r} have shapes A {tuple(a.shape)}, B "
                         f"{tuple(b.shape)}; the model's projection needs A [r, "
                         f"{layer.in_features}] and B [{target.rows}, r]. Was the adapter "
                         "trained on this base model?")


def _stack(parts: list[tuple[Target, torch.Tensor, torch.Tensor]], dtype, device) -> Factors:
    layer = parts[0][0].layer
    total = sum(a.shape[0] for _, a, _ in parts)
    a_t = torch.zeros(layer.in_features, total)
    b_t = torch.zeros(total, layer.out_features)
    col = 0
    for target, a, b in parts:
        r = a.shape[0]
        a_t[:, col: col + r] = a.T
        b_t[col: col + r, target.offset: target.offset + target.rows] = b.T
        col += r
    return a_t.to(device=device, dtype=dtype).contiguous(), \
        b_t.to(device=device, dtype=dtype).contiguous()
