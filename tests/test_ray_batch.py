"""`vllm run-batch` on Ray Data: the JSONL batch file over two actor replicas writes the
same lines as the local run; a Parquet corpus gets LLM.embed's embeddings."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from dp_helpers import same_body
from test_run_batch import _embed_lines, _read, _run, _write

TEXTS = [f"document {i} about {w}" for i, w in enumerate(
    ["cats", "dogs", "rivers", "music", "paper", "science", "water", "light"] * 3)]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


def test_jsonl_on_ray_equals_local(cluster, tmp_path, minilm_dir):
    src = _write(tmp_path / "in.jsonl", _embed_lines())
    common = ["-i", src, "--model", minilm_dir, "--served-model-name", "m"]
    _run(*common, "-o", str(tmp_path / "local.jsonl"))
    _run(*common, "-o", str(tmp_path / "ray.jsonl"), "--data-parallel-backend", "ray",
         "--data-parallel-size", "2", "--batch-size", "3")
    local, on_ray = _read(tmp_path / "local.jsonl"), _read(tmp_path / "ray.jsonl")
    assert [r["custom_id"] for r in on_ray] == [r["custom_id"] for r in local]
    for a, b in zip(local, on_ray):
        assert a["response"]["status_code"] == b["response"]["status_code"]
        same_body(a["response"]["body"], b["response"]["body"])
        same_body(a["error"], b["error"])


def test_parquet_corpus_local_and_on_ray(cluster, tmp_path, minilm_dir, shared_llm):
    src = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"doc_id": list(range(len(TEXTS))), "body": TEXTS}), src)
    reference = np.array([o.outputs.embedding for o in
                          shared_llm(minilm_dir).embed(TEXTS, use_tqdm=False)], np.float32)
    local = tmp_path / "local.parquet"
    _run("-i", str(src), "-o", str(local), "--model", minilm_dir, "--input-column", "body")
    table = pq.read_table(local)
    assert table.column("doc_id").to_pylist() == list(range(len(TEXTS)))
    assert np.array_equal(np.array(table.column("embedding").to_pylist(), np.float32),
                          reference)
    out_dir = tmp_path / "ray_out"
    _run("-i", str(src), "-o", str(out_dir), "--model", minilm_dir, "--input-column", "body",
         "--data-parallel-backend", "ray", "--batch-size", "10")
    table = pq.read_table(out_dir).sort_by("doc_id")
    assert table.column("body").to_pylist() == TEXTS
    np.testing.assert_allclose(np.array(table.column("embedding").to_pylist()), reference,
                               atol=2e-6)
    assert pa.types.is_float32(table.schema.field("embedding").type.value_type)
