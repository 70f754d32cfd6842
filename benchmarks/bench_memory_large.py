"""Where the memory of one huge request goes, on the real server path (issue 17 item 4).

Runs the real FastAPI app + AsyncLLM (MiniLM) under uvicorn in a child process and sends
it one /v1/embeddings request of N short texts (after a 256-text warm-up), in two modes:

- `profile`: the child traces its Python heap (tracemalloc) and takes snapshots at the two
  moments one request holds the most: the first engine step with N/2 prompts waiting in
  the engine (the input side: bodies, prompts, futures, engine requests; never, once the
  server bounds the engine's backlog) and when every
  output has been collected, just before the answer is built (the output side). Each is
  compared with a snapshot taken before the request; the top holders are printed as bytes
  per input. Output tensors live outside the Python heap, so their bytes (and the
  storage they pin) are counted apart.
- `rss` (no tracing): the child's VmRSS sampled every 20 ms while the answer streams to
  a fast reader and to a slow one (a paced reader: if the server buffered the streamed
  answer on the send side, the slow reader's peak would grow by the answer's size).

    python benchmarks/bench_memory_large.py [--profile 2000] [--rss 1000 10000]

Writes results/bench_memory_large.json.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import vllm  # noqa: F401  (before torch loads, as a user's script)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_serve import Server, free_port  # noqa: E402
from common import machine_info, minilm_dir, write_json  # noqa: E402

TOP = 15


def texts(n: int) -> list[str]:
    return [f"short text number {i} about item {i % 97}" for i in range(n)]


# ----- the server (child process) -------------------------------------------------------
def serve(port: int, trace: bool) -> None:
    """The app as `vllm serve` builds it, plus a /_memory route answering the profile."""
    import types
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm import AsyncLLM
    from vllm.entrypoints.openai.api_server import (bind_socket, build_app,
                                                    freeze_startup_heap, make_server)
    ns = types.SimpleNamespace(uvicorn_log_level="warning", disable_uvicorn_access_log=True,
                               served_model_name=["minilm"])
    engine = AsyncLLM.from_engine_args(EngineArgs.from_kwargs(str(minilm_dir())))
    app = build_app(engine, ns)
    app.add_api_route("/_memory", Probe(engine, app, trace).report, methods=["POST"])
    freeze_startup_heap()
    make_server(app, ns).run(sockets=[bind_socket("127.0.0.1", port)])


def own_rss_mib() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class Probe:
    """VmRSS, and with `trace` tracemalloc snapshots, at the request's input-side and
    output-side peaks."""

    def __init__(self, engine, app, trace: bool) -> None:
        self.engine, self.n, self.trace = engine, 0, trace
        self.rss: dict = {}
        self.snaps: dict = {}
        self.tensors: dict = {}
        ctx = app.state.serving
        run, step = ctx.run, engine.engine.step

        async def traced_run(http, prompts, params, base_id, param="input"):
            outputs = await run(http, prompts, params, base_id, param)
            if self.n and len(outputs) == self.n:
                self.snap("outputs")
                self.tensors = tensor_bytes([o.outputs.data for o in outputs])
            return outputs

        def traced_step():
            sched = engine.engine.scheduler
            if self.n and "admitted" not in self.snaps and len(sched.waiting) >= self.n // 2:
                self.snap("admitted")
            return step()
        ctx.run, engine.engine.step = traced_run, traced_step

    def snap(self, name: str) -> None:
        import tracemalloc
        self.rss[name] = own_rss_mib()
        if self.trace:
            self.snaps[name] = (tracemalloc.take_snapshot(),
                                tracemalloc.get_traced_memory()[0])
        else:
            self.snaps[name] = None

    def report(self, body: dict) -> dict:
        import gc
        import tracemalloc
        if body.get("start"):  # before the request: the baseline
            gc.collect()
            if self.trace:
                tracemalloc.start(1)
            self.n, self.snaps, self.rss = int(body["start"]), {}, {}
            self.snap("base")
            if self.trace:
                tracemalloc.reset_peak()
            return {}
        gc.collect()
        self.snap("after")
        rss = {k: round(v - self.rss["base"], 1) for k, v in self.rss.items()}
        if not self.trace:
            self.n, self.snaps = 0, {}
            return {"rss_rise_mib": rss}
        base, base_bytes = self.snaps["base"]
        peak = tracemalloc.get_traced_memory()[1]
        out = {"inputs": self.n, "rss_rise_mib": rss,
               "peak_per_input": (peak - base_bytes) / self.n,
               "tensors": self.tensors}
        for name in ("admitted", "outputs", "after"):
            if name not in self.snaps:
                continue
            snap, size = self.snaps[name]
            stats = snap.compare_to(base, "lineno")
            out[name] = {"per_input": (size - base_bytes) / self.n,
                         "top": [{"where": where(s.traceback[0]),
                                  "per_input": s.size_diff / self.n,
                                  "count_per_input": s.count_diff / self.n}
                                 for s in stats[:TOP]]}
        tracemalloc.stop()
        self.n, self.snaps = 0, {}
        return out


def where(frame) -> str:
    return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"


def tensor_bytes(tensors: list) -> dict:
    """The outputs' own bytes and the bytes of the distinct storages they keep alive."""
    own = sum(t.numel() * t.element_size() for t in tensors)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return {"per_input_own": own / len(tensors),
            "per_input_pinned": sum(storages.values()) / len(tensors),
            "distinct_storages": len(storages)}


# ----- the client (parent) --------------------------------------------------------------
class Child(Server):
    """`serve` in a subprocess (bench_serve's Server, with this script as the command)."""

    def __init__(self, trace: bool) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench_memory_", suffix=".log",
                                               delete=False)
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port)]
                                     + (["--trace"] if trace else []),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_healthy(300)

    def rss_mib(self) -> float:
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def embed(self, n: int, read_pause: float = 0.0) -> dict:
        """One request of `n` texts, read in 64 KiB chunks with `read_pause` s between
        them; the answer's size and the peak VmRSS rise while it ran."""
        import httpx
        base, peak, done = self.rss_mib(), [0.0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], self.rss_mib())
                time.sleep(0.02)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        size, start = 0, time.perf_counter()
        with httpx.stream("POST", self.url + "/v1/embeddings", json={"input": texts(n)},
                          timeout=3600) as r:
            assert r.status_code == 200, r.read()[:300]
            for chunk in r.iter_raw(65536):
                size += len(chunk)
                time.sleep(read_pause)
        done.set()
        sampler.join()
        return {"inputs": n, "answer_mib": round(size / 2**20, 1),
                "read_pause_s": read_pause, "rss_before_mib": round(base, 1),
                "peak_rise_mib": round(peak[0] - base, 1),
                "seconds": round(time.perf_counter() - start, 1)}

    def memory(self, body: dict) -> dict:
        import httpx
        return httpx.post(self.url + "/_memory", json=body, timeout=600).json()


def profile(n: int) -> dict:
    child = Child(trace=True)
    try:
        child.embed(256)
        child.memory({"start": n})
        child.embed(n)
        result = child.memory({})
    finally:
        child.stop()
    print(f"\n{n} inputs: Python heap peak +{result['peak_per_input']:.0f} B per input; "
          f"output tensors {result['tensors']}")
    for name in ("admitted", "outputs", "after"):
        part = result.get(name)
        if part is None:
            continue
        print(f"-- at '{name}': +{part['per_input']:.0f} B per input; top holders:")
        for row in part["top"]:
            print(f"  {row['per_input']:8.0f} B  {row['count_per_input']:5.1f} obj  "
                  f"{row['where']}")
    return result


def rss(sizes: list[int], slow_pause: float) -> list[dict]:
    child = Child(trace=False)
    rows = []
    try:
        child.embed(256)
        for n, pause in [(n, 0.0) for n in sizes] + [(sizes[-1], slow_pause)]:
            child.memory({"start": n})
            rows.append(child.embed(n, pause))
            rows[-1]["rss_rise_at_mib"] = child.memory({})["rss_rise_mib"]
    finally:
        child.stop()
    for row in rows:
        print(f"{row['inputs']:>6} inputs (pause {row['read_pause_s']} s / 64 KiB): answer "
              f"{row['answer_mib']:6.1f} MiB, RSS {row['rss_before_mib']:.0f} MiB + peak "
              f"{row['peak_rise_mib']:.1f} MiB, {row['seconds']:.1f} s; rise at "
              f"{row['rss_rise_at_mib']}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=int, default=2000, help="inputs traced (0: skip)")
    ap.add_argument("--rss", type=int, nargs="*", default=[1000, 10000])
    ap.add_argument("--slow-pause", type=float, default=0.02,
                    help="the slow reader's pause per 64 KiB (s)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.trace)
    load = pathlib.Path("/proc/loadavg").read_text().split()[:3]
    result = {"load_before": load}
    if args.profile:
        result["profile"] = profile(args.profile)
    if args.rss:
        result["rss"] = rss(args.rss, args.slow_pause)
    result["load_after"] = pathlib.Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average before {' '.join(load)}, after {' '.join(result['load_after'])}")
    write_json("bench_memory_large", {"machine": machine_info(), **result})


if __name__ == "__main__":
    main()
