"""A three-step pipeline (preprocess -> model -> postprocess, trivial numpy work in each step)
composed four ways, measured in the same run, in interleaved rounds (medians):

- (a) an ensemble (``bind_ensemble``: Triton's ensemble scheduler, one call);
- (b) BLS: one bound callable calling the three models with ``server.model(...).infer``, and
  an ``async def`` one awaiting ``infer_async``;
- (c) the client calling the three models one after another (three ``infer`` calls);
- (d) the floor: the three Python functions composed directly (no Triton).

For each: sequential p50 latency, and throughput with 64 requests in flight (64 threads, each
calling in a loop). Prints a table with ratios to the floor.

    python benchmarks/bench_pipeline.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time

import numpy as np

from embedtriton import ModelConfig, Server, Step, Tensor, batch

F32 = np.float32
server = Server()


def pre_raw(x):
    return {"f": x * 0.5}


def model_raw(f):
    return {"g": f + 1.0}


def post_raw(g):
    return {"y": g * 2.0}


pre, model, post = batch(pre_raw), batch(model_raw), batch(post_raw)


@batch
def bls(x):
    f = server.model("Pre").infer({"x": x})["f"]
    g = server.model("Model").infer({"f": f})["g"]
    return server.model("Post").infer({"g": g})


@batch
async def bls_async(x):
    f = (await server.model("Pre").infer_async({"x": x}))["f"]
    g = (await server.model("Model").infer_async({"f": f}))["g"]
    return await server.model("Post").infer_async({"g": g})


def t(name: str) -> Tensor:
    return Tensor(name=name, dtype=F32, shape=(4,))


ONE = np.ones((1, 4), F32)


def client_side():
    f = server.model("Pre").infer({"x": ONE})["f"]
    g = server.model("Model").infer({"f": f})["g"]
    return server.model("Post").infer({"g": g})


def floor():
    return post_raw(model_raw(pre_raw(ONE)["f"])["g"])


def p50_us(call, n: int) -> float:
    for _ in range(min(200, n)):
        call()
    out = []
    for _ in range(n):
        start = time.perf_counter_ns()
        call()
        out.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(out)


def throughput(call, in_flight: int, total: int) -> float:
    per_thread = max(1, total // in_flight)
    barrier = threading.Barrier(in_flight + 1)

    def worker() -> None:
        barrier.wait()
        for _ in range(per_thread):
            call()

    threads = [threading.Thread(target=worker) for _ in range(in_flight)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return per_thread * in_flight / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds")
    args = parser.parse_args()
    rounds, seq_n, total = (2, 500, 2000) if args.quick else (5, 3000, 12000)

    batched = ModelConfig(max_batch_size=64)
    server.bind("Pre", pre, [t("x")], [t("f")], batched)
    server.bind("Model", model, [t("f")], [t("g")], batched)
    server.bind("Post", post, [t("g")], [t("y")], batched)
    server.bind_ensemble(
        "Ensemble",
        [
            Step("Pre", {"x": "x"}, {"f": "f"}),
            Step("Model", {"f": "f"}, {"g": "g"}),
            Step("Post", {"g": "g"}, {"y": "y"}),
        ],
        [t("x")],
        [t("y")],
        batched,
    )
    server.bind("BLS", bls, [t("x")], [t("y")], batched)
    server.bind("BLSAsync", bls_async, [t("x")], [t("y")], batched)
    ways = {
        "(a) ensemble": lambda: server.model("Ensemble").infer({"x": ONE}),
        "(b) BLS, sync callable": lambda: server.model("BLS").infer({"x": ONE}),
        "(b) BLS, async callable": lambda: server.model("BLSAsync").infer({"x": ONE}),
        "(c) three client calls": client_side,
        "(d) floor: Python composition": floor,
    }
    print(
        f"three-step pipeline, {rounds} interleaved rounds (medians), {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        file=sys.stderr,
    )
    latency: dict[str, list[float]] = {name: [] for name in ways}
    rate: dict[str, list[float]] = {name: [] for name in ways}
    with server:
        for call in ways.values():  # all answer the same
            np.testing.assert_allclose(call()["y"], floor()["y"])
        for r in range(rounds):
            for name, call in ways.items():
                latency[name].append(p50_us(call, seq_n))
                rate[name].append(throughput(call, 64, total))
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    lat_floor = statistics.median(latency["(d) floor: Python composition"])
    rate_floor = statistics.median(rate["(d) floor: Python composition"])
    print("| pipeline | sequential p50 | x floor | 64 in flight | x floor |\n| --- | --- | --- | --- | --- |")
    for name in ways:
        lat, tput = statistics.median(latency[name]), statistics.median(rate[name])
        print(f"| {name} | {lat:,.1f} µs | {lat / lat_floor:,.1f}x | {tput:,.0f} req/s | {tput / rate_floor:.3f}x |")


if __name__ == "__main__":
    main()
