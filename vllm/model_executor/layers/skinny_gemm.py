"""Projections of a few rows read straight from oneDNN's packed weight (csrc/skinny_gemm.cpp).

A step of a few rows (one short prompt; the last layer of a LAST/CLS model, which computes
only the pooled rows) is a stream of every weight with a few FMAs per element. oneDNN ran
those at 3-5 GB/s of weight on the 2-core AVX2 machine; the C++ kernel streams the same
packed copy at 7-11 GB/s (MiniLM's 24 projections at 9 rows: 6.1 vs 7.3 ms with the
weights out of cache, 3.7 vs 4.8 ms at one row). oneDNN also builds a primitive for every
new row count (~5 ms for MiniLM's four shapes), which a server meets on nearly every step:
with row counts never seen before the kernel was 1.31x oneDNN at 17-113 rows, 1.24x at
64-160 and even at 128-224; with cached primitives the two were within 1-3% from 24 to 256
rows. So a layer keeps one weight and runs `SkinnyWeight` up to `MAX_ROWS` rows and oneDNN
above, where its cache blocking matters (the kernel re-reads x once per 16 columns). The
AVX-512 build (16 lanes: 12 rows x 32 columns of accumulators) was first measured on a
2-core Xeon with AVX-512 (session 11, benchmarks/README.md): 1.11-1.40x oneDNN with cached
row counts and 1.40-2.19x with new ones at 1-64 rows, so both builds use it. There oneDNN
sums K > 512 in another order than the kernel's one pass, so a row's projection differs in
the last bits with the step's row count (within float32 rounding, never more).

The kernel reads oneDNN's blocked layout, which oneDNN does not promise: `packed_layout`
packs the row and the column index of every element of a weight of the same shape and
reads the copies back, and a layer whose layout is not the one the kernel reads keeps
oneDNN for every row count. The platform also checks the kernel against `F.linear` once.

oneDNN's choice is not a function of the shape alone: on AVX2 it also follows the packing
thread's OpenMP thread count ([192, 64]: blocks of 64 columns at one thread, 16 at two).
So the probe is keyed by the thread count too, and each weight's layout is recorded with
it (`SkinnyWeight.kp`, `.nb`) only after its own packed copy was read back at that layout
(`holds`): a copy packed under any other condition keeps oneDNN, never a misread.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from vllm.model_executor.layers.packed import pack_weight, packed_buffer

MAX_ROWS = 64
# epilogues: with `other` ("add", "mul"), or an activation of x @ W.T + bias
# csrc/epilogue.h's modes, shared with the int8 projections (layers.int8_linear)
# ("gelu_q": the int8 projections' GELU, for values rounded to int8 next)
MODES = {None: 0, "add": 1, "mul": 2, "gelu": 3, "silu": 4, "relu": 5, "gelu_q": 6}
ACTIVATIONS = ("gelu", "silu", "relu")


def _positions(size: int) -> torch.Tensor:
    """Where the probe compares: everywhere in a buffer of up to 2^16 elements, else its
    first and last 2^15 and 2^15 seeded random ones (a model's load is not slowed by
    full-size index arithmetic: MiniLM's four shapes took 0.45 s that way)."""
    if size <= 1 << 16:
        return torch.arange(size)
    g = torch.Generator().manual_seed(0)
    edge = 1 << 15
    return torch.cat([torch.arange(edge), torch.arange(size - edge, size),
                      torch.randint(0, size, (edge,), generator=g)])


def packed_layout(n: int, k: int) -> Optional[tuple[int, int]]:
    """(kp, nb) when oneDNN, called from this thread now, packs a float32 [n, k] weight as
    blocks of nb output columns, each [kp][nb] with kp >= k (what csrc/skinny_gemm.cpp
    reads); None otherwise."""
    return _probe(n, k, torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _probe(n: int, k: int, threads: int) -> Optional[tuple[int, int]]:
    """`packed_layout` at `threads` OpenMP threads (the caller's count: oneDNN's choice
    depends on it). Found by packing the row index and then the column index of every
    element and reading back where each landed."""
    found: list[torch.Tensor] = []
    sizes: list[int] = []
    try:
        for axis in (0, 1):
            index = torch.arange((n, k)[axis], dtype=torch.float32)
            index = (index[:, None] if axis == 0 else index[None, :]).expand(n, k)
            packed = pack_weight(index.contiguous())
            buf = packed_buffer(packed)
            sizes.append(buf.numel())
            where = _positions(sizes[0]) if axis == 0 else where
            found.append(buf[where].clone())
            del packed, buf
    except (RuntimeError, AttributeError):
        return None
    if sizes[0] != sizes[1]:
        return None
    return _match(*found, where, sizes[0], n, k)


def _match(rows: torch.Tensor, cols: torch.Tensor, where: torch.Tensor, size: int, n: int,
           k: int) -> Optional[tuple[int, int]]:
    """The (kp, nb) whose [n / nb][kp][nb] layout of `size` elements puts (row, col) at
    every probed place (each candidate tried on the first 4096 places before all)."""
    def holds(kp: int, nb: int, part: slice) -> bool:
        at = where[part]
        want_row, want_col = (at // (kp * nb)) * nb + at % nb, (at % (kp * nb)) // nb
        inside = (want_row < n) & (want_col < k)
        return torch.equal(rows[part][inside], want_row[inside].float()) and \
            torch.equal(cols[part][inside], want_col[inside].float())

    for nb in (16, 32, 48, 64, 96, 128):
        blocks = -(-n // nb)
        if size % (blocks * nb) or size // (blocks * nb) < k:
            continue
        kp = size // (blocks * nb)
        if holds(kp, nb, slice(0, 4096)) and holds(kp, nb, slice(None)):
            return kp, nb
    return None


class SkinnyWeight:
    """One packed float32 [n, k] weight and its layout: `(x, bias, mode, other)` computes
    (x @ W.T + bias) [mode "add" / "mul": with other; "gelu" / "silu" / "relu": that
    activation of it] for x of at most MAX_ROWS rows."""

    def __init__(self, kernel: Callable, packed: torch.Tensor, n: int, k: int, kp: int,
                 nb: int) -> None:
        self.kernel, self.packed = kernel, packed  # keeps the buffer alive
        # oneDNN's opaque copy, or a plain tensor in the same layout (layers.f32_gemm)
        self.pointer = torch.ops.mkldnn.data_ptr(packed) if packed.is_mkldnn else \
            packed.data_ptr()
        self.n, self.k, self.kp, self.nb = n, k, kp, nb

    def takes(self, x: torch.Tensor) -> bool:
        return x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.dtype == torch.float32

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 mode: Optional[str] = None,
                 other: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.kernel(x, self.pointer, self.n, self.k, self.kp, self.nb, bias,
                           MODES[mode], other)


def holds(packed: torch.Tensor, weight: torch.Tensor, kp: int, nb: int) -> bool:
    """Whether `packed` holds the float32 [n, k] `weight` at the (kp, nb) layout: its
    values compared exactly where the probe compares (`_positions`); padding not read."""
    n, k = weight.shape
    size = -(-n // nb) * nb * kp
    if torch.ops.mkldnn._nbytes(packed) != 4 * size:
        return False
    at = _positions(size)
    row, col = (at // (kp * nb)) * nb + at % nb, (at % (kp * nb)) // nb
    inside = (row < n) & (col < k)
    at, row, col = at[inside], row[inside], col[inside]
    plain = weight.detach().contiguous()
    return torch.equal(packed_buffer(packed)[at], plain.view(-1)[row * k + col])


def skinny_weight(kernel: Callable, packed: torch.Tensor,
                  weight: torch.Tensor) -> Optional[SkinnyWeight]:
    """A `SkinnyWeight` over `packed` (oneDNN's copy of the plain [n, k] `weight`, packed
    just now on this thread) where its layout is the kernel's and the copy was read back
    at that layout, else None."""
    if packed.dtype != torch.float32 or not packed.is_mkldnn or weight.dim() != 2:
        return None
    n, k = weight.shape
    layout = packed_layout(n, k)
    if layout is None or layout[1] % kernel.tile_width or not holds(packed, weight, *layout):
        return None
    return SkinnyWeight(kernel, packed, n, k, *layout)


def kernel_matches_torch(kernel: Callable) -> bool:
    """The kernel on a packed weight whose width is not a whole block, every mode, against
    F.linear in float64."""
    g = torch.Generator().manual_seed(0)
    n, k = 100, 72
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    weight = skinny_weight(kernel, pack_weight(w), w)
    if weight is None:
        return False
    for rows in (1, 7, MAX_ROWS):
        x, other = torch.randn(rows, k, generator=g), torch.randn(rows, n, generator=g)
        ref = F.linear(x.double(), w.double(), b.double())
        for mode, want in ((None, ref), ("add", ref + other), ("mul", ref * other),
                           ("gelu", F.gelu(ref)), ("silu", F.silu(ref)), ("relu", F.relu(ref))):
            got = weight(x, b, mode, other if mode in ("add", "mul") else None)
            if not torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4):
                return False
    return True
