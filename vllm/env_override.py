"""Process-wide settings that must be in the environment before torch loads.

`import vllm` runs this first (it loads no torch itself), so `from vllm import LLM` and
`vllm serve` both get it; a value the user set is kept, and nothing is set once torch is
already imported (the variable would then only reach child processes).

THP_MEM_ALLOC_ENABLE=1: torch reads it at its first CPU allocation and from then on
page-aligns every buffer of 2 MiB or more and advises transparent huge pages for it
(madvise; used where the kernel's THP mode is `madvise` or `always`). Without it, the glibc
heap serves a step's activations at 64-byte-aligned offsets that fragmentation leaves, and a
server whose step sizes vary keeps growing the heap: after twelve rounds of bench_serve's
levels (1, 8, 32 clients, then all texts in one request) it held 2.2 GB and its 32-client
steps ran slower, against a steady 1.4 GB with it. Two servers side by side, interleaved:
32 clients 1.08x (12 rounds), 1.065x and 1.02x (6 rounds each); all texts in one request
1.04-1.07x; offline `LLM.embed` ~1.02x. `THP_MEM_ALLOC_ENABLE=0` turns it off.
"""
from __future__ import annotations

import os
import sys

HUGE_PAGE_ENV = "THP_MEM_ALLOC_ENABLE"


def prefer_huge_pages() -> bool:
    """Set THP_MEM_ALLOC_ENABLE=1 unless it is set or torch is loaded; True if set now."""
    if "torch" in sys.modules or HUGE_PAGE_ENV in os.environ:
        return False
    os.environ[HUGE_PAGE_ENV] = "1"
    return True


prefer_huge_pages()
