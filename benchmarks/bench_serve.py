"""Serving throughput and latency: `vllm serve` on loopback vs offline `LLM.embed`.

Starts `python -m vllm.entrypoints.cli.main serve <MiniLM dir> --host 127.0.0.1 --port P`
in a subprocess (access log off; waits on /health; always terminated in `finally`) and
drives POST /v1/embeddings with 1, 8 and 32 concurrent clients (aiohttp, as upstream's
serving benchmark, or `--client httpx`; one text per request, 256 requests per level; the
same 8-200-word texts as bench_embed). In this process, offline `LLM(dir).embed(texts)` runs on the same texts; each repeat runs
offline, then every level, then all texts in one request, so noise hits all alike. Reports
requests/s (median over repeats), p50/p99 latency (over all repeats' requests), model FLOP
utilisation, each level's ratio to the offline texts/s and to the one-request rate of the
same server (the per-request HTTP cost, free of the offline run's own process, whose speed
differs by a few % from launch to launch), the same ratio paired per repeat (each level
against its own repeat's offline run: on a VM whose speed drifts by 20-60% over minutes
the pairs share the drift), and the server's CPU seconds over offline's (how much more work
serving costs, whether or not the cores were busy); then one short input, sequentially at 1 client
(p50) vs the offline single-request time (median), interleaved in rounds.
The client shares the CPU with the server, as it would on a one-box deployment.

    python benchmarks/bench_serve.py [--quick] [--concurrency 1,8,32] [--requests 256]

Writes results/bench_serve.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import httpx

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_peak import measured_peak  # noqa: E402
from common import (FLOP_FORMULA, block_linear_params, make_texts, median,  # noqa: E402
                    minilm_dir, model_flops, warn_if_over_peak, write_json)

SHORT = "What is the capital of France?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def level_label(clients: int) -> str:
    return f"serve, {clients} client{'s' if clients != 1 else ''}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) has used so far."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]  # nearest rank


class Server:
    """`vllm serve` in a subprocess, its output in a log file."""

    def __init__(self, model_dir: pathlib.Path, access_log: bool):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench_serve_", suffix=".log",
                                               delete=False)
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
               "--host", "127.0.0.1", "--port", str(self.port)]
        if not access_log:
            cmd.append("--disable-uvicorn-access-log")
        # The server runs with this environment as a user's would (tokenizer parallelism
        # on unless the caller turned it off: at 32 clients it made no difference, 0.996x).
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"server not healthy after {timeout:.0f}s:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        self.log.flush()
        return "".join(pathlib.Path(self.log.name).read_text().splitlines(True)[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


async def drive(url: str, model: str, texts: list[str], clients: int,
                client_lib: str = "aiohttp") -> tuple[float, list]:
    """Send every text once from `clients` concurrent workers over keep-alive connections;
    (wall seconds, latencies). Each response is parsed and checked (384 floats)."""
    latencies: list[float] = []
    queue = iter(range(len(texts)))
    post = await _poster(url, clients, client_lib)

    async def worker():
        for i in queue:
            start = time.perf_counter()
            status, body = await post.send({"model": model, "input": texts[i]})
            latencies.append(time.perf_counter() - start)
            if status != 200 or len(json.loads(body)["data"][0]["embedding"]) != 384:
                raise RuntimeError(f"request {i}: {status} {body[:200]!r}")

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return time.perf_counter() - start, latencies
    finally:
        await post.close()


async def drive_one_request(url: str, model: str, texts: list[str],
                            client_lib: str = "aiohttp") -> float:
    """Send every text in one request (the server's own batch rate, free of per-request HTTP
    work); wall seconds. The response is checked (one 384-float embedding per text)."""
    post = await _poster(url, 1, client_lib)
    try:
        start = time.perf_counter()
        status, body = await post.send({"model": model, "input": texts})
        wall = time.perf_counter() - start
        data = json.loads(body)["data"] if status == 200 else None
        if data is None or len(data) != len(texts) or len(data[0]["embedding"]) != 384:
            raise RuntimeError(f"one request of {len(texts)} texts: {status} {body[:200]!r}")
        return wall
    finally:
        await post.close()


async def _poster(url: str, clients: int, client_lib: str):
    """A `send(json) -> (status, body)` over `clients` pooled connections. aiohttp is what
    upstream vLLM's serving benchmark drives with (about 0.25 ms of client CPU per request
    here); httpx costs about 1.6 ms, which on 2 shared cores is taken from the server."""
    if client_lib == "aiohttp":
        import aiohttp
        session = aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients),
                                        timeout=aiohttp.ClientTimeout(total=300))

        async def send(payload):
            async with session.post("/v1/embeddings", json=payload) as r:
                return r.status, await r.read()
        return _Poster(send, session.close)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    client = httpx.AsyncClient(base_url=url, limits=limits, timeout=300)

    async def send_httpx(payload):
        r = await client.post("/v1/embeddings", json=payload)
        return r.status_code, r.content
    return _Poster(send_httpx, client.aclose)


class _Poster:
    def __init__(self, send, close) -> None:
        self.send, self.close = send, close


def default_client() -> str:
    try:
        import aiohttp  # noqa: F401
        return "aiohttp"
    except ImportError:
        return "httpx"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=256, help="requests per level and repeat")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--short-rounds", type=int, default=5,
                    help="rounds of 10 offline + 10 served single short requests")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--access-log", action="store_true", help="keep uvicorn's access log on")
    ap.add_argument("--client", choices=["aiohttp", "httpx"], default=default_client(),
                    help="the load generator's HTTP library (default: aiohttp if installed)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 64 requests, 2 repeats")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.repeats = min(args.requests, 64), min(args.repeats, 2)
        args.short_rounds = min(args.short_rounds, 2)
    levels = [int(c) for c in args.concurrency.split(",")]

    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from vllm import LLM

    model_dir = minilm_dir()
    texts = make_texts(args.requests, 8, 200, seed=args.seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    lengths = [len(ids) for ids in tok(texts, truncation=True, max_length=256)["input_ids"]]
    cfg = AutoConfig.from_pretrained(model_dir)
    linear = block_linear_params(AutoModel.from_pretrained(model_dir).encoder)
    flops = model_flops(lengths, linear, cfg.num_hidden_layers, cfg.hidden_size)
    peak = measured_peak("float32")

    server = Server(model_dir, args.access_log)
    try:
        server.wait_healthy()
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        llm = LLM(str(model_dir))
        offline = lambda: llm.embed(texts, use_tqdm=False)  # noqa: E731
        # Warm-up, both sides: every setting once, untimed, as offline runs its texts once.
        # A server's heap grows to fit each new mix of step sizes the first time it meets
        # it (page faults), which offline, repeating the same steps, never pays again.
        offline()
        for c in levels:
            asyncio.run(drive(server.url, model, texts, c, args.client))
        asyncio.run(drive_one_request(server.url, model, texts, args.client))

        walls: dict = {"offline": [], "one_request": []}
        walls.update({c: [] for c in levels})
        cpus: dict = {k: [] for k in walls}  # CPU s: offline's own process, else the server's
        lats: dict = {c: [] for c in levels}
        pid = server.proc.pid
        for _ in range(args.repeats):
            start, cpu = time.perf_counter(), cpu_seconds(os.getpid())
            offline()
            walls["offline"].append(time.perf_counter() - start)
            cpus["offline"].append(cpu_seconds(os.getpid()) - cpu)
            for c in levels:
                cpu = cpu_seconds(pid)
                wall, lat = asyncio.run(drive(server.url, model, texts, c, args.client))
                cpus[c].append(cpu_seconds(pid) - cpu)
                walls[c].append(wall)
                lats[c] += lat
            cpu = cpu_seconds(pid)
            walls["one_request"].append(asyncio.run(drive_one_request(
                server.url, model, texts, args.client)))
            cpus["one_request"].append(cpu_seconds(pid) - cpu)

        single_off, single_srv = [], []
        for _ in range(args.short_rounds):
            for _ in range(10):
                start = time.perf_counter()
                llm.embed(SHORT, use_tqdm=False)
                single_off.append(time.perf_counter() - start)
            single_srv += asyncio.run(drive(server.url, model, [SHORT] * 10, 1,
                                            args.client))[1]
    finally:
        server.stop()

    off_rate = len(texts) / median(walls["offline"])
    rows = {"offline LLM.embed": {
        "requests_per_s": off_rate, "p50_ms": None, "p99_ms": None, "ratio_to_offline": 1.0,
        "mfu": flops / median(walls["offline"]) / 1e9 / peak}}
    one_rate = len(texts) / median(walls["one_request"])

    def paired(key) -> dict:
        """Per repeat, against that repeat's offline run (the machine's speed drifts between
        repeats; a pair shares it): median wall ratio, and server CPU s / offline CPU s."""
        return {"ratio_to_offline_paired": median(
                    [o / w for o, w in zip(walls["offline"], walls[key])]),
                "cpu_to_offline": median([c / o for o, c in zip(cpus["offline"], cpus[key])])}
    rows["serve, one request"] = {
        "requests_per_s": one_rate, "p50_ms": None, "p99_ms": None,
        "ratio_to_offline": one_rate / off_rate, **paired("one_request"),
        "mfu": flops / median(walls["one_request"]) / 1e9 / peak}
    for c in levels:
        rate = len(texts) / median(walls[c])
        rows[level_label(c)] = {
            "clients": c, "requests_per_s": rate, "p50_ms": 1e3 * percentile(lats[c], 50),
            "p99_ms": 1e3 * percentile(lats[c], 99), "ratio_to_offline": rate / off_rate,
            **paired(c), "ratio_to_one_request": rate / one_rate,
            "mfu": flops / median(walls[c]) / 1e9 / peak}
    short = {"text": SHORT, "offline_median_ms": 1e3 * median(single_off),
             "serve_p50_ms": 1e3 * percentile(single_srv, 50),
             "serve_p99_ms": 1e3 * percentile(single_srv, 99)}
    short["ratio"] = short["serve_p50_ms"] / short["offline_median_ms"]

    print(f"{len(texts)} texts (8-200 words), {sum(lengths)} tokens, {args.repeats} repeats "
          f"of offline + every level; peak {peak:.0f} GFLOP/s float32")
    print(f"{'setting':<20} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'vs offline':>10} "
          f"{'paired':>7} {'CPU s':>6} {'MFU':>6}")
    for label, r in rows.items():
        p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.1f}"
        p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f}"
        pair = f"{r['ratio_to_offline_paired']:.2f}x" if "cpu_to_offline" in r else "-"
        cpu = f"{r['cpu_to_offline']:.2f}x" if "cpu_to_offline" in r else "-"
        print(f"{label:<20} {r['requests_per_s']:>7.1f} {p50:>8} {p99:>8} "
              f"{r['ratio_to_offline']:>9.2f}x {pair:>7} {cpu:>6} {100 * r['mfu']:>5.1f}%")
    print("paired: the median over repeats of (that repeat's offline wall / this setting's "
          "wall); CPU s: the server's CPU seconds / offline's, per repeat (median)")
    top = rows[level_label(max(levels))]
    print(f"{max(levels)} clients vs all texts in one request to the same server: "
          f"{top['ratio_to_one_request']:.2f}x (the per-request HTTP cost, free of the "
          "offline run's process)")
    print(f"one short input ({len(tok(SHORT)['input_ids'])} tokens): serve p50 "
          f"{short['serve_p50_ms']:.1f} ms vs offline {short['offline_median_ms']:.1f} ms "
          f"({short['ratio']:.2f}x)")
    warn_if_over_peak({k: r["mfu"] for k, r in rows.items()})
    write_json("bench_serve", {
        "texts": len(texts), "tokens": sum(lengths), "requests_per_level": len(texts),
        "concurrency": levels, "repeats": args.repeats, "quick": args.quick,
        "access_log": args.access_log, "client": args.client,
        "dtype": "float32", "peak_gflops": peak, "model_tflop_per_pass": flops / 1e12,
        "flop_formula": FLOP_FORMULA,
        "seconds": {str(k): v for k, v in walls.items()},
        "cpu_seconds": {str(k): v for k, v in cpus.items()}, "results": rows,
        "short_input": {**short, "offline_s": single_off, "serve_s": single_srv},
        "latency_stdev_ms": {str(c): 1e3 * statistics.pstdev(lats[c]) for c in levels}})


if __name__ == "__main__":
    main()
