#!/usr/bin/env python3
"""Requests/s and latency of kiln.serve (Ray Serve) on a local, loopback-only Ray.

For 1 and 2 replicas, with dynamic batching off (max batch 1) and on, a fixed number of
client threads on this machine each send the same number of requests (one .npy input of
the model's shape, batch 1) over keep-alive HTTP connections; prints a Markdown table of
requests/s, p50/p99 latency and the mean requests per run. Every answer is checked (status
200, output shape). Run with the project venv, where the kiln package is installed
(`make python-test` installs it):

    .venv/bin/python tools/bench/serve_bench.py [--model models/tiny-cnn/model.onnx]
        [--clients 8] [--requests 2000] [--replicas 1,2] [--batch-sizes 1,8]
"""

from __future__ import annotations

import argparse
import http.client
import io
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

# A single-node Ray on the loopback address; no usage statistics sent. Before importing Ray.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402

import kiln  # noqa: E402
from kiln.serve import build_app  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "tiny-cnn" / "model.onnx"))
    p.add_argument("--clients", type=int, default=8, help="concurrent client threads")
    p.add_argument("--requests", type=int, default=2000, help="timed requests per row")
    p.add_argument("--warmup", type=int, default=100, help="untimed requests per row")
    p.add_argument("--replicas", default="1,2")
    p.add_argument("--batch-sizes", default="1,8", help="max batch sizes (1: no batching)")
    p.add_argument("--batch-wait-ms", type=float, default=2.0)
    return p.parse_args()


def request_body(model: str) -> bytes:
    """One input of the model's shape with batch 1 (symbolic dimensions taken as 1)."""
    (arg,) = kiln.InferenceSession(model).get_inputs()
    shape = [d if isinstance(d, int) else 1 for d in arg.shape]
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    return buffer.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(port: int, body: bytes, clients: int, total: int) -> tuple[float, list[float], list[int]]:
    """Wall time, per-request latencies (s) and X-Kiln-Batch-Size of `total` requests sent by
    `clients` threads."""
    latencies: list[float] = []
    batches: list[int] = []
    lock = threading.Lock()
    errors: list[str] = []

    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine, sizes = [], []
        try:
            for _ in range(n):
                start = time.perf_counter()
                conn.request("POST", "/bench", body, {"Content-Type": "application/x-npy",
                                                      "Accept": "application/x-npy"})
                response = conn.getresponse()
                answer = response.read()
                mine.append(time.perf_counter() - start)
                if response.status != 200:
                    raise RuntimeError(f"status {response.status}: {answer[:200]!r}")
                np.load(io.BytesIO(answer))
                sizes.append(int(response.getheader("X-Kiln-Batch-Size")))
        except Exception as e:  # noqa: BLE001 - reported after the run
            errors.append(str(e))
        finally:
            conn.close()
        with lock:
            latencies.extend(mine)
            batches.extend(sizes)

    threads = [threading.Thread(target=client, args=(total // clients + (i < total % clients),))
               for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise SystemExit(f"serve_bench: a request failed: {errors[0]}")
    return wall, latencies, batches


def direct_run_ms(model: str, body: bytes, runs: int = 200) -> float:
    """Median time of the same request run by a kiln session in this process (1 thread):
    what a replica spends in kiln per batch-1 request, the rest being serving."""
    options = kiln.SessionOptions()
    options.intra_op_num_threads = 1
    session = kiln.InferenceSession(model, options)
    feed = {session.get_inputs()[0].name: np.load(io.BytesIO(body))}
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times[runs // 10:]) * 1e3


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> None:
    args = parse_args()
    body = request_body(args.model)
    direct_ms = direct_run_ms(args.model, body)
    replicas = [int(r) for r in args.replicas.split(",")]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    port = free_port()
    ray.init(address="local", include_dashboard=False, num_cpus=max(replicas),
             log_to_driver=False, logging_level="ERROR")
    rows = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port},
                    logging_config={"log_level": "WARNING", "enable_access_log": False})
        for r in replicas:
            for b in batch_sizes:
                app = build_app(args.model, replicas=r, max_batch_size=b,
                                batch_wait_ms=args.batch_wait_ms, threads=1, num_cpus=1)
                serve.run(app, name="bench", route_prefix="/bench")
                load(port, body, args.clients, args.warmup)
                wall, latencies, batches = load(port, body, args.clients, args.requests)
                rows.append((r, b, len(latencies) / wall, percentile(latencies, 50) * 1e3,
                             percentile(latencies, 99) * 1e3, statistics.mean(batches)))
                print(f"serve_bench: {r} replica(s), max batch {b}: {rows[-1][2]:.0f} req/s",
                      file=sys.stderr, flush=True)
                serve.delete("bench")
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"{Path(args.model).parent.name}/{Path(args.model).name}, {args.clients} clients, "
          f"{args.requests} requests per row (batch-1 .npy inputs), batch wait "
          f"{args.batch_wait_ms:g} ms, 1 kiln thread per replica; the same request run by kiln "
          f"in process: {direct_ms:.2f} ms (median, 1 thread)\n")
    print("| replicas | max batch | requests/s | p50 ms | p99 ms | requests per run |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r, b, rps, p50, p99, mean_batch in rows:
        print(f"| {r} | {b} | {rps:.0f} | {p50:.1f} | {p99:.1f} | {mean_batch:.2f} |")


if __name__ == "__main__":
    main()
