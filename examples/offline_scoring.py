"""Offline scoring: many requests from one call with ``Model.infer_many``.

Scores 20,000 rows one request per row, three ways from one thread: ``infer`` in a loop,
64 threads each calling ``infer``, and ``infer_many`` (64 requests in flight, one wake-up
of the caller per 32 of them). A row that cannot be scored fails alone: with
``return_exceptions=True`` its error takes its place in the list.

    python examples/offline_scoring.py
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from embedtriton import DynamicBatcher, InvalidArgumentError, ModelConfig, Server, Tensor, batch

ROWS = 20_000


@batch
def score(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"score": (x * x).sum(axis=1, keepdims=True)}


def main() -> None:
    server = Server()
    server.bind(
        "Score",
        score,
        [Tensor(name="x", dtype=np.float32, shape=(4,))],
        [Tensor(name="score", dtype=np.float32, shape=(1,))],
        ModelConfig(max_batch_size=16, batcher=DynamicBatcher()),
    )
    rows = np.random.default_rng(0).random((ROWS, 4), dtype=np.float32)
    requests = [{"x": rows[i : i + 1]} for i in range(ROWS)]
    expected = (rows * rows).sum(axis=1)
    with server:
        model = server.model("Score")
        timings = {}

        started = time.perf_counter()
        one_by_one = [model.infer(r) for r in requests]
        timings["infer() in a loop"] = time.perf_counter() - started

        started = time.perf_counter()
        with ThreadPoolExecutor(64) as pool:
            threaded = list(pool.map(model.infer, requests))
        timings["infer() from 64 threads"] = time.perf_counter() - started

        started = time.perf_counter()
        many = model.infer_many(requests, max_in_flight=64)
        timings["infer_many(max_in_flight=64)"] = time.perf_counter() - started

        for name, results in (("loop", one_by_one), ("threads", threaded), ("infer_many", many)):
            got = np.array([r["score"][0, 0] for r in results])
            assert np.allclose(got, expected), name
        for name, seconds in timings.items():
            print(f"{name:30s} {ROWS / seconds:>9,.0f} rows/s")
        print("all scores correct")

        bad = requests[:3] + [{"x": np.ones((1, 4), np.float64)}] + requests[3:5]
        results = model.infer_many(bad, return_exceptions=True)
        failed = [i for i, r in enumerate(results) if isinstance(r, Exception)]
        print(f"{len(results)} results, failed: {failed} ({type(results[3]).__name__})")
        assert isinstance(results[3], InvalidArgumentError)


if __name__ == "__main__":
    main()
