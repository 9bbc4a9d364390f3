"""In-process data-path benchmarks: AddSub (1 row per request) against the bare function call.

Prints a table (target, median of repeated runs, ratio to the floor measured in the same
run), writes benchmarks/results/inprocess.json and a PNG of latency and throughput
against requests in flight (1, 8, 64, 256).

    nox -s bench                 # full run
    nox -s bench -- --quick      # fewer requests, for a smoke check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from embedtriton import DynamicBatcher, ModelConfig, Server, ServerConfig, Tensor, batch

RESULTS = Path(__file__).parent / "results"
F32 = np.float32


def add_sub_raw(a, b):
    return {"add": a + b, "sub": a - b}


add_sub = batch(add_sub_raw)
TENSORS = (
    [Tensor(name="a", dtype=F32, shape=(1,)), Tensor(name="b", dtype=F32, shape=(1,))],
    [Tensor(name="add", dtype=F32, shape=(1,)), Tensor(name="sub", dtype=F32, shape=(1,))],
)
ONE = {"a": np.ones((1, 1), F32), "b": np.ones((1, 1), F32)}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sequential_latencies(call, n: int) -> list[float]:
    for _ in range(min(1000, n)):
        call()
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t = clock()
        call()
        out.append((clock() - t) / 1000)
    return out


def floor_call_us(n: int) -> float:
    a, b = ONE["a"], ONE["b"]
    return statistics.median(sequential_latencies(lambda: add_sub_raw(a, b), n))


def threaded(model, in_flight: int, total: int) -> tuple[float, list[float]]:
    """Throughput (inferences/s) and latencies with `in_flight` threads each calling in a loop."""
    per_thread = max(1, total // in_flight)
    latencies: list[list[float]] = [[] for _ in range(in_flight)]
    barrier = threading.Barrier(in_flight + 1)

    def worker(k: int) -> None:
        mine = latencies[k]
        barrier.wait()
        for _ in range(per_thread):
            t = time.perf_counter_ns()
            model.infer(ONE)
            mine.append((time.perf_counter_ns() - t) / 1000)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(in_flight)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    return per_thread * in_flight / elapsed, [x for lat in latencies for x in lat]


def asyncio_throughput(model, in_flight: int, total: int) -> float:
    async def main() -> float:
        per_task = max(1, total // in_flight)

        async def worker() -> None:
            for _ in range(per_task):
                await model.infer_async(ONE)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return per_task * in_flight / (time.perf_counter() - started)

    return asyncio.run(main())


STARTUP_SCRIPT = """
import time
t = time.perf_counter()
import numpy as np
from embedtriton import ModelConfig, Server, Tensor, batch
server = Server()
server.bind("AddSub", batch(lambda a, b: {"add": a + b, "sub": a - b}),
            [Tensor(name="a", dtype=np.float32, shape=(1,)), Tensor(name="b", dtype=np.float32, shape=(1,))],
            [Tensor(name="add", dtype=np.float32, shape=(1,)), Tensor(name="sub", dtype=np.float32, shape=(1,))],
            ModelConfig(max_batch_size=8))
server.start()
assert server.model("AddSub").ready
print(time.perf_counter() - t)
server.stop()
"""


def startup_in_fresh_process() -> float:
    import subprocess

    done = subprocess.run([sys.executable, "-c", STARTUP_SCRIPT], capture_output=True, text=True, check=True, cwd="/")
    return float(done.stdout.strip().splitlines()[-1])


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    seq_n = 2000 if args.quick else 20000
    tput_n = 10000 if args.quick else 60000
    soak_n = 50000 if args.quick else 1_000_000

    rows: dict[str, dict] = {}

    def record(name: str, target: str, values: list[float], unit: str, floor: float | None = None, better="lower"):
        med = statistics.median(values)
        rows[name] = {"target": target, "median": med, "runs": values, "unit": unit, "floor": floor, "better": better}
        ratio = f" ({med / floor:.1f}x floor)" if floor else ""
        log(f"  {name}: {med:,.1f} {unit}{ratio}")

    log(
        f"embedtriton in-process benchmark, {repeats} repeats, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    floor = statistics.median([floor_call_us(seq_n) for _ in range(repeats)])
    rows["floor: bare add_sub call"] = {"target": "", "median": floor, "runs": [], "unit": "us", "floor": None}
    log(f"  floor (bare call): {floor:.2f} us")

    # start-up in a fresh process: import, load libtritonserver, start, one model ready
    first_starts = [startup_in_fresh_process() for _ in range(repeats)]
    record("start-up, fresh process (import..ready)", "<= 0.3 s", first_starts, "s")
    # start-up and stop
    starts, stops = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        server = Server()
        server.bind("AddSub", add_sub, *TENSORS, config=ModelConfig(max_batch_size=8))
        server.start()
        assert server.model("AddSub").ready
        starts.append(time.perf_counter() - t)
        t = time.perf_counter()
        server.stop()
        stops.append(time.perf_counter() - t)
    record("start-up, again in the same process", "<= 0.3 s", starts, "s")
    record("stop() idle server", "<= 0.1 s", stops, "s")

    server = Server(ServerConfig(cache_config=["local,size=1048576"]))
    server.bind("AddSub", add_sub, *TENSORS, config=ModelConfig(max_batch_size=8))
    server.bind(
        "AddSubBatched",
        add_sub,
        *TENSORS,
        config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=0)),
    )
    server.bind("AddSubCached", add_sub, *TENSORS, config=ModelConfig(max_batch_size=8, response_cache=True))
    mib = 1 << 18  # floats per MiB
    server.bind(
        "Identity",
        lambda requests: [{"y": r["x"]} for r in requests],
        [Tensor(name="x", dtype=F32, shape=(mib,))],
        [Tensor(name="y", dtype=F32, shape=(mib,))],
        config=ModelConfig(batching=False),
    )
    with server:
        model = server.model("AddSub")
        p50, p99 = [], []
        for _ in range(repeats):
            lat = sequential_latencies(lambda: model.infer(ONE), seq_n)
            p50.append(percentile(lat, 0.5))
            p99.append(percentile(lat, 0.99))
        record("sequential infer p50", "<= 20 us", p50, "us", floor)
        record("sequential infer p99", "<= 60 us", p99, "us", floor)

        cached = server.model("AddSubCached")
        record(
            "response-cache hit p50",
            "<= 10 us",
            [percentile(sequential_latencies(lambda: cached.infer(ONE), seq_n), 0.5) for _ in range(repeats)],
            "us",
            floor,
        )

        batched = server.model("AddSubBatched")
        curve = {}
        for in_flight in (1, 8, 64, 256):
            runs = [threaded(batched, in_flight, tput_n) for _ in range(repeats)]
            curve[in_flight] = {
                "throughput": statistics.median(r[0] for r in runs),
                "p50_us": statistics.median(percentile(r[1], 0.5) for r in runs),
                "p99_us": statistics.median(percentile(r[1], 0.99) for r in runs),
            }
            log(f"  {in_flight} in flight (threads): {curve[in_flight]['throughput']:,.0f} inf/s")
        record(
            "throughput, 64 in flight (threads)",
            ">= 60,000 inf/s",
            [threaded(batched, 64, tput_n)[0] for _ in range(repeats)],
            "inf/s",
            better="higher",
        )
        record(
            "throughput, 64 in flight (asyncio)",
            ">= 60,000 inf/s",
            [asyncio_throughput(batched, 64, tput_n) for _ in range(repeats)],
            "inf/s",
            better="higher",
        )

        identity = server.model("Identity")
        x = np.random.default_rng(0).random(mib, dtype=F32)
        buf_in, buf_out = np.empty_like(x), np.empty_like(x)
        n = 50 if args.quick else 300

        def copy_floor() -> None:
            np.copyto(buf_in, x)
            np.copyto(buf_out, buf_in)

        def rate(call) -> float:
            for _ in range(5):
                call()
            t = time.perf_counter()
            for _ in range(n):
                call()
            return n * x.nbytes / 2**20 / (time.perf_counter() - t)

        memcpy = statistics.median(rate(copy_floor) for _ in range(repeats))
        ours = [rate(lambda: identity.infer({"x": x})) for _ in range(repeats)]
        rows["1 MiB floor: memcpy in + out"] = {
            "target": "",
            "median": memcpy,
            "runs": [],
            "unit": "MB/s",
            "floor": None,
        }
        record("1 MiB FP32 identity", ">= 50% of memcpy floor", ours, "MB/s", memcpy, better="higher")

        # memory: RSS after the first 10,000 requests vs after soak_n (64 threads in flight)
        threaded(batched, 64, 10000)
        before = rss_mb()
        log(f"  soak: {soak_n:,} requests ...")
        done = 10000
        while done < soak_n:
            step = min(100000, soak_n - done)
            threaded(batched, 64, step)
            done += step
            log(f"    {done:,} requests, RSS {rss_mb():.1f} MB")
        after = rss_mb()
        rows["RSS growth after soak"] = {
            "target": "<= +20 MB",
            "median": after - before,
            "runs": [before, after],
            "unit": f"MB ({soak_n:,} requests)",
            "floor": None,
        }

    print_table(rows)
    RESULTS.mkdir(exist_ok=True)
    result = {"rows": rows, "curve": curve, "machine": {"cores": os.cpu_count(), "python": platform.python_version()}}
    (RESULTS / "inprocess.json").write_text(json.dumps(result, indent=2))
    plot(curve, RESULTS / "inprocess.png")
    log(f"wrote {RESULTS / 'inprocess.json'} and {RESULTS / 'inprocess.png'}")
    log(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


def print_table(rows: dict[str, dict]) -> None:
    print(f"| {'measure':<38} | {'target':<24} | {'median':>14} | {'unit':<8} | {'vs floor':>9} |")
    print(f"|{'-' * 40}|{'-' * 26}|{'-' * 16}|{'-' * 10}|{'-' * 11}|")
    for name, row in rows.items():
        ratio = f"{row['median'] / row['floor']:.2f}x" if row.get("floor") else ""
        value = f"{row['median']:,.3f}" if abs(row["median"]) < 10 else f"{row['median']:,.1f}"
        print(f"| {name:<38} | {row['target']:<24} | {value:>14} | {row['unit']:<8} | {ratio:>9} |")


def plot(curve: dict[int, dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot")
        return
    xs = sorted(curve)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(xs, [curve[x]["p50_us"] for x in xs], "o-", label="p50")
    left.plot(xs, [curve[x]["p99_us"] for x in xs], "s--", label="p99")
    left.set(xscale="log", yscale="log", xlabel="requests in flight", ylabel="latency (us)", title="latency")
    left.legend()
    right.plot(xs, [curve[x]["throughput"] for x in xs], "o-")
    right.set(xscale="log", xlabel="requests in flight", ylabel="inferences/s", title="throughput (threads)")
    right.set_ylim(bottom=0)
    fig.suptitle("embedtriton in-process AddSub (1 row per request)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
