"""The built-in tuner on a model whose cost is a fixed part per call plus a part per row (it
sleeps 2 ms + 0.05 ms per row, releasing the GIL): bound with max_batch_size=1, the tuner finds
a configuration with at least 4x the throughput at concurrency 32, respects a latency budget,
writes its report, and gives the model its bound configuration back. Time-bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from embedtriton import InvalidArgumentError, ModelConfig, Server, ServerConfig, Tensor, batch
from embedtriton.tuning import tune
from embedtriton.tuning.load import Load

X = [Tensor(name="x", dtype=np.float32, shape=(16,))]
Y = [Tensor(name="y", dtype=np.float32, shape=(16,))]


@batch
def costly(x):
    time.sleep(0.002 + 0.00005 * len(x))
    return {"y": x * 2}


@pytest.fixture(scope="module")
def server():
    srv = Server()
    srv.bind("Costly", costly, X, Y, ModelConfig(max_batch_size=1))
    with srv:
        yield srv


def test_the_tuner_finds_4x_at_concurrency_32_and_restores_the_model(server, tmp_path):
    started = time.monotonic()
    report = tune(server, "Costly", concurrency=[32], time_budget_s=25, window_s=0.4, progress=False)
    assert time.monotonic() - started < 40  # bounded by the time budget (plus the last trial)
    bound = [t for t in report.trials if t.candidate == report.trials[0].candidate]
    best = report.best
    assert best is not None and best.measure.throughput >= 4 * bound[0].measure.throughput, report.table()
    assert report.best_config.max_batch_size >= 8
    assert server.binding("Costly").config.max_batch_size == 1  # the bound config is back
    assert server.model("Costly").config()["max_batch_size"] == 1
    written = report.save(tmp_path)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["best"]["max_batch_size"] == best.candidate.max_batch_size
    assert len(saved["trials"]) == len(report.trials) and saved["pareto"]
    assert all(
        {"throughput", "p50_ms", "p95_ms", "p99_ms", "queue_us", "compute_us"} <= set(t) for t in saved["trials"]
    )
    namespace: dict = {}
    exec((tmp_path / "best_config.py").read_text(), namespace)  # the config to paste is valid Python
    assert namespace["config"].max_batch_size == best.candidate.max_batch_size
    pytest.importorskip("matplotlib")
    assert tmp_path / "report.png" in written and (tmp_path / "report.png").stat().st_size > 10_000


def test_a_latency_budget_is_respected(server):
    report = tune(server, "Costly", concurrency=[32], latency_budget_ms=6.0, time_budget_s=20, window_s=0.3,
                  progress=False)  # fmt: skip
    best = report.best
    if report.within_budget:
        assert best.measure.p99_ms <= 6.0
        assert all(t.measure.throughput <= best.measure.throughput for t in report.trials if t.measure.p99_ms <= 6.0)
        assert "within 6.0 ms" in report.summary()
    else:  # a slow machine: the lowest-latency trial, said so
        assert best.measure.p99_ms == min(t.measure.p99_ms for t in report.trials)
        assert "no trial met the budget" in report.summary()


def test_bad_requests_to_the_tuner(server):
    with pytest.raises(InvalidArgumentError, match="no model 'Nope'"):
        tune(server, "Nope")
    with pytest.raises(InvalidArgumentError, match="concurrency must list positive numbers"):
        tune(server, "Costly", concurrency=[0])
    with pytest.raises(InvalidArgumentError, match="does not fit its declared shape"):
        tune(server, "Costly", shapes={"x": [3]})
    with pytest.raises(InvalidArgumentError, match="the samples have no"):
        tune(server, "Costly", samples={"z": np.zeros((4, 16), np.float32)})


def test_load_from_declarations_and_samples():
    load = Load([Tensor(name="t", dtype=np.bytes_, shape=(-1,)), Tensor(name="v", dtype=np.int64, shape=(2, -1))],
                batched=True, shapes={"v": [2, 5]})  # fmt: skip
    first = load.request(0)
    assert first["t"].shape == (1, 1) and first["t"].dtype == object and first["v"].shape == (1, 2, 5)
    assert load.unique() == 64 and not load.repeats
    samples = Load(X, batched=True, samples={"x": np.arange(48, dtype=np.float32).reshape(3, 16)})
    assert samples.repeats and samples.unique() == 3
    np.testing.assert_array_equal(samples.request(4)["x"], np.arange(16, 32, dtype=np.float32).reshape(1, 16))


def test_response_cache_is_tried_where_samples_repeat(own_process):
    if not own_process:  # (Triton keeps one response cache per process: see the fixture)
        return
    srv = Server(ServerConfig(cache_config=["local,size=1048576"]))
    srv.bind("Costly", costly, X, Y, ModelConfig(max_batch_size=1))
    with srv:
        samples = {"x": np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)}
        report = tune(srv, "Costly", concurrency=[8], samples=samples, time_budget_s=30, window_s=0.3,
                      progress=False)  # fmt: skip
    cached = [t for t in report.trials if t.candidate.response_cache]
    assert cached, report.notes
    assert max(t.measure.throughput for t in cached) > 2 * report.trials[0].measure.throughput  # 4 distinct inputs


def test_the_tune_command(tmp_path):
    (tmp_path / "models.py").write_text(
        "import time\nimport numpy as np\nfrom embedtriton import ModelConfig, Tensor, batch\n"
        "@batch\ndef costly(x):\n    time.sleep(0.002 + 0.00005 * len(x))\n    return {'y': x * 2}\n"
        "def bind(server):\n"
        "    server.bind('Costly', costly, [Tensor(name='x', dtype=np.float32, shape=(-1,))],\n"
        "                [Tensor(name='y', dtype=np.float32, shape=(-1,))], ModelConfig(max_batch_size=1))\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "embedtriton", "tune", "models:bind", "--model", "Costly", "--concurrency", "16",
         "--time-budget-s", "10", "--window-s", "0.3", "--shape", "x=8", "--output", "out"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "infer/s" in done.stdout and "best: batch" in done.stdout and "x the config as bound" in done.stdout
    assert (tmp_path / "out" / "report.json").exists() and (tmp_path / "out" / "best_config.py").exists()
    assert "[" in done.stderr and "trial" in done.stderr  # the progress bar
    bad = subprocess.run([sys.executable, "-m", "embedtriton", "tune", "models:bind", "--model", "Nope"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "no model 'Nope'" in bad.stderr and "Traceback" not in bad.stderr
