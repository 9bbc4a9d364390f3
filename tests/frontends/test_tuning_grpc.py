"""The tuner's ``via="grpc"``: each trial is measured by perf_analyzer over our own gRPC
endpoint (where tritonclient 2.51's wheel provides the binary: the oldest-versions session)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from embedtriton import ModelConfig, Server, Tensor, batch
from embedtriton.tuning import tune

seen: list[float] = []


@batch
def costly(x):
    seen.extend(float(v) for v in x[:, 0])
    time.sleep(0.002 + 0.00005 * len(x))
    return {"y": x * 2}


@pytest.fixture
def server():
    srv = Server()
    srv.bind("Costly", costly, [Tensor(name="x", dtype=np.float32, shape=(4,))],
             [Tensor(name="y", dtype=np.float32, shape=(4,))], ModelConfig(max_batch_size=1))  # fmt: skip
    with srv:
        yield srv


def test_perf_analyzer_measures_each_trial_over_grpc(server, perf_analyzer):
    report = tune(server, "Costly", concurrency=[16], via="grpc", time_budget_s=15, window_s=0.3, progress=False)
    assert report.via == "grpc" and len(report.trials) >= 3
    bound = report.trials[0]
    assert bound.candidate.max_batch_size == 1 and bound.measure.p99_ms > 2.0  # perf_analyzer's own latencies
    assert report.best.measure.throughput >= 3 * bound.measure.throughput, report.table()
    assert bound.measure.compute_us > 2000  # Triton's split, read around the perf_analyzer run
    assert server.endpoint("grpc") is not None  # (started for the tuner)


def test_samples_reach_the_model_through_perf_analyzer(server, perf_analyzer):
    samples = {"x": np.array([[7, 0, 0, 0], [11, 0, 0, 0]], dtype=np.float32)}
    seen.clear()
    tune(server, "Costly", concurrency=[2], via="grpc", samples=samples, time_budget_s=3, window_s=0.2,
         progress=False)  # fmt: skip
    assert seen and set(seen) == {7.0, 11.0}  # not perf_analyzer's random data
