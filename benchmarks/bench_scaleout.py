"""Scale-out costs: run-batch on Ray vs LLM.embed, DP=2x1 thread vs DP=1x2 threads serving,
and the prefix-aware router's cost per request.

1. Corpus: `--texts` (20k) English-looking texts of 8-64 words in a Parquet file. Offline
   `LLM(minilm).embed(texts)` (model loaded and warmed first, untimed) against the
   `vllm run-batch -i corpus.parquet --data-parallel-backend ray --data-parallel-size 1`
   path (Ray Data read_parquet -> map_batches(EmbeddingPredictor) -> write_parquet) on a
   local Ray cluster started beforehand (untimed; 3 logical CPUs: the actor declares 2, its
   torch threads, and Ray Data's read/write tasks take the third). The Ray figure is timed
   end to end: the actor's start and model load, reading and writing Parquet included.
   The embeddings are compared (max |diff|).
2. Serving at 32 clients (bench_serve's aiohttp driver, one short text per request):
   `vllm serve MiniLM --data-parallel-size 2` (two replica processes, one torch thread
   each) vs `vllm serve MiniLM` (one engine, two threads), alternated `--repeats` times.
3. Router: `PrefixRouter.route` on 128- and 512-token prompts with a full table (65536
   entries), microseconds per call.

    python benchmarks/bench_scaleout.py [--quick] [--texts 20000] [--repeats 3]

Writes results/bench_scaleout.json.
"""
from __future__ import annotations

import argparse
import asyncio
import pathlib
import random
import sys
import tempfile
import time
import types

import vllm  # noqa: F401  (before torch loads, as a user's script)
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_serve import Server, drive  # noqa: E402
from common import make_texts, median, minilm_dir, write_json  # noqa: E402


def bench_corpus(n: int, batch_size: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray
    from vllm import LLM
    from vllm.entrypoints.batch.corpus import run_on_ray
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace, parse_serve_args
    texts = make_texts(n, 8, 64, seed=0)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_scaleout_"))
    pq.write_table(pa.table({"id": list(range(n)), "text": texts}), tmp / "corpus.parquet")

    llm = LLM(str(minilm_dir()))
    llm.embed(texts[:256], use_tqdm=False)
    start = time.perf_counter()
    ref = np.array([o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)],
                   np.float32)
    offline_s = time.perf_counter() - start
    del llm

    # The actor declares the machine's 2 CPUs (its torch threads); one more logical CPU
    # lets Ray Data's read and write tasks run beside it.
    ray.init(num_cpus=3, include_dashboard=False, logging_level="warning")
    args = vars(parse_serve_args([str(minilm_dir())]))
    for key in ("data_parallel_size", "data_parallel_cpus_per_replica"):
        args.pop(key)
    args = types.SimpleNamespace(**args, input_file=str(tmp / "corpus.parquet"),
                                 output_file=str(tmp / "out"), input_column="text",
                                 output_column="embedding", batch_size=batch_size,
                                 data_parallel_size=1, data_parallel_cpus_per_replica=2.0)
    engine_args = engine_args_from_namespace(args)
    start = time.perf_counter()
    run_on_ray(args, engine_args)
    ray_s = time.perf_counter() - start
    table = pq.read_table(tmp / "out").sort_by("id")
    got = np.array(table.column("embedding").to_pylist(), np.float32)
    ray.shutdown()
    return {"texts": n, "words": "8-64", "offline_embed_s": offline_s,
            "offline_texts_per_s": n / offline_s, "ray_run_batch_s": ray_s,
            "ray_texts_per_s": n / ray_s, "overhead": ray_s / offline_s - 1,
            "max_abs_diff": float(np.abs(got - ref).max()), "rows_out": table.num_rows}


class DPServer(Server):
    """bench_serve's server with extra `vllm serve` flags."""

    def __init__(self, model_dir: pathlib.Path, extra: list[str]) -> None:
        import subprocess
        super().__init__(model_dir, access_log=False)
        self.proc.terminate()
        self.proc.wait()
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
               "--host", "127.0.0.1", "--port", str(self.port),
               "--disable-uvicorn-access-log", *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)


def bench_serving(requests: int, repeats: int) -> dict:
    texts = make_texts(requests, 8, 32, seed=1)
    settings = {"DP=2 x 1 thread": ["--data-parallel-size", "2"], "DP=1 x 2 threads": []}
    rates: dict[str, list[float]] = {k: [] for k in settings}
    lat: dict[str, list[float]] = {k: [] for k in settings}
    for _ in range(repeats):
        for name, extra in settings.items():
            server = DPServer(minilm_dir(), extra)
            try:
                server.wait_healthy(300)
                asyncio.run(drive(server.url, str(minilm_dir()), texts[:64], 32))  # untimed warm-up
                wall, latencies = asyncio.run(drive(server.url, str(minilm_dir()), texts, 32))
            finally:
                server.stop()
            rates[name].append(requests / wall)
            lat[name] += latencies
    out = {}
    for name in settings:
        xs = sorted(lat[name])
        out[name] = {"req_per_s": median(rates[name]), "all_req_per_s": rates[name],
                     "p50_ms": 1e3 * xs[len(xs) // 2], "p99_ms": 1e3 * xs[int(len(xs) * .99)]}
    out["ratio_dp2_over_dp1"] = out["DP=2 x 1 thread"]["req_per_s"] / \
        out["DP=1 x 2 threads"]["req_per_s"]
    return out


def bench_router(calls: int) -> dict:
    from vllm.scaleout.router import PrefixRouter
    rng = random.Random(0)
    out = {}
    for length in (128, 512):
        router = PrefixRouter(2, 16, capacity=1 << 16)
        prompts = [[rng.randrange(30000) for _ in range(length)] for _ in range(calls)]
        for p in prompts:  # fill the table to capacity first
            router.route(p, [0, 0], [True, True])
        start = time.perf_counter()
        for p in prompts:
            router.route(p, [0, 0], [True, True])
        out[f"{length}_tokens_us"] = 1e6 * (time.perf_counter() - start) / calls
        out["table_entries"] = len(router)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=20000)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--only", nargs="*", default=["router", "corpus", "serve"])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.texts, a.requests, a.repeats = 1000, 128, 1
    result: dict = {}
    if "router" in a.only:
        result["router"] = bench_router(4096)
        print("router:", result["router"], flush=True)
    if "corpus" in a.only:
        result["corpus"] = bench_corpus(a.texts, a.batch_size)
        print("corpus:", result["corpus"], flush=True)
    if "serve" in a.only:
        result["serve_32_clients"] = bench_serving(a.requests, a.repeats)
        print("serve:", result["serve_32_clients"], flush=True)
    write_json("bench_scaleout" + ("_quick" if a.quick else ""), result)


if __name__ == "__main__":
    main()
