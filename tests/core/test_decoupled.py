"""Decoupled (streaming) models: 0..N responses per request, errors mid-stream, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import (
    DynamicBatcher,
    InternalError,
    InvalidArgumentError,
    ModelConfig,
    Server,
    ServerConfig,
    Tensor,
    _native,
    batch,
)

F32 = np.float32
X = [Tensor(name="x", dtype=F32, shape=(1,))]
Y = [Tensor(name="y", dtype=F32, shape=(1,))]


def count_to(n: float) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 1), n, F32)}


@pytest.fixture(scope="module")
def server():
    events: dict[str, list] = {"closed": [], "batches": []}

    def counter(requests):
        """Request with x = n gets responses 0, 1, ..., n-1 (none for 0), whatever else shares its batch."""
        counts = [int(r["x"][0, 0]) for r in requests]
        for i in range(max(counts)):
            yield [{"y": np.full((1, 1), i, F32)} if i < n else None for n in counts]

    def interleaved(requests):
        """Raw form over a batch of n: request k gets k+1 responses, starting at step n-1-k,
        so the last request of the batch hears first."""
        events["batches"].append(len(requests))
        n = len(requests)
        for step in range(n):
            time.sleep(0.05)
            yield [{"y": np.full((1, 1), step, F32)} if step >= n - 1 - k else None for k in range(n)]

    @batch
    def failing(x):
        yield {"y": x}
        yield {"y": x + 1}
        raise RuntimeError("the tokenizer broke")

    @batch
    def endless(x):
        try:
            i = 0
            while True:
                yield {"y": np.full_like(x, i)}
                i += 1
                time.sleep(0.01)
        finally:
            events["closed"].append(time.monotonic())

    @batch
    async def async_counter(x):
        for i in range(int(x[0, 0])):
            await asyncio.sleep(0)
            yield {"y": np.full_like(x, 100 + i)}

    srv = Server()
    decoupled = ModelConfig(decoupled=True, max_batch_size=8)
    for name, func in [
        ("Counter", counter),
        ("Failing", failing),
        ("Endless", endless),
        ("AsyncCounter", async_counter),
    ]:
        srv.bind(name, func, X, Y, decoupled)
    srv.bind(
        "Interleaved",
        interleaved,
        X,
        Y,
        ModelConfig(decoupled=True, max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=300_000)),
    )
    srv.bind("Plain", batch(lambda x: {"y": x * 2}), X, Y)
    with srv:
        srv.events = events
        yield srv


def values(parts) -> list[float]:
    return [float(p["y"].ravel()[0]) for p in parts]


@pytest.mark.parametrize("n", [0, 1, 5])
def test_a_generator_streams_n_responses(server, n):
    assert values(server.model("Counter").stream(count_to(n))) == list(range(n))


def test_many_concurrent_streams_each_get_their_own(server):
    results = {}

    def consume(n):
        results[n] = values(server.model("Counter").stream(count_to(n)))

    threads = [threading.Thread(target=consume, args=(n,)) for n in range(1, 17)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == {n: list(range(n)) for n in range(1, 17)}


def test_async_generator_and_stream_async(server):
    async def main():
        results = []
        for n in (2, 3):
            results.append(values([p async for p in server.model("AsyncCounter").stream_async(count_to(n))]))
        return results

    assert asyncio.run(main()) == [[100, 101], [100, 101, 102]]


def test_responses_out_of_request_order(server):
    arrivals: dict[int, list] = {}

    def consume(k):
        arrivals[k] = [(time.monotonic(), p["y"][0, 0]) for p in server.model("Interleaved").stream(count_to(k))]

    def in_flight() -> int:
        return _native.pending(server._handle)[0]

    assert wait_for(lambda: in_flight() == 0), f"{in_flight()} calls of earlier tests still in flight"
    threads = []
    for k in range(3):
        threads.append(threading.Thread(target=consume, args=(k,)))
        threads[-1].start()
        # arrival order 0, 1, 2 (a stream counts in flight, and is handed to Triton, with the GIL held throughout)
        assert wait_for(lambda k=k: in_flight() >= k + 1), f"request {k} did not reach Triton"
    for t in threads:
        t.join(timeout=30)
    assert server.events["batches"][-1] == 3
    assert [len(arrivals[k]) for k in range(3)] == [1, 2, 3]
    assert [v for _, v in arrivals[2]] == [0, 1, 2] and [v for _, v in arrivals[0]] == [2]
    first = [arrivals[k][0][0] for k in range(3)]
    assert first[2] < first[1] < first[0]  # the last request heard first


def test_error_mid_stream_arrives_after_the_responses_before_it(server):
    parts = []
    with pytest.raises(InternalError, match="RuntimeError: the tokenizer broke"):
        for part in server.model("Failing").stream(count_to(7)):
            parts.append(part)
    assert values(parts) == [7.0, 8.0]
    assert values(server.model("Counter").stream(count_to(2))) == [0.0, 1.0]  # still serving


def test_stopping_early_cancels_and_closes_the_generator(server):
    closed = server.events["closed"]
    before = len(closed)
    got = []
    for part in server.model("Endless").stream(count_to(0)):
        got.append(part)
        if len(got) == 3:
            break
    assert wait_for(lambda: len(closed) > before), "the generator was not closed after the consumer left"
    assert len(closed) == before + 1, "the generator was not closed after the consumer left"
    assert values(got) == [0.0, 1.0, 2.0]
    assert values(server.model("Counter").stream(count_to(1))) == [0.0]


def test_stopping_an_async_stream_early_cancels_it(server):
    closed = server.events["closed"]
    before = len(closed)

    async def main():
        stream = server.model("Endless").stream_async(count_to(0))
        got = []
        async for part in stream:
            got.append(part)
            if len(got) == 2:
                break
        await stream.aclose()
        return got

    assert len(asyncio.run(main())) == 2
    assert wait_for(lambda: len(closed) > before), "the generator was not closed after the consumer left"
    assert len(closed) == before + 1


def test_infer_on_a_decoupled_model_points_to_stream(server):
    with pytest.raises(InvalidArgumentError, match="decoupled: call stream"):
        server.model("Counter").infer(count_to(1))

    async def main():
        return await server.model("Counter").infer_async(count_to(1))

    with pytest.raises(InvalidArgumentError, match="decoupled: call stream"):
        asyncio.run(main())


def test_stream_on_a_plain_model_yields_its_one_response(server):
    assert values(server.model("Plain").stream(count_to(4))) == [8.0]


def test_decoupled_config(add_sub_tensors):
    with pytest.raises(InvalidArgumentError, match="response cache"):
        ModelConfig(decoupled=True, response_cache=True)
    srv = Server()
    srv.bind(
        "D", batch(lambda a, b: iter([{"add": a, "sub": b}])), *add_sub_tensors, config=ModelConfig(decoupled=True)
    )
    with srv:
        assert srv.model("D").config()["model_transaction_policy"]["decoupled"] is True


def test_a_decoupled_function_that_is_not_a_generator(server):
    srv = Server()
    srv.bind("NotGen", batch(lambda x: {"y": x}), X, Y, ModelConfig(decoupled=True))
    with srv, pytest.raises(InternalError, match="must be a generator"):
        list(srv.model("NotGen").stream(count_to(1)))


def test_stop_ends_running_streams_with_an_error():
    """A stream gets the grace period (exit_timeout_secs), then fails: a decoupled model may
    stream for ever."""

    @batch
    def endless(x):
        while True:
            yield {"y": x}
            time.sleep(0.01)

    srv = Server(ServerConfig(exit_timeout_secs=1))
    srv.bind("Endless", endless, X, Y, ModelConfig(decoupled=True))
    srv.start()
    got, errors = [], []

    def consume():
        try:
            for part in srv.model("Endless").stream(count_to(1)):
                got.append(part)
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    began = wait_for(lambda: got)  # (asserted after stop(), which ends the stream)
    started = time.monotonic()
    srv.stop()
    stopped = time.monotonic() - started
    thread.join(timeout=10)
    assert began, "the stream never began"
    assert not thread.is_alive()
    assert 0.7 < stopped < 2.5  # it streamed on through the grace period, no longer
    assert got and len(errors) == 1 and "stopped" in str(errors[0])


def test_a_consumer_that_is_behind_holds_the_generator_back():
    """A generator that yields faster than its consumer reads waits once 1,024 responses (or
    16 MiB) are queued for it, as a generator would, instead of queueing without bound (an
    unread OpenAI stream grew the process by 600 MB/s); it goes on as the consumer reads, and
    stop() ends a stream whose consumer reads nothing."""
    made = [0]
    closed: list[float] = []

    @batch
    def flood(x):
        try:
            while True:
                made[0] += 1
                yield {"y": x}
        finally:
            closed.append(time.monotonic())

    srv = Server(ServerConfig(exit_timeout_secs=1))
    srv.bind("Flood", flood, X, Y, ModelConfig(decoupled=True))
    with srv:
        stream = iter(srv.model("Flood").stream(count_to(1)))
        next(stream)
        assert wait_for(lambda: made[0] >= 1024)
        time.sleep(0.3)  # (the generator would go on yielding here if it were not held back)
        held = made[0]
        assert held <= 1100, f"{held} responses queued for a consumer that read one"
        for _ in range(600):  # reading takes the queue down to half: the generator goes on
            next(stream)
        assert wait_for(lambda: made[0] > held + 100), (held, made[0])
        stream.close()
        assert wait_for(lambda: closed), "the generator was not closed after the consumer left"

        before = made[0]
        unread = iter(srv.model("Flood").stream(count_to(1)))
        next(unread)
        assert wait_for(lambda: made[0] >= before + 1024)
        started = time.monotonic()
    stopped = time.monotonic() - started
    assert len(closed) == 2, "stop() did not end the stream held back by its consumer"
    assert stopped < 5, stopped
    with pytest.raises(Exception, match="stopped"):
        for _ in unread:
            pass
