"""The backends' per-step layouts, built from the one flat batch description (device-neutral,
so FLASH_ATTN's layout is checked here though its kernel needs a GPU)."""
from __future__ import annotations

import pytest
import torch

from vllm.attention.backends.registry import BACKEND_NAMES, check_backend_name, get_backend
from vllm.attention.metadata import AttentionMetadata, token_slots

BLOCK = 16


def _meta() -> AttentionMetadata:
    """Two cache readers (k=32 n=5, k=16 n=3), laid out first, then a new request (n=7)."""
    tables = [[4, 9, 2], [4, 7], [1]]
    return AttentionMetadata(query_start_loc=[0, 5, 8, 15], num_computed=[32, 16, 0],
                             num_new=[5, 3, 7], slot_mapping=None, block_tables=tables,
                             block_size=BLOCK)


def test_flash_layout_packs_new_rows_and_gathers_reader_keys():
    meta = _meta()
    data = meta.prepared(get_backend("FLASH_ATTN"))
    assert meta.prepared(get_backend("FLASH_ATTN")) is data   # built once per step
    assert data.packed_start == 8 and data.cu_new.tolist() == [0, 7] and data.max_new == 7
    assert data.cu_new.dtype == data.cu_q.dtype == data.cu_k.dtype == torch.int32
    assert data.cu_q.tolist() == [0, 5, 8] and data.cu_k.tolist() == [0, 37, 56]
    assert (data.max_q, data.max_k) == (5, 37)
    want = torch.cat([token_slots([4, 9, 2], 0, 37, BLOCK), token_slots([4, 7], 0, 19, BLOCK)])
    assert torch.equal(data.key_slots, want)
    assert data.key_slots[:16].tolist() == list(range(64, 80))   # block 4 holds positions 0-15


def test_cpu_native_layout_shares_tiles_of_a_common_prefix():
    pytest.importorskip("vllm.attention.backends.cpu_native")
    meta = _meta()
    data = get_backend("CPU_NATIVE").build(meta)
    q_off, k_off, slots, tiles = data.readers
    assert data.packed_start == 8 and data.packed_offsets.tolist() == [0, 7]
    assert q_off.tolist() == [0, 5, 8] and k_off.tolist() == [0, 37, 56]
    assert len(slots) == 56 and len(tiles) == 2   # one 64-key tile per reader, distinct


def test_registry_names_and_refusal():
    assert BACKEND_NAMES == ("CPU_NATIVE", "TORCH_SDPA", "FLASH_ATTN", "TRITON_ATTN")
    assert {get_backend(n).name for n in BACKEND_NAMES} == set(BACKEND_NAMES)
    with pytest.raises(ValueError, match="valid backends: CPU_NATIVE, TORCH_SDPA, FLASH_ATTN"):
        check_backend_name("XFORMERS")
