"""benchmarks/gpu_check.py runs end to end on the CPU (tiny sizes), with pydantic, FastAPI
and uvicorn blocked as on the GPU machine, so the script cannot rot between GPU runs."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_gpu_check_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"),
                           "--device", "cpu", "--quick", "--forbid-server-deps",
                           "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["failed"] == []
    assert {c["name"].split()[1] for c in report["parity"]} == {"qwen3_cls_dir", "minilm"}
    assert all(c["ok"] for c in report["parity"] + report["exactness"])
    assert all(c["cached_tokens_second_pass"] > 0 for c in report["exactness"])
    assert report["minilm_embed"]["speedup"] > 0
    assert report["prefix_rerank"]["ideal_speedup"] > 1
    assert report["prefix_rerank"]["max_abs_prob_diff"] < 5e-2  # bf16 cache on vs off
