"""Process settings that torch and OpenMP read once, set before torch loads (no torch here).

`import vllm` calls `prefer_huge_pages` and `bound_shape_caches` first thing, and `vllm serve` calls
`limit_openmp_spin` before it parses its flags, so both reach torch's first allocation /
OpenMP's start. A value the user set is kept, and nothing is set once torch is already
imported (the variable would then only reach child processes).

THP_MEM_ALLOC_ENABLE=1: torch reads it at its first CPU allocation and from then on
page-aligns every buffer of 2 MiB or more and advises transparent huge pages for it
(madvise; used where the kernel's THP mode is `madvise` or `always`). Without it, the glibc
heap serves a step's activations at 64-byte-aligned offsets that fragmentation leaves, and a
server whose step sizes vary keeps growing the heap: after twelve rounds of bench_serve's
levels (1, 8, 32 clients, then all texts in one request) it held 2.2 GB and its 32-client
steps ran slower, against a steady 1.4 GB with it. Two servers side by side, interleaved:
32 clients 1.08x (12 rounds), 1.065x and 1.02x (6 rounds each); all texts in one request
1.04-1.07x; offline `LLM.embed` ~1.02x. `THP_MEM_ALLOC_ENABLE=0` turns it off. It only
affects CPU buffers, so it is harmless where the model runs on a GPU.

LRU_CACHE_CAPACITY and ONEDNN_PRIMITIVE_CACHE_CAPACITY (oneDNN projections): torch's ideep
layer keeps an LRU of per-shape computations and oneDNN one of per-shape primitives, 1024
entries each by default. Every new token count of a step is a new shape for each projection,
so a server meeting fresh traffic filled both for hours: served RSS grew 480 -> 623 MiB over
rounds 3-12 of bench_soak, and offline varied batches grew ~55 MiB per 300 texts, all of it
gone with F.linear (MKL) instead of oneDNN, and flat (409 -> 411 MiB over six rounds) with
both caches at 64 entries, with no measurable change in speed: a step's new shapes cost
microseconds to set up against its milliseconds of GEMMs.

GOMP_SPINCOUNT (server only): between steps the server answers the step's requests and
reads the next ones while the engine's OpenMP worker has no work; spinning for libgomp's
default ~9 ms it held one of the cores that work needs. Inside a forward pass the gaps
between parallel regions are short but not always shorter than ~0.3 ms (10k spins): on an
AMD EPYC that setting cost 10% of a step, so the server spins ~1 ms (30k).
"""
from __future__ import annotations

import os
import sys

from vllm import envs
from vllm.logger import init_logger

logger = init_logger(__name__)

HUGE_PAGE_ENV = "THP_MEM_ALLOC_ENABLE"
# Iterations an idle OpenMP thread spins before it sleeps when serving, against libgomp's
# default 300k (~9 ms). 10k (~0.3 ms) let workers sleep inside a forward pass on an AMD EPYC
# (AVX-512): offline MiniLM with it 55 vs 62 texts/s (two rounds); 30k kept the offline
# rate. Served there (bench_serve, session 12): all texts in one request 0.90x / 0.89x
# offline with 10k, 0.98x / 0.96x / 0.90x with 30k; 32 clients 0.82x / 0.83x vs 0.85x /
# 0.85x / 0.96x; 1 client p50 28.9 vs 27.1 ms.
SERVE_OMP_SPIN_COUNT = 30000


def _torch_loaded() -> bool:
    return "torch" in sys.modules


def prefer_huge_pages() -> bool:
    """Set THP_MEM_ALLOC_ENABLE=1 unless it is set or torch is loaded; True if set now."""
    if _torch_loaded() or envs.is_set(HUGE_PAGE_ENV):
        return False
    os.environ[HUGE_PAGE_ENV] = "1"
    return True


# Entries of ideep's per-shape computation cache and oneDNN's primitive cache (1024 each
# by default): see the module docstring.
SHAPE_CACHE_ENTRIES = 64
SHAPE_CACHE_ENVS = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bound_shape_caches() -> list[str]:
    """Before torch loads, cap oneDNN's per-shape caches at SHAPE_CACHE_ENTRIES so memory
    levels off under traffic of ever-new token counts. A value the user set is kept.
    Returns the variables set now."""
    if _torch_loaded():
        return []
    chosen = [name for name in SHAPE_CACHE_ENVS if not envs.is_set(name)]
    for name in chosen:
        os.environ[name] = str(SHAPE_CACHE_ENTRIES)
    return chosen


def limit_openmp_spin() -> bool:
    """Before torch loads, let the server's idle OpenMP threads sleep after ~0.3 ms. An
    explicit GOMP_SPINCOUNT or OMP_WAIT_POLICY is kept; False when one is set or torch is
    already loaded."""
    if _torch_loaded() or envs.is_set("GOMP_SPINCOUNT") or envs.is_set("OMP_WAIT_POLICY"):
        return False
    os.environ["GOMP_SPINCOUNT"] = str(SERVE_OMP_SPIN_COUNT)
    logger.info("OpenMP: idle threads spin %d iterations before sleeping, not libgomp's "
                "300000, so they leave the cores to HTTP work between steps (set "
                "GOMP_SPINCOUNT to choose).", SERVE_OMP_SPIN_COUNT)
    return True


def single_threaded_tokenizer() -> bool:
    """TOKENIZERS_PARALLELISM=false unless the user set it; True if set now."""
    if envs.is_set("TOKENIZERS_PARALLELISM"):
        return False
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return True
