"""Reading checkpoint tensors (safetensors, sharded or not; torch .bin as a fallback)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import torch
from safetensors import safe_open


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        with open(index) as f:
            return sorted({path / name for name in json.load(f)["weight_map"].values()})
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    files = sorted(path.glob("pytorch_model*.bin"))
    if files:
        return files
    raise ValueError(f"No model weights (*.safetensors or pytorch_model*.bin) found in {path}.")


def iterate_weights(path: Path, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of the checkpoint at `path`, read straight onto
    `device` ("cpu", "cuda:N"), one tensor at a time."""
    for file in checkpoint_files(path):
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt", device=device) as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        else:
            state = torch.load(file, map_location=device, weights_only=True)
            yield from state.items()


def copy_shard(param: torch.Tensor, shard_sizes: list[int], shard: int,
               tensor: torch.Tensor) -> None:
    """Copy `tensor` into rows `shard` of a fused parameter stacked along dim 0."""
    _check_loadable(param, f"shard {shard}")
    offset = sum(shard_sizes[:shard])
    size = shard_sizes[shard]
    if tensor.shape[0] != size:
        raise ValueError(f"fused shard {shard} has {tensor.shape[0]} rows, expected {size}")
    param.data[offset: offset + size].copy_(tensor)


def copy_param(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    _check_loadable(param, name)
    if param.shape != tensor.shape:
        raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, the model "
                         f"expects {tuple(param.shape)}")
    param.data.copy_(tensor)


def _check_loadable(param: torch.Tensor, name: str) -> None:
    """A packed projection's weight is a meta placeholder (`Linear.bind`): copying into
    it would silently do nothing."""
    if param.is_meta:
        raise RuntimeError(f"Cannot load weight {name!r}: its layer was already packed for "
                           "its GEMM (bind_linear); load every weight before binding.")


def load_mapped(module: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                map_name: Callable[[str], tuple[str, Optional[int]]]) -> set[str]:
    """Copy each checkpoint tensor into `module`'s parameter `map_name(name)` names: (its
    name, None) or (a fused [q; k; v] parameter's name, the shard 0/1/2). Returns the
    parameters set; a tensor with no place is a ValueError."""
    params = dict(module.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        pname, shard = map_name(name)
        if pname not in params:
            raise ValueError(f"checkpoint weight {name!r} has no place in "
                             f"{type(module).__name__}")
        if shard is None:
            copy_param(params[pname], tensor, name)
        else:
            copy_shard(params[pname], [tensor.shape[0]] * 3, shard, tensor)
        loaded.add(pname)
    return loaded
