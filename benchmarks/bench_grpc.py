"""gRPC endpoint throughput and latency with perf_analyzer (AddSub, concurrency 1 and 32).

Starts ``embedtriton``'s gRPC endpoint in a separate process and drives it with the
``perf_analyzer`` binary shipped in the ``tritonclient`` wheel. Two server modes:

- ``full``: the AddSub model (@batch, FP32 [-1] inputs, max_batch_size 128), every request
  through Triton;
- ``floor``: the same endpoint and transport, but ModelInfer answers a canned response
  without running anything (what the transport and the protobuf work alone cost).

Prints a table of medians over ``--repeats`` runs, the full path as a share of the floor,
and the ratio to PyTriton's figures measured on this machine (781 infer/s at concurrency 1,
4,614 at 32).

perf_analyzer (tritonclient 2.51) needs Debian's ``libb64-0d`` and ``libcudart.so.12``; the
script links the copy in the nvidia-pytriton wheel.

    python benchmarks/bench_grpc.py [--repeats 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

from embedtriton.errors import UnavailableError
from embedtriton.tuning.perf import perf_analyzer

PYTRITON = {1: 781.0, 32: 4614.0}  # infer/s, PyTriton 0.7.0 on this machine (the reference)


def serve(mode: str, port: int, transport: str) -> None:
    """The server process: AddSub on gRPC until SIGTERM."""
    import threading

    from embedtriton import ModelConfig, Server, Tensor, batch
    from embedtriton.frontends.grpc import infer, service
    from embedtriton.frontends.grpc import transport as codes

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
        if mode == "floor":
            _answer_canned(server, infer, service, codes)
        server.serve_grpc(f"127.0.0.1:{port}", transport=transport)
        print("ready", flush=True)
        stop.wait()


def _answer_canned(server: Any, infer: Any, service: Any, codes: Any) -> None:
    """Floor mode: ModelInfer repeats one correct reply without running anything."""
    from tritonclient.grpc import service_pb2

    a = np.ones((1, 16), np.float32)
    out = server.model("AddSub").infer({"a": a, "b": a})
    reply = service_pb2.ModelInferResponse(model_name="AddSub", model_version="1")
    for name in ("add", "sub"):
        reply.outputs.add(name=name, datatype="FP32", shape=[1, 16])
        reply.raw_output_contents.append(out[name].tobytes())
    canned = reply.SerializeToString()
    served = [0]
    real_stats = service.Service.model_statistics

    def model_infer(self: Any, request: Any, call: Any) -> None:
        served[0] += 1
        call.send(canned)
        call.finish(codes.OK)

    def model_statistics(self: Any, request: Any, call: Any) -> Any:
        response = real_stats(self, request, call)
        for entry in response.model_stats:  # perf_analyzer wants counts that move
            entry.inference_count = entry.execution_count = served[0]
            entry.inference_stats.success.count = served[0]
        return response

    infer.Inference.model_infer = model_infer
    service.Service.model_statistics = model_statistics
    service.Service.infer_in_c = False  # every ModelInfer through the Python handler above


def perf_analyzer_binary() -> tuple[str, dict[str, str]]:
    """The perf_analyzer from the tritonclient wheel and an environment it runs in (the tuner's finder)."""
    try:
        return perf_analyzer()
    except UnavailableError as exc:
        sys.exit(str(exc))


def measure(
    binary: str, env: dict[str, str], port: int, concurrency: int, seconds: float, protocol: str = "grpc"
) -> tuple[float, float]:
    """(infer/s, p50 latency in µs) from one perf_analyzer run."""
    cmd = [
        binary, "-m", "AddSub", "-x", "1", "-i", protocol, "-u", f"127.0.0.1:{port}",
        "--concurrency-range", str(concurrency), "--shape", "a:16", "--shape", "b:16",
        "--measurement-interval", str(int(seconds * 1000)), "--stability-percentage", "50",
    ]  # fmt: skip
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    throughput = re.search(r"Throughput: ([\d.]+) infer/sec", run.stdout)
    p50 = re.search(r"p50 latency: (\d+) usec", run.stdout)
    if run.returncode != 0 or not throughput or not p50:
        raise RuntimeError(f"perf_analyzer failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    return float(throughput.group(1)), float(p50.group(1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="perf_analyzer measurement window")
    parser.add_argument("--transport", choices=["native", "grpcio"], default="native")
    parser.add_argument("--serve", choices=["full", "floor"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.transport)
        return
    binary, env = perf_analyzer_binary()
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for mode in ("floor", "full"):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", mode, "--port", str(port), "--transport", args.transport],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            if proc.stdout is None or proc.stdout.readline().strip() != "ready":
                sys.exit(f"the {mode} server did not start")
            for concurrency in (1, 32):
                for i in range(args.repeats):
                    r = measure(binary, env, port, concurrency, args.seconds)
                    results.setdefault((mode, concurrency), []).append(r)
                    print(
                        f"  {mode:5} c={concurrency:2} run {i + 1}: {r[0]:8.0f} infer/s  p50 {r[1]:6.0f} µs", flush=True
                    )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            time.sleep(0.5)

    print(f"\nperf_analyzer, AddSub FP32 [1,16] x2, {args.transport} transport, medians of {args.repeats} runs")
    print("| concurrency | floor infer/s | full infer/s | full / floor | full p50 µs | vs PyTriton | target |")
    print("|---|---|---|---|---|---|---|")
    for c in (1, 32):
        floor = statistics.median(t for t, _ in results[("floor", c)])
        full = statistics.median(t for t, _ in results[("full", c)])
        p50 = statistics.median(p for _, p in results[("full", c)])
        print(
            f"| {c} | {floor:,.0f} | {full:,.0f} | {full / floor:.2f} | {p50:,.0f} | "
            f"{full / PYTRITON[c]:.2f}x | >= 2x ({2 * PYTRITON[c]:,.0f}/s) |"
        )


if __name__ == "__main__":
    main()
