"""OpenVINO baselines for bench_openvino: sentence-transformers' `backend="openvino"`.

Two encoders of the bundled MiniLM, both `SentenceTransformer(dir, backend="openvino")`,
i.e. optimum-intel's `OVModelForFeatureExtraction` under sentence-transformers' own
tokenizing, length-sorted padded batches, mean pooling and normalisation:

* float32: the local checkpoint exported once by optimum-intel (offline; saved with
  `SentenceTransformer.save_pretrained` under results/.openvino) and compiled with
  `INFERENCE_PRECISION_HINT=f32`. OpenVINO's CPU plugin otherwise runs float models in
  bfloat16 on CPUs with AVX512-BF16 or AMX, which would not be a float32 peer.
* int8: that IR quantized by NNCF post-training static quantization (`nncf.quantize`,
  `ModelType.TRANSFORMER`, default preset: int8 weights per channel, int8 activations per
  tensor, ranges from a calibration set), saved beside it and loaded through the same
  `backend="openvino"` path with `file_name=`. sentence-transformers' own
  `export_static_quantized_openvino_model` calibrates on a Hub data set (GLUE SST-2), which
  an offline machine cannot fetch, so the calibration texts are given here: one text per
  sample, unpadded.

optimum-intel pins transformers / huggingface_hub ranges that may not match the project's
environment, so the encoders run in a worker process (`python openvino_baseline.py`, any
interpreter that has optimum-intel, e.g. a venv made with --system-site-packages): the
benchmark sends it pickled requests on stdin and reads pickled answers from stdout; the
worker times its own `encode` calls, so the pipe is not counted. This module imports
neither vllm nor torch at the top, so the worker does not load the engine.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import pickle
import subprocess
import sys
import time
from typing import Any, Callable, Optional

CACHE = pathlib.Path(__file__).parent / "results" / ".openvino"
FLOAT_HINT = {"INFERENCE_PRECISION_HINT": "f32"}


def timed_call(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, this process's CPU seconds over all its threads, fn's result). On a
    shared machine the CPU seconds move less than the wall time: a preempted thread does not
    count, though a thread spin-waiting for a preempted peer does."""
    w0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - w0, time.process_time() - c0, result


# ----- worker side ----------------------------------------------------------------------------
def _exported(model_dir: pathlib.Path) -> pathlib.Path:
    """A copy of the checkpoint with its OpenVINO IR (exported once, offline)."""
    from sentence_transformers import SentenceTransformer
    tag = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:10]
    out = CACHE / f"{model_dir.name}_{tag}"
    if not (out / "openvino" / "openvino_model.xml").exists():
        st = SentenceTransformer(str(model_dir), device="cpu", backend="openvino")
        st.save_pretrained(str(out))
    return out


def _quantized(exported: pathlib.Path, texts: list[str], max_length: int) -> str:
    """NNCF static int8 of the exported IR, calibrated on `texts`; returns its file_name
    relative to `exported` (cached by the calibration texts' hash)."""
    import nncf
    import openvino as ov
    from transformers import AutoTokenizer
    tag = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:10]
    name = f"openvino/openvino_model_qint8_nncf_{len(texts)}_{tag}.xml"
    if (exported / name).exists():
        return name
    tok = AutoTokenizer.from_pretrained(str(exported))
    samples = [{k: v.astype("int64") for k, v in
                tok(t, truncation=True, max_length=max_length, return_tensors="np").items()}
               for t in texts]
    model = ov.Core().read_model(str(exported / "openvino" / "openvino_model.xml"))
    quantized = nncf.quantize(model, nncf.Dataset(samples), subset_size=len(samples),
                              model_type=nncf.ModelType.TRANSFORMER)
    ov.save_model(quantized, str(exported / name), compress_to_fp16=False)
    return name


def _properties(st) -> dict[str, str]:
    """The compiled model's settings that decide its speed, as OpenVINO reports them."""
    compiled = st[0].auto_model.request
    keys = ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "PERFORMANCE_HINT",
            "NUM_STREAMS", "EXECUTION_MODE_HINT")
    return {k: str(compiled.get_property(k)) for k in keys}


def _setup(req: dict) -> tuple[dict, dict]:
    """Build the encoders a `setup` request asks for; return them and what to report."""
    from importlib.metadata import version

    from sentence_transformers import SentenceTransformer
    model_dir = pathlib.Path(req["model_dir"])
    config = {**FLOAT_HINT, "INFERENCE_NUM_THREADS": req["threads"]}
    t0 = time.perf_counter()
    exported = _exported(model_dir)
    info: dict[str, Any] = {"export_s": time.perf_counter() - t0}
    encoders = {"float32": SentenceTransformer(str(exported), device="cpu",
                                               backend="openvino",
                                               model_kwargs={"ov_config": dict(config)})}
    if req.get("calibration_texts"):
        t0 = time.perf_counter()
        name = _quantized(exported, req["calibration_texts"], req["max_length"])
        info["quantize_s"] = time.perf_counter() - t0
        info["int8_file"] = name
        encoders["int8"] = SentenceTransformer(
            str(exported), device="cpu", backend="openvino",
            model_kwargs={"file_name": name, "ov_config": dict(config)})
    if req.get("default_hint"):
        encoders["float32 weights, default hint"] = SentenceTransformer(
            str(exported), device="cpu", backend="openvino")
    for st in encoders.values():
        st.encode(["warm up"])      # compile now, not inside the first timed call
    info["versions"] = {name: version(name) for name in (
        "openvino", "nncf", "optimum-intel", "optimum", "transformers", "huggingface-hub",
        "tokenizers", "sentence-transformers", "torch")}
    info["versions"]["python"] = sys.executable
    info["compiled"] = {k: _properties(st) for k, st in encoders.items()}
    return encoders, info


def worker() -> None:
    """Answer requests until stdin closes: setup, then encode (name, texts, batch_size)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr            # libraries' prints must not corrupt the pipe
    encoders: dict = {}
    while True:
        try:
            req = pickle.load(inp)
        except EOFError:
            return
        try:
            if req["op"] == "setup":
                encoders, answer = _setup(req)
            else:
                st = encoders[req["name"]]
                wall, cpu, emb = timed_call(
                    lambda: st.encode(req["texts"], batch_size=req["batch_size"]))
                answer = {"seconds": wall, "cpu_seconds": cpu, "embeddings": emb}
        except Exception as exc:   # noqa: BLE001 (reported to the parent, which raises)
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        pickle.dump(answer, out)
        out.flush()


# ----- benchmark side ---------------------------------------------------------------------------
class OpenVinoWorker:
    """The worker process, seen from the benchmark: `setup(...)`, then `encode(name, texts)`
    -> (wall and CPU seconds inside the worker, embeddings)."""

    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen([python, str(pathlib.Path(__file__).resolve())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1"})

    def _ask(self, req: dict) -> dict:
        pickle.dump(req, self.proc.stdin)
        self.proc.stdin.flush()
        answer = pickle.load(self.proc.stdout)
        if "error" in answer:
            raise RuntimeError(f"openvino worker: {answer['error']}")
        return answer

    def setup(self, model_dir: pathlib.Path, threads: int, max_length: int,
              calibration_texts: Optional[list[str]], default_hint: bool) -> dict:
        return self._ask({"op": "setup", "model_dir": str(model_dir), "threads": threads,
                          "max_length": max_length, "calibration_texts": calibration_texts,
                          "default_hint": default_hint})

    def encode(self, name: str, texts: list[str], batch_size: int):
        answer = self._ask({"op": "encode", "name": name, "texts": texts,
                            "batch_size": batch_size})
        return answer["seconds"], answer["cpu_seconds"], answer["embeddings"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def worker_python_problem(python: str) -> Optional[str]:
    """Why `python` cannot run the worker (no openvino / nncf / optimum-intel), or None."""
    probe = "import openvino, nncf, optimum.intel.openvino, sentence_transformers"
    res = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return None if res.returncode == 0 else (res.stderr.strip().splitlines() or ["?"])[-1]


if __name__ == "__main__":
    worker()
