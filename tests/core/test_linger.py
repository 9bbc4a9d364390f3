"""After an execute that leaves nothing in flight, the model thread lingers (spins, without the
GIL) for up to EMBEDTRITON_LINGER_US until the next request is handed to Triton, instead of
going to sleep in Triton's queue: a synchronous caller's next request then finds it awake
(native/_native/threads.c, linger()). These tests pin when it lingers and when it must not;
what it buys is measured by benchmarks/bench_floor.py (docs/performance.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from embedtriton import ModelConfig, Server, Tensor, batch
from embedtriton._native import linger_stats

F32 = np.float32


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@pytest.fixture(scope="module")
def srv():
    s = Server()
    tensors = (
        [Tensor(name="a", dtype=F32, shape=(-1,)), Tensor(name="b", dtype=F32, shape=(-1,))],
        [Tensor(name="add", dtype=F32, shape=(-1,)), Tensor(name="sub", dtype=F32, shape=(-1,))],
    )
    started, release = threading.Event(), threading.Event()

    @batch
    def blocker(a, b):
        started.set()
        release.wait(30)
        return {"add": a + b, "sub": a - b}

    s.bind("Batched", add_sub, *tensors, ModelConfig(max_batch_size=8))
    s.bind("Plain", add_sub, *tensors, ModelConfig(batching=False))
    s.bind("Blocker", blocker, *tensors, ModelConfig(max_batch_size=8))
    s.blocker_events = (started, release)
    with s:
        yield s


def sequential(model, n: int, pause_s: float = 0.0) -> tuple[int, int]:
    """n calls one after another; the (lingers, caught) they made."""
    inputs = {"a": np.ones((1, 4), F32), "b": np.ones((1, 4), F32)}
    if model.name == "Plain":
        inputs = {k: v[0] for k, v in inputs.items()}
    for _ in range(20):  # a fresh start: any backoff from earlier calls is over
        model.infer(inputs)
    before = linger_stats()
    for _ in range(n):
        out = model.infer(inputs)
        assert np.array_equal(out["add"], inputs["a"] * 2)
        if pause_s:
            time.sleep(pause_s)
    after = linger_stats()
    return after[0] - before[0], after[1] - before[1]


@pytest.mark.parametrize("name", ["Batched", "Plain"])
def test_sequential_calls_find_the_model_thread_lingering(srv, name):
    lingers, caught = sequential(srv.model(name), 400)
    # Each call's execute lingers and meets the next call; on a loaded machine a pause longer
    # than the linger sometimes comes between two calls (and the next few executes skip it).
    assert lingers >= 100, (lingers, caught)
    assert caught >= lingers * 0.5, (lingers, caught)


def test_no_linger_while_another_call_is_in_flight(srv):
    """A call waiting in another model keeps in_flight above zero: the model threads go straight
    back to Triton, where that work may need them."""
    slow = srv.model("Blocker")
    inputs = {"a": np.ones((1, 4), F32), "b": np.ones((1, 4), F32)}
    done: list = []
    waiter = threading.Thread(target=lambda: done.append(slow.infer(inputs)))
    waiter.start()
    try:
        assert srv.blocker_events[0].wait(30)  # it is executing
        lingers, caught = sequential(srv.model("Batched"), 200)
    finally:
        srv.blocker_events[1].set()
        waiter.join(30)
    assert done and done[0]["add"].tolist() == [[2.0] * 4]
    assert (lingers, caught) == (0, 0)


def test_lingers_that_meet_nothing_back_off(srv):
    """Calls 2 ms apart: each linger times out, and the next executes skip it (1, 3, 7, then
    15 of them), so a server with occasional requests spins after few of them."""
    lingers, caught = sequential(srv.model("Plain"), 100, pause_s=0.002)
    assert caught <= 5, (lingers, caught)
    assert lingers <= 15, (lingers, caught)


def test_linger_off_with_the_environment_variable(tmp_path):
    script = """
import numpy as np
from embedtriton import ModelConfig, Server, Tensor, batch
from embedtriton._native import linger_stats

@batch
def double(x):
    return {"y": x * 2}

s = Server()
s.bind("D", double, [Tensor(name="x", dtype=np.float32, shape=(-1,))],
       [Tensor(name="y", dtype=np.float32, shape=(-1,))], ModelConfig(batching=False))
with s:
    for _ in range(200):
        assert s.model("D").infer({"x": np.ones(3, np.float32)})["y"].tolist() == [2.0] * 3
print("stats", linger_stats())
"""
    env = {**os.environ, "EMBEDTRITON_LINGER_US": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stats (0, 0)" in done.stdout
