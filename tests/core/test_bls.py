"""Model-to-model calls (BLS): a callable calls other models with ``server.model(...).infer``
while it runs, and the inner requests batch with other traffic."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers import wait_for

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

    running = threading.Event()

    @batch
    def slow(x):
        running.set()
        gate.wait(5)
        return {"y": x}

    @batch
    def outer(x):
        return {"y": server.model("Slow").infer({"x": x})["y"]}

    full = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=1)))
    server.bind("Slow", slow, [t("x")], [t("y")], full)
    server.bind("Caller", outer, [t("x")], [t("y")], ModelConfig(max_batch_size=1))
    with server, ThreadPoolExecutor(8) as pool:
        busy = [pool.submit(server.model("Slow").infer, {"x": one()})]
        assert running.wait(10)  # one runs...
        busy.append(pool.submit(server.model("Slow").infer, {"x": one()}))
        queued = 'nv_inference_pending_request_count{model="Slow",version="1"} 1'  # ...and one waits in the queue
        assert wait_for(lambda: queued in server.metrics()), "the second request never reached Slow's queue"
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
        assert wait_for(lambda: server.stopping), "stop() did not begin"
        with pytest.raises(UnavailableError, match="the server is stopping"):
            server.model("Inner").infer({"x": one()})  # a new request from outside is refused
        assert call.result(timeout=10)["y"][0, 0] == 6  # the request in flight finished, inner call and all
        stopping.join(10)
    assert not stopping.is_alive()


# -- async def callables ------------------------------------------------------------


@pytest.fixture(scope="module")
def async_server():
    server = Server()

    @batch
    def inner(x):
        return {"y": x * 2}

    @batch
    async def outer(x):  # one instance; its batches overlap while they await
        return {"y": (await server.model("Inner").infer_async({"x": x}))["y"] + 1}

    async def factorial(requests):  # calls itself: depth n on one instance
        out = []
        for r in requests:
            n = float(r["n"][0, 0])
            if n > 20:
                raise ValueError("n is limited to 20")
            below = (
                np.ones((1, 1), F32)
                if n <= 1
                else (await server.model("Factorial").infer_async({"n": one(n - 1)}))["f"]
            )
            out.append({"f": below * max(n, 1)})
        return out

    async def blocking(requests):
        return [server.model("Inner").infer({"x": r["x"]}) for r in requests]

    server.bind("Inner", inner, [t("x")], [t("y")], ModelConfig(max_batch_size=64))
    server.bind("AsyncOuter", outer, [t("x")], [t("y")], ModelConfig(max_batch_size=64))
    server.bind("Factorial", factorial, [t("n")], [t("f")], ModelConfig(max_batch_size=8))
    server.bind("Blocking", blocking, [t("x")], [t("y")], ModelConfig(max_batch_size=8))
    with server:
        yield server


def test_async_callables_await_other_models_under_64_callers(async_server):
    before = async_server.model("Inner").statistics()
    with ThreadPoolExecutor(64) as pool:
        got = list(pool.map(lambda i: async_server.model("AsyncOuter").infer({"x": one(i)})["y"][0, 0], range(640)))
    assert got == [2 * i + 1 for i in range(640)]
    after = async_server.model("Inner").statistics()
    assert after["inference_count"] - before["inference_count"] == 640
    assert after["execution_count"] - before["execution_count"] < 640  # batched with the other callers


def test_a_callable_calling_itself_recursively_on_one_instance(async_server):
    model = async_server.model("Factorial")
    assert model.infer({"n": one(6)})["f"][0, 0] == 720  # 6 nested requests on one instance, no deadlock
    with pytest.raises(InternalError, match=r"model 'Factorial' raised ValueError: n is limited to 20"):
        model.infer({"n": one(21)})


def test_a_blocking_call_inside_an_async_callable_says_what_to_use(async_server):
    with pytest.raises(
        InternalError, match=r"model 'Blocking' raised InvalidArgumentError: a blocking call from an async def callable"
    ):
        async_server.model("Blocking").infer({"x": one()})
    assert async_server.model("AsyncOuter").infer({"x": one(1)})["y"][0, 0] == 3  # the loop still runs


def test_async_callables_are_plain_models():
    async def f(requests):
        return requests

    from embedtriton import InvalidArgumentError, SequenceBatcher

    for config in (ModelConfig(decoupled=True), ModelConfig(max_batch_size=1, sequence_batcher=SequenceBatcher())):
        with pytest.raises(InvalidArgumentError, match="an async def callable answers each request once"):
            Server().bind("A", f, [t("x")], [t("y")], config)


def test_stop_drains_an_async_callable_mid_call():
    server = Server(ServerConfig(exit_timeout_secs=10))
    started = threading.Event()

    @batch
    def inner(x):
        return {"y": x * 2}

    @batch
    async def outer(x):
        import asyncio

        started.set()
        await asyncio.sleep(0.3)  # stop() begins meanwhile
        return {"y": (await server.model("Inner").infer_async({"x": x}))["y"]}

    server.bind("Inner", inner, [t("x")], [t("y")], ModelConfig(max_batch_size=8))
    server.bind("Outer", outer, [t("x")], [t("y")], ModelConfig(max_batch_size=8))
    server.start()
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(server.model("Outer").infer, {"x": one(3)})
        assert started.wait(5)
        stopping = threading.Thread(target=server.stop)
        stopping.start()
        assert call.result(timeout=10)["y"][0, 0] == 6
        stopping.join(10)
    assert not stopping.is_alive()


def test_the_calling_requests_timeout_bounds_its_model_to_model_calls():
    server = Server()
    gate = threading.Event()
    running = threading.Event()

    @batch
    def slow(x):
        running.set()
        gate.wait(5)
        return {"y": x}

    @batch
    def outer(x):
        return {"y": server.model("Slow").infer({"x": x})["y"]}

    @batch
    def late(x):
        time.sleep(0.1)  # longer than its request's timeout
        return {"y": server.model("Slow").infer({"x": x})["y"]}

    policy = QueuePolicy(default_timeout_microseconds=10_000_000, allow_timeout_override=True)
    queued = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=policy))
    server.bind("Slow", slow, [t("x")], [t("y")], queued)
    server.bind("Outer", outer, [t("x")], [t("y")], ModelConfig(max_batch_size=1))
    server.bind("Late", late, [t("x")], [t("y")], ModelConfig(max_batch_size=1))
    with server, ThreadPoolExecutor(2) as pool:
        blocker = pool.submit(server.model("Slow").infer, {"x": one()})  # holds Slow's one instance
        assert running.wait(10), "Slow never ran the blocker"
        started = time.monotonic()
        with pytest.raises(InternalError, match=r"model 'Outer' raised UnavailableError: .*[Tt]imeout"):
            server.model("Outer").infer({"x": one()}, timeout_us=300_000)  # its inner call queues behind
        assert time.monotonic() - started < 2  # bounded by the outer timeout, not Slow's 10 s default
        with pytest.raises(InternalError, match="the calling request's timeout expired before it called model 'Slow'"):
            server.model("Late").infer({"x": one()}, timeout_us=50_000)
        gate.set()
        assert blocker.result(timeout=10)["y"][0, 0] == 1
        assert server.model("Outer").infer({"x": one(4)}, timeout_us=5_000_000)["y"][0, 0] == 4


def test_a_sync_callable_calling_its_own_model_is_refused_not_deadlocked():
    server = Server()

    @batch
    def recurse(x):
        if (x > 0).any():
            return {"y": server.model("Recurse").infer({"x": x - 1})["y"] + 1}
        return {"y": x}

    server.bind("Recurse", recurse, [t("x")], [t("y")], ModelConfig(max_batch_size=4))
    with server:
        with pytest.raises(InternalError, match="a sync callable cannot call its own model: .* async def"):
            server.model("Recurse").infer({"x": one(3)})
        assert server.model("Recurse").infer({"x": one(0)})["y"][0, 0] == 0  # still serving


def test_callables_stream_from_decoupled_models():
    """stream() from a sync callable, stream_async() from an async one."""
    server = Server()

    def count(requests):  # decoupled: n responses
        for i in range(int(requests[0]["x"][0, 0])):
            yield [{"y": one(i)}]

    @batch
    def collect(x):
        return {"y": one(sum(float(part["y"][0, 0]) for part in server.model("Count").stream({"x": x})))}

    @batch
    async def collect_async(x):
        total = 0.0
        async for part in server.model("Count").stream_async({"x": x}):
            total += float(part["y"][0, 0])
        return {"y": one(total)}

    server.bind("Count", count, [t("x")], [t("y")], ModelConfig(max_batch_size=1, decoupled=True))
    server.bind("Collect", collect, [t("x")], [t("y")], ModelConfig(max_batch_size=1))
    server.bind("CollectAsync", collect_async, [t("x")], [t("y")], ModelConfig(max_batch_size=1))
    with server:
        assert server.model("Collect").infer({"x": one(4)})["y"][0, 0] == 6  # 0+1+2+3
        assert server.model("CollectAsync").infer({"x": one(5)})["y"][0, 0] == 10
