"""embedtriton against Triton's own floor, in one process-run on this machine.

The floor is Triton with no Python anywhere on the request path: a C backend
(floor/floor_backend.c, FP32 add/sub, copy in -> out) driven through the C API by a C client
(floor/floor_driver.c, called through ctypes, which waits in C without the GIL). Both are built
here with gcc and never shipped. They run on the same libtritonserver, in the same Server, with
the same options as embedtriton's AddSub, which is measured in the same rounds. Measures:

- sequential p50 (and p99), dynamic batcher (max 8) and batching off;
- 64 threads, each one request at a time, req/s;
- 64 in flight from one thread (C: a completion queue; ours: asyncio tasks, and
  ``Model.infer_many`` with max_in_flight=64), req/s;
- the bare Python call of the function, a plain two-thread hand-off (a Python thread
  handing each call to another and waiting for it), and 64 Python threads handing calls to
  one worker thread (no Triton): what Python itself costs, and allows, on this machine.

Medians of --rounds interleaved rounds; the table prints embedtriton / floor for each row and
writes benchmarks/results/floor.json.

    nox -s bench                 (runs it after the other benchmarks)
    python benchmarks/bench_floor.py --rounds 5 --seconds 1
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from bench_inprocess import sequential_latencies  # (benchmarks/ is the script's folder)

from embedtriton import DynamicBatcher, ModelConfig, Server, ServerConfig, Tensor, batch
from embedtriton.backend.request import Request
from embedtriton.triton import runtime

HERE = Path(__file__).parent
RESULTS = HERE / "results"
F32 = np.float32
CONFIG = """name: "{name}"
backend: "floor"
max_batch_size: {mbs}
{batching}
input [ {{ name: "a" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "b" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "add" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "sub" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def add_sub_raw(a, b):
    return {"add": a + b, "sub": a - b}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(work: Path) -> tuple[Path, Path]:
    """The floor's two libraries, linked against the libtritonserver this process loads."""
    library = runtime.find_runtime().library
    if shutil.which("gcc") is None:
        sys.exit("bench_floor: gcc is needed to build the floor (apt-get install gcc)")
    out = {}
    for name, lib in (("floor_driver", "libfloor_driver.so"), ("floor_backend", "libtriton_floor.so")):
        target = work / lib
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(HERE / "floor" / f"{name}.c"), "-o", str(target),
                        "-Wl,--no-as-needed", str(library), "-lpthread"], check=True)  # fmt: skip
        out[name] = target
    repo = work / "repository"
    for name, mbs, batching in (("FloorBatched", 8, "dynamic_batching { }"), ("FloorPlain", 0, "")):
        folder = repo / name
        (folder / "1").mkdir(parents=True)
        shutil.copy(out["floor_backend"], folder / "libtriton_floor.so")
        (folder / "config.pbtxt").write_text(CONFIG.format(name=name, mbs=mbs, batching=batching))
    return out["floor_driver"], repo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="each throughput measurement")
    parser.add_argument("--sequential", type=int, default=3000, help="requests per sequential measurement")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="embedtriton-floor-"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def threads_rps(call, threads: int, seconds: float) -> float:
    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)
    until = [0.0]

    def worker(k: int) -> None:
        barrier.wait()
        n = 0
        while time.perf_counter() < until[0]:
            call()
            n += 1
        counts[k] = n

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    started = time.perf_counter()
    until[0] = started + seconds
    barrier.wait()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


def asyncio_rps(model, inputs, in_flight: int, seconds: float) -> float:
    async def go() -> float:
        count = 0
        until = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal count
            while time.perf_counter() < until:
                await model.infer_async(inputs)
                count += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return count / (time.perf_counter() - started)

    return asyncio.run(go())


def many_rps(model, inputs, in_flight: int, seconds: float) -> float:
    batch = [inputs] * (in_flight * 16)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        count += len(model.infer_many(batch, max_in_flight=in_flight))
    return count / (time.perf_counter() - started)


def through_worker(measure):
    """``measure(call)`` where ``call`` hands one add/sub to a Python worker thread and waits
    for its answer (threading.Event): Python's own cost of a hand-off, with no Triton."""
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    a, b = np.ones((1, 1), F32), np.ones((1, 1), F32)

    def worker() -> None:
        while (job := jobs.get()) is not None:
            job[1] = add_sub_raw(a, b)
            job[0].set()

    thread = threading.Thread(target=worker)
    thread.start()

    def call() -> None:
        job = [threading.Event(), None]
        jobs.put(job)
        job[0].wait()

    try:
        return measure(call)
    finally:
        jobs.put(None)
        thread.join()


def python_threads_rps(threads: int, seconds: float) -> float:
    """64 Python threads each hand calls to one Python worker thread and wait (no Triton)."""
    return through_worker(lambda call: threads_rps(call, threads, seconds))


STAGES = ("queue", "compute_input", "compute_infer", "compute_output", "success")


def stage_totals(model) -> dict[str, tuple[int, int]]:
    """Triton's cumulative (ns, count) per stage of one model's statistics."""
    stats = model.statistics()["inference_stats"]
    return {k: (int(stats[k]["ns"]), int(stats[k]["count"])) for k in STAGES}


def stage_means(before: dict, after: dict, latencies: list[float]) -> dict[str, float]:
    """Per-request means (µs) of each stage between two snapshots, with what Triton's stages
    leave out: InferAsync to enqueued (and the last bookkeeping) inside Triton's request time,
    and the time outside Triton (the request built, the caller woken, outputs read)."""
    mean = {k: (after[k][0] - before[k][0]) / max(1, after[k][1] - before[k][1]) / 1000 for k in STAGES}
    inside = sum(mean[k] for k in STAGES[:-1])
    return {
        "InferAsync → enqueued": mean["success"] - inside,
        "queue: hand-off to the model thread": mean["queue"],
        "compute_input": mean["compute_input"],
        "compute_infer": mean["compute_infer"],
        "compute_output": mean["compute_output"],
        "outside Triton": statistics.fmean(latencies) - mean["success"],
        "mean round trip": statistics.fmean(latencies),
        "p50 round trip": statistics.median(latencies),
    }


def handoff_us(n: int) -> float:
    """A Python thread hands each call to a worker thread and waits for its answer."""
    return through_worker(lambda call: statistics.median(sequential_latencies(call, n)))


def run(args: argparse.Namespace, work: Path) -> None:
    driver_path, repo = build(work)
    tensors = (
        [Tensor(name="a", dtype=F32, shape=(1,)), Tensor(name="b", dtype=F32, shape=(1,))],
        [Tensor(name="add", dtype=F32, shape=(1,)), Tensor(name="sub", dtype=F32, shape=(1,))],
    )
    server = Server(ServerConfig(model_repository=[str(repo)], model_control_mode="explicit"))  # loaded below
    server.bind("AddSub", batch(add_sub_raw), *tensors, ModelConfig(max_batch_size=8, batcher=DynamicBatcher()))
    server.bind("AddSubPlain", batch(add_sub_raw), *tensors, ModelConfig(batching=False))
    server.start()  # (loads libtritonserver: the driver links against that copy)
    server.load("FloorBatched")
    server.load("FloorPlain")
    driver = ctypes.CDLL(str(driver_path))
    driver.floor_sequential.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_long, ctypes.POINTER(ctypes.c_int64)]
    driver.floor_sequential.restype = ctypes.c_long
    for fn in (driver.floor_threads, driver.floor_inflight):
        fn.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_double]
        fn.restype = ctypes.c_double
    driver.floor_setup.argtypes = [ctypes.c_void_p]
    batched_in = {"a": np.ones((1, 1), F32), "b": np.ones((1, 1), F32)}
    plain_in = {"a": np.ones((1,), F32), "b": np.ones((1,), F32)}
    rows: dict[str, dict[str, list[float]]] = {}
    stages: dict[str, dict[str, dict[str, list[float]]]] = {}  # batching label -> stage -> ours/floor
    one_request = Request(batched_in)
    one_request.parameters = {}
    batched_call = batch(add_sub_raw)

    def record(row: str, ours: float, floor: float) -> None:
        rows.setdefault(row, {"ours": [], "floor": []})
        rows[row]["ours"].append(ours)
        rows[row]["floor"].append(floor)

    with server:
        if driver.floor_setup(server._handle) != 0:
            sys.exit("bench_floor: the floor driver could not make its response allocator")
        latencies = (ctypes.c_int64 * args.sequential)()

        def floor_seq(model: bytes, batched: int) -> list[float]:
            if driver.floor_sequential(model, batched, args.sequential, latencies) != 0:
                sys.exit(f"bench_floor: the floor's requests to {model.decode()} failed")
            return [v / 1000 for v in latencies[200:]]

        for r in range(args.rounds):
            log(f"round {r + 1}/{args.rounds}")
            for label, name, floor_name, inputs, batched in (
                ("batcher", "AddSub", b"FloorBatched", batched_in, 1),
                ("batching off", "AddSubPlain", b"FloorPlain", plain_in, 0),
            ):
                model, floor_model = server.model(name), server.model(floor_name.decode())
                before = stage_totals(model)
                ours = sequential_latencies(lambda m=model, i=inputs: m.infer(i), args.sequential)
                ours_stages = stage_means(before, stage_totals(model), ours)
                before = stage_totals(floor_model)
                floor = floor_seq(floor_name, batched)
                floor_stages = stage_means(before, stage_totals(floor_model), floor)
                for stage, value in ours_stages.items():
                    entry = stages.setdefault(label, {}).setdefault(stage, {"ours": [], "floor": []})
                    entry["ours"].append(value)
                    entry["floor"].append(floor_stages[stage])
                record(f"sequential p50, {label} (µs)", statistics.median(ours), statistics.median(floor))
                record(f"sequential p99, {label} (µs)", np.percentile(ours, 99), np.percentile(floor, 99))
                record(
                    f"64 threads, {label} (req/s)",
                    threads_rps(lambda m=model, i=inputs: m.infer(i), 64, args.seconds),
                    driver.floor_threads(floor_name, batched, 64, args.seconds),
                )
                ours = asyncio_rps(model, inputs, 64, args.seconds)
                floor_inflight = driver.floor_inflight(floor_name, batched, 64, args.seconds)
                record(f"64 in flight, one thread, {label} (req/s)", ours, floor_inflight)
                record(f"infer_many, 64 in flight, {label} (req/s)", many_rps(model, inputs, 64, args.seconds),
                       floor_inflight)  # fmt: skip
            bare = statistics.median(sequential_latencies(lambda: add_sub_raw(batched_in["a"], batched_in["b"]), 20000))
            record("Python: bare call / two-thread hand-off (µs)", bare, handoff_us(5000))
            record(
                "Python: the @batch callable on one request (µs)",
                statistics.median(sequential_latencies(lambda: batched_call([one_request]), 20000)),
                0,
            )
            record("Python: 64 threads to one worker thread (req/s)", python_threads_rps(64, args.seconds), 0)

    table = {row: {k: statistics.median(v) for k, v in values.items()} for row, values in rows.items()}
    print(f"\nembedtriton against Triton's C floor: medians of {args.rounds} interleaved rounds\n")
    print("| measure | Triton C floor | embedtriton | embedtriton / floor |")
    print("| --- | --- | --- | --- |")
    for row, m in table.items():
        if row.startswith("Python"):
            continue
        ratio = m["ours"] / m["floor"] if m["floor"] > 0 else float("nan")
        print(f"| {row} | {m['floor']:,.1f} | {m['ours']:,.1f} | {ratio:.2f}x |")
    callable_us = table["Python: the @batch callable on one request (µs)"]["ours"]
    stage_table = {
        label: {stage: {k: statistics.median(v) for k, v in m.items()} for stage, m in by_stage.items()}
        for label, by_stage in stages.items()
    }
    for label, by_stage in stage_table.items():
        print(f"\n| sequential, µs per call ({label}) | Triton C floor | embedtriton | extra |")
        print("| --- | --- | --- | --- |")
        for stage, m in by_stage.items():
            print(f"| {stage} | {m['floor']:.2f} | {m['ours']:.2f} | {m['ours'] - m['floor']:+.2f} |")
        extra = by_stage["p50 round trip"]["ours"] - by_stage["p50 round trip"]["floor"]
        many = table[f"infer_many, 64 in flight, {label} (req/s)"]
        print(
            f"\n{label}: extra at p50 {extra:.1f} µs = {extra / callable_us:.1f}x the callable's own "
            f"{callable_us:.2f} µs (the @batch function on one request; target ≤ 3x); "
            f"infer_many {many['ours'] / many['floor']:.2f}x the floor's 64 in flight (target ≥ 0.5x)"
        )
    py = table["Python: bare call / two-thread hand-off (µs)"]
    threads = table["Python: 64 threads to one worker thread (req/s)"]["ours"]
    print(f"\nPython itself: the bare call {py['ours']:.2f} µs; a two-thread hand-off {py['floor']:.1f} µs; "
          f"64 threads handing calls to one worker thread {threads:,.0f} req/s")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "floor.json").write_text(
        json.dumps(
            {"rounds": args.rounds, "medians": table, "all": rows, "stages": stage_table}, indent=1, ensure_ascii=False
        )
    )
    log(f"written: {RESULTS / 'floor.json'}")


if __name__ == "__main__":
    main()
