"""Soak: does a served engine's memory level off under steady traffic?

Starts `vllm serve` (MiniLM) in a subprocess, then runs ROUNDS rounds of REQUESTS mixed
requests (1-4 fresh texts of 8-200 words each; every round new texts) from CLIENTS
concurrent clients, and reads the server's resident memory (VmRSS) after each round.
Target: RSS after the last round within 10% of RSS after round 3. Then the server is left
idle past its heap trimmer's idle time (`HEAP_TRIM_IDLE_S`) and its RSS read again: the free
step buffers it kept for reuse while busy go back to the OS.

`--large N...` instead sends one request of N short texts for each N (after a warm-up),
streams the answer to nowhere, and samples the server's VmRSS every 20 ms: the peak rise
over the idle RSS, against the answer's size, says whether a huge request is processed in
bounded memory (issue 17 item 4).

    python benchmarks/bench_soak.py [--rounds 20] [--requests 1280] [--clients 64]
    python benchmarks/bench_soak.py --large 1000 10000

Writes results/bench_soak.json (the whole curve) or results/bench_soak_large.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import sys
import time

import vllm  # noqa: F401  (before torch loads, as a user's script)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_serve import Server, _poster  # noqa: E402

from vllm.platforms.cpu_malloc import HEAP_TRIM_IDLE_S  # noqa: E402
from common import machine_info, make_texts, minilm_dir, write_json  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def round_bodies(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    sizes = [rng.randint(1, 4) for _ in range(n)]
    texts = iter(make_texts(sum(sizes), 8, 200, seed=seed))
    return [[next(texts) for _ in range(k)] for k in sizes]


async def run_round(url: str, bodies: list[list[str]], clients: int) -> float:
    post = await _poster(url, clients, "aiohttp")
    queue = iter(bodies)

    async def worker() -> None:
        for texts in queue:
            status, body = await post.send({"input": texts})
            if status != 200 or len(json.loads(body)["data"]) != len(texts):
                raise RuntimeError(f"{status} {body[:200]!r}")
    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return time.perf_counter() - start
    finally:
        await post.close()


def large_request(url: str, pid: int, n: int) -> dict:
    """One /v1/embeddings request of `n` short texts; the answer's bytes and the peak RSS
    rise over the RSS just before it."""
    import threading
    import httpx
    base, peak, done = rss_mib(pid), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(pid))
            time.sleep(0.02)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    size = 0
    start = time.perf_counter()
    body = {"input": [f"short text number {i} about item {i % 97}" for i in range(n)]}
    with httpx.stream("POST", url + "/v1/embeddings", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:200]!r}")
        for chunk in r.iter_bytes():
            size += len(chunk)
    done.set()
    sampler.join()
    return {"inputs": n, "answer_mib": round(size / 2**20, 1), "rss_before_mib": round(base, 1),
            "peak_rise_mib": round(peak[0] - base, 1),
            "seconds": round(time.perf_counter() - start, 1)}


def run_large(sizes: list[int]) -> None:
    server = Server(minilm_dir(), access_log=False)
    try:
        server.wait_healthy()
        large_request(server.url, server.proc.pid, 256)  # warm-up
        rows = [large_request(server.url, server.proc.pid, n) for n in sizes]
    finally:
        server.stop()
    for row in rows:
        print(f"{row['inputs']:>6} inputs: answer {row['answer_mib']:6.1f} MiB, RSS "
              f"{row['rss_before_mib']:.0f} MiB + peak {row['peak_rise_mib']:.1f} MiB, "
              f"{row['seconds']:.1f} s")
    write_json("bench_soak_large", {"machine": machine_info(), "rows": rows})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--requests", type=int, default=1280)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--large", type=int, nargs="+", help="one request of N texts per N")
    args = ap.parse_args()
    if args.large:
        return run_large(args.large)
    server = Server(minilm_dir(), access_log=False)
    curve: list[dict] = []
    try:
        server.wait_healthy()
        start_rss = rss_mib(server.proc.pid)
        print(f"server up: RSS {start_rss:.0f} MiB")
        for r in range(1, args.rounds + 1):
            wall = asyncio.run(run_round(server.url, round_bodies(args.requests, seed=r),
                                         args.clients))
            curve.append({"round": r, "rss_mib": round(rss_mib(server.proc.pid), 1),
                          "requests_per_s": round(args.requests / wall, 1)})
            print(f"round {r:2d}: RSS {curve[-1]['rss_mib']:7.1f} MiB, "
                  f"{curve[-1]['requests_per_s']:.1f} req/s", flush=True)
        time.sleep(HEAP_TRIM_IDLE_S + 2)
        idle_rss = rss_mib(server.proc.pid)
        print(f"after {HEAP_TRIM_IDLE_S + 2:.0f} s idle: RSS {idle_rss:.1f} MiB")
    finally:
        server.stop()
    ref = curve[min(2, len(curve) - 1)]["rss_mib"]
    growth = curve[-1]["rss_mib"] / ref - 1
    ok = growth <= 0.10
    print(f"RSS after round {len(curve)} vs round 3: {100 * growth:+.1f}% "
          f"({'within' if ok else 'OVER'} the 10% target)")
    write_json("bench_soak", {"machine": machine_info(), "args": vars(args),
                              "start_rss_mib": start_rss, "curve": curve,
                              "idle_rss_mib": idle_rss,
                              "growth_vs_round3": growth, "target_met": ok})


if __name__ == "__main__":
    main()
