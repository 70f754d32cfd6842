"""A least-recently-used map of tensors bounded by their total size in bytes."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import torch


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


class TensorLRU:
    """Values (tensors, or tuples holding some) by key; the least recently used go first
    once their total passes `max_bytes` (the newest entry is always kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._bytes = 0
        self.misses = 0

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        """The value for `key`, computed (and kept) on a miss."""
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        self.misses += 1
        value = self._items[key] = compute()
        self._bytes += _nbytes(value)
        while self._bytes > self.max_bytes and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self._bytes -= _nbytes(old)
        return value
