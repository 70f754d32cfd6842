"""Data-parallel flags shared by `vllm serve` and `vllm run-batch` (upstream's names)."""
from __future__ import annotations

import argparse


def add_data_parallel_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "data parallel", "Run N engine replicas behind one front end (see docs/scaling.md).")
    group.add_argument("--data-parallel-size", "-dp", type=int, default=1, metavar="N",
                       help="Number of engine replicas (default 1).")
    group.add_argument("--data-parallel-backend", "-dpb", choices=["mp", "ray"], default="mp",
                       help="mp: replicas are local processes; ray: Ray actors (needs "
                       "`pip install vllm[ray]`).")
    group.add_argument("--ray-address", default=None,
                       help="Ray cluster to join (default: the RAY_ADDRESS environment "
                       "variable, else a local cluster started for the job).")
    group.add_argument("--data-parallel-cpus-per-replica", type=float, default=1.0,
                       metavar="CPUS", help="CPUs each Ray replica declares (default 1; on "
                       "CUDA each replica also takes one GPU).")
