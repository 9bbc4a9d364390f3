"""Model-to-model calls (BLS): a callable calls other models with ``server.model(...).infer``
while it runs, and the inner requests batch with other traffic."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from embedtriton import (
    DynamicBatcher,
    InternalError,
    ModelConfig,
    QueuePolicy,
    Server,
    ServerConfig,
    Tensor,
    UnavailableError,
    batch,
)

F32 = np.float32


def t(name: str) -> Tensor:
    return Tensor(name=name, dtype=F32, shape=(1,))


def one(value: float = 1.0) -> np.ndarray:
    return np.full((1, 1), value, F32)


@pytest.fixture(scope="module")
def server():
    server = Server()

    @batch
    def inner(x):
        time.sleep(0.0005)
        if (x < 0).any():
            raise ValueError("negative input")
        return {"y": x * 2}

    @batch
    def outer(x):  # one instance, calling Inner for every batch it runs
        return {"y": server.model("Inner").infer({"x": x})["y"] + 1}

    server.bind("Inner", inner, [t("x")], [t("y")], ModelConfig(max_batch_size=64))
    server.bind("Outer", outer, [t("x")], [t("y")], ModelConfig(max_batch_size=64))
    with server:
        yield server


def test_inner_requests_batch_with_other_traffic_under_64_callers(server):
    before = server.model("Inner").statistics()
    with ThreadPoolExecutor(64) as pool:
        got = list(pool.map(lambda i: server.model("Outer").infer({"x": one(i)})["y"][0, 0], range(640)))
    assert got == [2 * i + 1 for i in range(640)]
    after = server.model("Inner").statistics()
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 640 and executions < requests  # the inner model batched the outer calls


def test_an_inner_error_reaches_the_caller_naming_both_models(server):
    with pytest.raises(
        InternalError, match=r"model 'Outer' raised InternalError: model 'Inner' raised ValueError: negative input"
    ):
        server.model("Outer").infer({"x": one(-1)})
    assert server.model("Outer").infer({"x": one(2)})["y"][0, 0] == 5


def test_a_full_inner_queue_fails_the_outer_request_instead_of_hanging():
    server = Server()
    gate = threading.Event()

    @batch
    def slow(x):
        gate.wait(5)
        return {"y": x}

    @batch
    def outer(x):
        return {"y": server.model("Slow").infer({"x": x})["y"]}

    full = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=1)))
    server.bind("Slow", slow, [t("x")], [t("y")], full)
    server.bind("Caller", outer, [t("x")], [t("y")], ModelConfig(max_batch_size=1))
    with server, ThreadPoolExecutor(8) as pool:
        busy = [pool.submit(server.model("Slow").infer, {"x": one()}) for _ in range(2)]  # running + queued
        time.sleep(0.2)
        with pytest.raises(
            InternalError, match=r"model 'Caller' raised UnavailableError: .*[Ee]xceeds maximum queue size"
        ):
            server.model("Caller").infer({"x": one()})
        gate.set()
        assert all(f.result(timeout=10)["y"][0, 0] == 1 for f in busy)


def test_stop_drains_requests_whose_callable_is_calling_another_model():
    """stop() refuses new requests but lets a request in flight make its model-to-model
    calls (they are part of it), until the deadline."""
    server = Server(ServerConfig(exit_timeout_secs=10))
    started = threading.Event()

    @batch
    def inner(x):
        return {"y": x * 2}

    @batch
    def outer(x):
        started.set()
        time.sleep(0.3)  # stop() begins meanwhile
        return {"y": server.model("Inner").infer({"x": x})["y"]}

    server.bind("Inner", inner, [t("x")], [t("y")], ModelConfig(max_batch_size=8))
    server.bind("Outer", outer, [t("x")], [t("y")], ModelConfig(max_batch_size=8))
    server.start()
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(server.model("Outer").infer, {"x": one(3)})
        assert started.wait(5)
        stopping = threading.Thread(target=server.stop)
        stopping.start()
        time.sleep(0.05)
        with pytest.raises(UnavailableError, match="the server is stopping"):
            server.model("Inner").infer({"x": one()})  # a new request from outside is refused
        assert call.result(timeout=10)["y"][0, 0] == 6  # the request in flight finished, inner call and all
        stopping.join(10)
    assert not stopping.is_alive()
