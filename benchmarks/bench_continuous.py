"""Continuous batching (iterative sequences) against static batching, side by side.

A toy token generator: every request asks for a number of tokens (mixed lengths). One
model step makes one token for every request in the batch and costs STEP_MS whatever the
batch size (like one batched forward pass). Both models batch up to 8 requests on one
instance:

- static: a decoupled model on the dynamic batcher; a batch runs until its longest
  request is done (finished requests leave their slots empty), and newcomers wait for
  the whole batch to drain;
- continuous: an iterative-sequence model in the batch-step form; each scheduling
  iteration advances every in-flight request by one token, a finished request frees its
  slot at once, and new requests join at the next iteration.

Prints tokens/s and time to first token (TTFT) for each, medians of repeated runs.

    python benchmarks/bench_continuous.py       (also part of `nox -s bench`)
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from embedtriton import DynamicBatcher, Final, ModelConfig, SequenceBatcher, Server, Tensor

STEP_MS = 1.0
INPUTS = [Tensor(name="n", dtype=np.int32, shape=(1,))]
OUTPUTS = [Tensor(name="token", dtype=np.int32, shape=(1,))]
RESULTS = Path(__file__).parent / "results"


def static_model(requests):
    """Decoupled model: the whole batch steps together until its longest request is done."""
    wanted = [int(r["n"][0, 0]) for r in requests]
    for step in range(max(wanted)):
        time.sleep(STEP_MS / 1000)  # one forward pass for the batch
        yield [{"token": np.array([[step]], np.int32)} if step < n else None for n in wanted]


def continuous_model(requests):
    """Iterative model, batch-step form: one call per iteration with every in-flight request."""
    time.sleep(STEP_MS / 1000)  # one forward pass for the batch
    out = []
    for r in requests:
        made = r.state.get("made", 0)
        r.state["made"] = made + 1
        token = {"token": np.array([[made]], np.int32)}
        out.append(Final(token) if made + 1 >= int(r["n"][0, 0]) else token)
    return out


def run(model, lengths: list[int], concurrency: int) -> dict[str, float]:
    """Callers keep `concurrency` requests in flight; returns tokens/s and TTFT."""
    queue = list(enumerate(lengths))
    lock = threading.Lock()
    ttft: list[float] = []
    tokens = [0]

    def caller() -> None:
        while True:
            with lock:
                if not queue:
                    return
                _, n = queue.pop(0)
            started = time.perf_counter()
            first = None
            count = 0
            for _part in model.stream({"n": np.array([[n]], np.int32)}):
                if first is None:
                    first = time.perf_counter() - started
                count += 1
            assert count == n
            with lock:
                ttft.append(first)
                tokens[0] += count

    threads = [threading.Thread(target=caller) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    return {
        "tokens_per_s": tokens[0] / elapsed,
        "ttft_p50_ms": 1000 * statistics.median(ttft),
        "ttft_p90_ms": 1000 * float(np.percentile(ttft, 90)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    lengths = [int(n) for n in np.random.default_rng(0).integers(1, 33, args.requests)]

    server = Server()
    server.bind(
        "Static",
        static_model,
        INPUTS,
        OUTPUTS,
        ModelConfig(decoupled=True, max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=1000)),
    )
    server.bind(
        "Continuous",
        continuous_model,
        INPUTS,
        OUTPUTS,
        ModelConfig(decoupled=True, max_batch_size=8, sequence_batcher=SequenceBatcher(iterative=True)),
    )
    rows = {}
    with server:
        for name in ("Static", "Continuous"):
            runs = [run(server.model(name), lengths, args.concurrency) for _ in range(args.repeats)]
            rows[name] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(
        f"{args.requests} requests of 1-32 tokens, {args.concurrency} in flight, batches of up to 8, "
        f"{STEP_MS} ms per model step (any batch size); medians of {args.repeats} runs"
    )
    print(f"| {'batching':<11} | {'tokens/s':>9} | {'TTFT p50 ms':>11} | {'TTFT p90 ms':>11} |")
    print(f"|{'-' * 13}|{'-' * 11}|{'-' * 13}|{'-' * 13}|")
    for name, row in rows.items():
        print(
            f"| {name.lower():<11} | {row['tokens_per_s']:>9,.0f} | {row['ttft_p50_ms']:>11.1f} | "
            f"{row['ttft_p90_ms']:>11.1f} |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "continuous.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
