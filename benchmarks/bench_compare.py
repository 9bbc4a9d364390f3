"""Before/after: the same data-path measurements on two installs of embedtriton, interleaved.

A refactor of the data path must not cost speed. This script runs each measurement in a fresh
process of each install in turn (base, new, base, new, ...), so both see the same machine noise,
and prints medians with the ratio new / base:

- in process (AddSub, 1 row per request): sequential ``infer`` p50; 64 threads calling ``infer``
  (a dynamic batcher); 64 asyncio tasks awaiting ``infer_async``; ``infer_many`` of 20,000 requests;
- over gRPC: ``perf_analyzer`` at concurrency 1 and 16 against ``serve_grpc`` (the binary in the
  ``tritonclient==2.51.0`` wheel; the driver must run where it is installed).

    git worktree add --detach /tmp/base <commit>      # and install it in its own venv
    python benchmarks/bench_compare.py --base /tmp/base/.venv/bin/python --new .venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

INPROCESS = """
import asyncio, json, statistics, threading, time
import numpy as np
from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor, batch

F32 = np.float32
tensors = ([Tensor(name="a", dtype=F32, shape=(1,)), Tensor(name="b", dtype=F32, shape=(1,))],
           [Tensor(name="add", dtype=F32, shape=(1,)), Tensor(name="sub", dtype=F32, shape=(1,))])
add_sub = batch(lambda a, b: {"add": a + b, "sub": a - b})
one = {"a": np.ones((1, 1), F32), "b": np.ones((1, 1), F32)}
server = Server()
server.bind("AddSub", add_sub, *tensors, config=ModelConfig(max_batch_size=8))
server.bind("Batched", add_sub, *tensors,
            config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=0)))
N = %(n)d
out = {}
with server:
    model, batched = server.model("AddSub"), server.model("Batched")
    for _ in range(1000):
        model.infer(one)
    lat = []
    for _ in range(N // 4):
        t = time.perf_counter_ns(); model.infer(one); lat.append((time.perf_counter_ns() - t) / 1000)
    out["sequential infer p50 (us)"] = statistics.median(lat)

    def threads(k, total):
        each = total // k
        barrier = threading.Barrier(k + 1)
        def work():
            barrier.wait()
            for _ in range(each):
                batched.infer(one)
        ts = [threading.Thread(target=work) for _ in range(k)]
        for t in ts: t.start()
        barrier.wait(); t0 = time.perf_counter()
        for t in ts: t.join()
        return each * k / (time.perf_counter() - t0)
    out["64 threads (inf/s)"] = threads(64, N)

    async def tasks(k, total):
        each = total // k
        async def work():
            for _ in range(each):
                await batched.infer_async(one)
        t0 = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(k)))
        return each * k / (time.perf_counter() - t0)
    out["64 in flight asyncio (inf/s)"] = asyncio.run(tasks(64, N))

    items = [one] * N
    batched.infer_many(items[:1000])
    t0 = time.perf_counter(); batched.infer_many(items, max_in_flight=64)
    out["infer_many (inf/s)"] = N / (time.perf_counter() - t0)
print(json.dumps(out))
"""

SERVE = """
import signal, sys, threading
import numpy as np
from embedtriton import ModelConfig, Server, Tensor, batch
add_sub = batch(lambda a, b: {"add": a + b, "sub": a - b})
server = Server()
server.bind("AddSub", add_sub,
            [Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))],
            [Tensor(name="add", dtype=np.float32, shape=(-1,)), Tensor(name="sub", dtype=np.float32, shape=(-1,))],
            ModelConfig(max_batch_size=128))
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
with server:
    server.serve_grpc("127.0.0.1:%(port)d")
    print("ready", flush=True)
    stop.wait()
"""

HIGHER = ("inf/s", "infer/s")


def inprocess(python: str, n: int) -> dict[str, float]:
    done = subprocess.run([python, "-c", INPROCESS % {"n": n}], capture_output=True, text=True, cwd="/", timeout=600)
    if done.returncode != 0:
        sys.exit(f"{python}: the in-process measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def grpc(python: str, seconds: float) -> dict[str, float]:
    sys.path.insert(0, str(HERE))
    from bench_grpc import free_port, measure, perf_analyzer_binary

    binary, env = perf_analyzer_binary()
    port = free_port()
    proc = subprocess.Popen([python, "-c", SERVE % {"port": port}], stdout=subprocess.PIPE, text=True, cwd="/")
    out: dict[str, float] = {}
    try:
        if proc.stdout is None or proc.stdout.readline().strip() != "ready":
            sys.exit(f"{python}: the gRPC server did not start")
        for concurrency in (1, 16):
            throughput, p50 = measure(binary, env, port, concurrency, seconds)
            out[f"gRPC c{concurrency} (infer/s)"] = throughput
            out[f"gRPC c{concurrency} p50 (us)"] = p50
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the Python of the install to compare against")
    parser.add_argument("--new", default=sys.executable, help="the Python of the install under test")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians over them)")
    parser.add_argument("--requests", type=int, default=40000, help="requests per throughput measurement")
    parser.add_argument("--seconds", type=float, default=3.0, help="perf_analyzer measurement window")
    parser.add_argument("--no-grpc", action="store_true")
    args = parser.parse_args()
    runs: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    for round_ in range(args.rounds):
        order = ("base", "new") if round_ % 2 == 0 else ("new", "base")
        for which in order:
            python = args.base if which == "base" else args.new
            got = inprocess(python, args.requests)
            if not args.no_grpc:
                got.update(grpc(python, args.seconds))
            for name, value in got.items():
                runs[which].setdefault(name, []).append(value)
            print(f"round {round_ + 1} {which}: " + ", ".join(f"{k} {v:,.1f}" for k, v in got.items()), flush=True)
        time.sleep(0.5)
    print(f"\nmedians of {args.rounds} interleaved rounds (new / base: > 1 is faster for inf/s, slower for us)")
    print("| measurement | base | new | new / base |")
    print("|---|---|---|---|")
    for name, values in runs["base"].items():
        base, new = statistics.median(values), statistics.median(runs["new"][name])
        print(f"| {name} | {base:,.1f} | {new:,.1f} | {new / base:.2f} |")


if __name__ == "__main__":
    main()
