"""Queue policies and priorities against the same model without them, measured in the same
run, in interleaved rounds (medians):

- no policy (the floor): ``DynamicBatcher()``;
- a queue timeout: ``QueuePolicy(default_timeout_microseconds=100_000)`` (REJECT);
- a bounded queue: ``QueuePolicy(max_queue_size=64)``;
- priorities: ``priority_levels=2``;
- all of them: two levels, each with a timeout (DELAY on level 2), per-request overrides
  and a bounded queue.

Each is a trivial batched model (``max_batch_size=8``, x + 1), called the same way (requests
alternating priority 1 and 2, which Triton treats as its one level where a model has no levels).
A round is ``--seconds`` of closed-loop clients (1 client, then 8 clients, each calling
``infer`` in a loop); its gap is
the longest time without a completed request (from the round's start to its last
completion). Triton 2.51's dynamic batcher leaves 0.5 s idle gaps with any queue policy or
priority (see the README), so the table counts the rounds with a gap over 100 ms, and gives
the median throughput and its ratio to the floor's.

    python benchmarks/bench_queue_policies.py [--rounds 50] [--seconds 0.2] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from embedtriton import DynamicBatcher, ModelConfig, QueuePolicy, Server, Tensor, TimeoutAction, batch
from embedtriton.errors import TritonError

F32 = np.float32
X = {"x": np.ones((1, 1), F32)}
GAP_S = 0.1  # a round with a longer gap between completions stalled

BATCHERS: dict[str, DynamicBatcher] = {
    "no policy (floor)": DynamicBatcher(),
    "timeout 100 ms": DynamicBatcher(default_queue_policy=QueuePolicy(default_timeout_microseconds=100_000)),
    "max_queue_size 64": DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=64)),
    "2 priority levels": DynamicBatcher(priority_levels=2, default_priority_level=2),
    "all of them": DynamicBatcher(
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=QueuePolicy(
            timeout_action=TimeoutAction.DELAY,
            default_timeout_microseconds=100_000,
            allow_timeout_override=True,
            max_queue_size=64,
        ),
        priority_queue_policy={
            1: QueuePolicy(default_timeout_microseconds=100_000, allow_timeout_override=True, max_queue_size=64)
        },
    ),
}
FLOOR = "no policy (floor)"


def round_of(call: Callable[[int], Any], clients: int, seconds: float) -> tuple[float, float, int]:
    """``clients`` threads call in a loop for ``seconds``: (longest gap s, requests/s, errors)."""
    done: list[float] = []
    errors = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    stop = [0.0]

    def client(k: int) -> None:
        barrier.wait()
        i = k
        while time.perf_counter() < stop[0]:
            try:
                call(i)
            except TritonError:
                with lock:
                    errors[0] += 1
            now = time.perf_counter()
            with lock:
                done.append(now)
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    stop[0] = started + seconds
    barrier.wait()
    for thread in threads:
        thread.join()
    ended = time.perf_counter()
    stamps = [started, *sorted(done)]
    gap = max(b - a for a, b in zip(stamps, stamps[1:], strict=False)) if done else ended - started
    return gap, len(done) / (ended - started), errors[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50, help="rounds per policy and client count")
    parser.add_argument("--seconds", type=float, default=0.2, help="length of a round")
    parser.add_argument("--quick", action="store_true", help="10 rounds")
    parser.add_argument("--only", action="append", help="measure only these policies (and the floor)")
    args = parser.parse_args()
    rounds = 10 if args.quick else args.rounds
    batchers = {k: v for k, v in BATCHERS.items() if k == FLOOR or not args.only or k in args.only}

    server = Server()
    names = {}
    for i, (label, batcher) in enumerate(batchers.items()):
        names[label] = f"M{i}"
        server.bind(
            names[label],
            batch(lambda x: {"y": x + 1}),
            [Tensor(name="x", dtype=F32, shape=(1,))],
            [Tensor(name="y", dtype=F32, shape=(1,))],
            ModelConfig(max_batch_size=8, batcher=batcher),
        )
    shapes = (1, 8)
    gaps: dict[tuple[str, int], list[float]] = {(k, c): [] for k in batchers for c in shapes}
    rates: dict[tuple[str, int], list[float]] = {(k, c): [] for k in batchers for c in shapes}
    errors: dict[tuple[str, int], int] = {(k, c): 0 for k in batchers for c in shapes}
    print(
        f"queue policies: {rounds} interleaved rounds of {args.seconds} s per policy and client count, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}",
        file=sys.stderr,
    )
    with server:
        calls: dict[str, Callable[[int], Any]] = {}
        for label, name in names.items():  # the same calls to every model (priority is 0 where there are no levels)
            model = server.model(name)
            calls[label] = lambda i, m=model: m.infer(X, priority=1 + i % 2)
            calls[label](0)  # warm
        order = list(batchers)
        for r in range(rounds):
            for clients in shapes:
                for label in order[r % len(order) :] + order[: r % len(order)]:  # rotated each round
                    gap, rate, failed = round_of(calls[label], clients, args.seconds)
                    gaps[label, clients].append(gap)
                    rates[label, clients].append(rate)
                    errors[label, clients] += failed
            stalled = sum(g > GAP_S for k, v in gaps.items() if k[0] != FLOOR for g in v)
            print(f"  round {r + 1}/{rounds} done ({stalled} stalled so far)", file=sys.stderr, flush=True)
    print(
        "| policy | clients | rounds with a gap > 100 ms | longest gap | throughput (median) | x floor | errors |\n"
        "| --- | --- | --- | --- | --- | --- | --- |"
    )
    for clients in shapes:
        floor = statistics.median(rates[FLOOR, clients])
        for label in batchers:
            key = (label, clients)
            stalled = sum(g > GAP_S for g in gaps[key])
            rate = statistics.median(rates[key])
            print(
                f"| {label} | {clients} | {stalled} of {rounds} | {max(gaps[key]) * 1000:,.1f} ms "
                f"| {rate:,.0f} req/s | {rate / floor:.3f}x | {errors[key]} |"
            )


if __name__ == "__main__":
    main()
