"""HTTP/REST against gRPC, both our endpoints, with perf_analyzer (AddSub, concurrency 1 and 32).

One server process serves AddSub (@batch, FP32 [-1] inputs, max_batch_size 128) on both
endpoints; the ``perf_analyzer`` binary from the ``tritonclient`` wheel drives them in turn,
``-i http`` (binary tensor data, as perf_analyzer sends it) then ``-i grpc``, interleaved for
``--repeats`` rounds. Prints the medians side by side and HTTP as a share of gRPC (the target
is at least 0.7x at both concurrencies), and PyTriton's HTTP figure measured on this machine
(about 1.3 ms per sequential call).

    python benchmarks/bench_http.py [--repeats 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time

import numpy as np
from bench_grpc import free_port, measure, perf_analyzer_binary

PYTRITON_HTTP_SEQUENTIAL_US = 1300.0  # PyTriton 0.7.0's HTTP path, one call at a time, this machine


def serve(http_port: int, grpc_port: int) -> None:
    """The server process: AddSub on HTTP and gRPC until SIGTERM."""
    import threading

    from embedtriton import ModelConfig, Server, Tensor, batch

    @batch
    def add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
        return {"add": a + b, "sub": a - b}

    server = Server()
    server.bind(
        "AddSub",
        add_sub,
        [Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))],
        [Tensor(name="add", dtype=np.float32, shape=(-1,)), Tensor(name="sub", dtype=np.float32, shape=(-1,))],
        ModelConfig(max_batch_size=128),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        server.serve_http(f"127.0.0.1:{http_port}")
        server.serve_grpc(f"127.0.0.1:{grpc_port}")
        print("ready", flush=True)
        stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="perf_analyzer measurement window")
    parser.add_argument("--serve", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    binary, env = perf_analyzer_binary()
    ports = {"http": free_port(), "grpc": free_port()}
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(ports["http"]), str(ports["grpc"])], stdout=subprocess.PIPE, text=True
    )
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    try:
        if proc.stdout is None or proc.stdout.readline().strip() != "ready":
            sys.exit("the server did not start")
        for i in range(args.repeats):
            for concurrency in (1, 32):
                for protocol in ("http", "grpc"):
                    r = measure(binary, env, ports[protocol], concurrency, args.seconds, protocol)
                    results.setdefault((protocol, concurrency), []).append(r)
                    print(f"  round {i + 1} {protocol:4} c={concurrency:2}: {r[0]:8.0f} infer/s  p50 {r[1]:6.0f} µs")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(0.2)

    print(f"\nperf_analyzer, AddSub FP32 [1,16] x2, medians of {args.repeats} interleaved rounds")
    print("| concurrency | gRPC infer/s | HTTP infer/s | HTTP / gRPC | gRPC p50 µs | HTTP p50 µs | target |")
    print("|---|---|---|---|---|---|---|")
    for c in (1, 32):
        grpc = statistics.median(t for t, _ in results[("grpc", c)])
        http = statistics.median(t for t, _ in results[("http", c)])
        grpc_p50 = statistics.median(p for _, p in results[("grpc", c)])
        http_p50 = statistics.median(p for _, p in results[("http", c)])
        print(
            f"| {c} | {grpc:,.0f} | {http:,.0f} | {http / grpc:.2f} | {grpc_p50:,.0f} | {http_p50:,.0f} | "
            f"HTTP >= 0.7x gRPC ({'met' if http / grpc >= 0.7 else 'NOT met'}) |"
        )
    http1 = statistics.median(p for _, p in results[("http", 1)])
    print(f"\nHTTP sequential p50 {http1:,.0f} µs vs PyTriton's HTTP ~{PYTRITON_HTTP_SEQUENTIAL_US:,.0f} µs: "
          f"{PYTRITON_HTTP_SEQUENTIAL_US / http1:.1f}x faster")  # fmt: skip


if __name__ == "__main__":
    main()
