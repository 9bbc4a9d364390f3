"""Serving features through ModelConfig: cache, warm-up, batching off, instances, batcher policies."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import (
    AlreadyExistsError,
    DynamicBatcher,
    InstanceGroup,
    InvalidArgumentError,
    ModelConfig,
    ModelWarmup,
    QueuePolicy,
    Server,
    ServerConfig,
    Tensor,
    TimeoutAction,
    UnavailableError,
    WarmupInput,
    _native,
    batch,
)

F32 = np.float32


def one(value: float) -> dict[str, np.ndarray]:
    return {"a": np.full((1, 1), value, F32), "b": np.ones((1, 1), F32)}


def test_response_cache_answers_repeats_without_the_callable(add_sub, add_sub_tensors, counter, own_process):
    if not own_process:
        return
    counted = counter(add_sub)
    server = Server(ServerConfig(cache_config=["local,size=1048576"]))
    server.bind("Cached", counted, *add_sub_tensors, config=ModelConfig(max_batch_size=8, response_cache=True))
    with server:
        model = server.model("Cached")
        first = model.infer(one(5))
        again = model.infer(one(5))
        assert counted.requests == 1  # the repeat came from the cache
        np.testing.assert_array_equal(first["add"], again["add"])
        model.infer(one(6))
        assert counted.requests == 2  # a different input calls the model again
        stats = model.statistics()["inference_stats"]
        assert stats["cache_hit"]["count"] == 1 and stats["cache_miss"]["count"] == 2
        assert "nv_cache_num_hits_per_model" in server.metrics() or "cache" in server.metrics()


def test_a_second_response_cache_while_a_stopped_one_waits_is_a_clear_error(add_sub, add_sub_tensors, own_process):
    if not own_process:
        return
    other = Server()
    other.start()  # while it runs, a stopped server is not deleted (and keeps Triton's cache)
    try:
        with Server(ServerConfig(cache_config=["local,size=1048576"])):
            pass
        with pytest.raises(AlreadyExistsError, match="Triton keeps one response cache per process"):
            Server(ServerConfig(cache_config=["local,size=1048576"])).start()
    finally:
        other.stop()
    with Server(ServerConfig(cache_config=["local,size=1048576"])):  # the stopped ones are deleted now
        pass


def test_warmup_runs_every_stage_before_bind_returns(tmp_path):
    seen: list[tuple[int, list, np.ndarray]] = []  # per execution: requests, their shapes, first x
    data = np.array([1.5, 2.5, 3.5], dtype=F32)
    np.save(tmp_path / "x.npy", data)

    def record(requests):
        seen.append((len(requests), [r["x"].shape for r in requests], requests[0]["x"].copy()))
        return [{"y": r["x"]} for r in requests]

    warmup = [
        ModelWarmup(
            name="zeros",
            batch_size=4,
            inputs={
                "x": WarmupInput(dtype=F32, shape=(3,), zero_data=True),
                "label": WarmupInput(dtype=np.bytes_, shape=(1,), zero_data=True),
            },
            count=2,
        ),
        ModelWarmup(
            name="random",
            batch_size=1,
            inputs={
                "x": WarmupInput(dtype=F32, shape=(3,), random_data=True),
                "label": WarmupInput(dtype=np.bytes_, shape=(1,), zero_data=True),
            },
        ),
        ModelWarmup(
            name="from-file",
            batch_size=2,
            inputs={
                "x": WarmupInput(dtype=F32, shape=(3,), input_data_file=str(tmp_path / "x.npy")),
                "label": WarmupInput(dtype=np.bytes_, shape=(1,), zero_data=True),
            },
        ),
    ]
    server = Server()
    with server:
        model = server.bind(
            "Warm",
            record,
            [Tensor(name="x", dtype=F32, shape=(3,)), Tensor(name="label", dtype=np.bytes_, shape=(1,))],
            [Tensor(name="y", dtype=F32, shape=(3,))],
            ModelConfig(max_batch_size=4, model_warmup=warmup),
        )
        # Triton sends a stage's batch as batch_size requests of one row, `count` times
        assert [(n, shapes) for n, shapes, _ in seen] == [
            (4, [(1, 3)] * 4),
            (4, [(1, 3)] * 4),
            (1, [(1, 3)]),
            (2, [(1, 3)] * 2),
        ]
        assert not seen[0][2].any()
        np.testing.assert_array_equal(seen[3][2], [data])
        assert model.ready


def test_warmup_validation(add_sub, add_sub_tensors):
    with pytest.raises(InvalidArgumentError, match="exactly one data source"):
        WarmupInput(dtype=F32, shape=(1,), zero_data=True, random_data=True)
    with pytest.raises(InvalidArgumentError, match="exactly one data source"):
        WarmupInput(dtype=F32, shape=(1,))
    stage = ModelWarmup(name="w", batch_size=16, inputs={"a": WarmupInput(dtype=F32, shape=(1,), zero_data=True)})
    with pytest.raises(InvalidArgumentError, match="exceeds max_batch_size"):
        ModelConfig(max_batch_size=8, model_warmup=[stage])
    small = ModelWarmup(name="w", batch_size=1, inputs={"a": WarmupInput(dtype=F32, shape=(1,), zero_data=True)})
    with pytest.raises(InvalidArgumentError, match=r"missing: \['b'\]"):
        Server().bind("W", add_sub, *add_sub_tensors, config=ModelConfig(model_warmup=[small])).infer  # noqa: B018
    with Server() as server, pytest.raises(InvalidArgumentError, match="cannot be read"):
        bad = WarmupInput(dtype=F32, shape=(1,), input_data_file="/nonexistent.npy")
        stage = ModelWarmup(name="w", batch_size=1, inputs={"a": bad, "b": bad})
        server.bind("W", add_sub, *add_sub_tensors, config=ModelConfig(model_warmup=[stage]))


def test_batching_off_gives_one_request_at_a_time():
    sizes = []

    def identity(requests):
        sizes.append(len(requests))
        return [{"y": r["x"] * 2} for r in requests]

    server = Server()
    server.bind(
        "NoBatch",
        identity,
        [Tensor(name="x", dtype=F32, shape=(2,))],
        [Tensor(name="y", dtype=F32, shape=(2,))],
        ModelConfig(batching=False),
    )
    with server:
        model = server.model("NoBatch")
        assert model.config()["max_batch_size"] == 0

        async def many():
            return await asyncio.gather(*(model.infer_async({"x": np.full(2, i, F32)}) for i in range(20)))

        results = asyncio.run(many())
        assert [r["y"].tolist() for r in results] == [[2.0 * i, 2.0 * i] for i in range(20)]
        assert set(sizes) == {1}
        with pytest.raises(InvalidArgumentError):
            model.infer({"x": np.ones((1, 2), F32)})  # no batch axis on such a model


def intervals_model(delay):
    spans = []

    def slow(requests):
        start = time.monotonic()
        time.sleep(delay)
        spans.append((start, time.monotonic()))
        return [{"y": r["x"]} for r in requests]

    return slow, spans


def test_two_instances_run_concurrently():
    slow, spans = intervals_model(0.3)
    server = Server()
    server.bind(
        "Twice",
        slow,
        [Tensor(name="x", dtype=F32, shape=(1,))],
        [Tensor(name="y", dtype=F32, shape=(1,))],
        ModelConfig(batching=False, instance_group=[InstanceGroup(count=2, kind="CPU")]),
    )
    with server:
        model = server.model("Twice")
        assert model.config()["instance_group"][0]["count"] == 2
        threads = [threading.Thread(target=model.infer, args=({"x": np.ones(1, F32)},)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    (s1, e1), (s2, e2) = spans
    assert max(s1, s2) < min(e1, e2), f"instances did not overlap: {spans}"


def test_instance_group_validation():
    with pytest.raises(InvalidArgumentError, match="count"):
        InstanceGroup(count=0)
    with pytest.raises(InvalidArgumentError, match="kind"):
        InstanceGroup(kind="TPU")


def ordered_completion(preserve: bool) -> list[int]:
    def variable(requests):
        time.sleep(float(requests[0]["x"][0, 0]))
        return [{"y": r["x"]} for r in requests]

    server = Server()
    server.bind(
        "Ordered",
        variable,
        [Tensor(name="x", dtype=F32, shape=(1,))],
        [Tensor(name="y", dtype=F32, shape=(1,))],
        ModelConfig(
            max_batch_size=1,
            batcher=DynamicBatcher(preserve_ordering=preserve),
            instance_group=[InstanceGroup(count=2)],
        ),
    )
    order: list[int] = []
    with server:
        model = server.model("Ordered")

        async def main():
            futures = []
            for i, delay in enumerate((0.4, 0.0)):
                fut = model.infer_async({"x": np.full((1, 1), delay, F32)})
                fut.add_done_callback(lambda _f, i=i: order.append(i))
                futures.append(fut)
                await asyncio.sleep(0.05)
            await asyncio.gather(*futures)

        asyncio.run(main())
    return order


def test_preserve_ordering_returns_responses_in_arrival_order():
    assert ordered_completion(preserve=False) == [1, 0]  # the fast one overtakes
    assert ordered_completion(preserve=True) == [0, 1]  # held back until the slow one is done


def blocking_server(batcher: DynamicBatcher):
    """A one-instance model whose request with x<0 blocks for |x| seconds; records execution order."""
    executed: list[float] = []

    def model_func(requests):
        for r in requests:
            value = float(r["x"][0, 0])
            if value < 0:
                time.sleep(-value)
            executed.append(value)
        return [{"y": r["x"]} for r in requests]

    server = Server()
    server.bind(
        "Queue",
        model_func,
        [Tensor(name="x", dtype=F32, shape=(1,))],
        [Tensor(name="y", dtype=F32, shape=(1,))],
        ModelConfig(max_batch_size=1, batcher=batcher),
    )
    return server, executed


def run_concurrently(server, calls):
    """Each call in a thread of its own, started once the one before reached the server (or was
    answered): they arrive in order."""
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as exc:
            results[i] = exc

    threads = []
    for i, call in enumerate(calls):
        t = threading.Thread(target=run, args=(i, call))
        t.start()
        threads.append(t)
        # (the answered counted before those in flight: one answered in between is missed for a poll, never counted twice)
        arrived = wait_for(lambda i=i: sum(r is not None for r in results) + _native.pending(server._handle)[0] > i)
        assert arrived, f"call {i} never reached the server"
    for t in threads:
        t.join(timeout=30)
    return results


def test_high_priority_overtakes_a_queued_backlog():
    server, executed = blocking_server(DynamicBatcher(priority_levels=2, default_priority_level=2))
    with server:
        model = server.model("Queue")

        def call(value, priority=None):
            return lambda: model.infer({"x": np.full((1, 1), value, F32)}, priority=priority)

        calls = [call(-0.4)] + [call(float(i)) for i in range(1, 6)] + [call(100.0, priority=1)]
        results = run_concurrently(server, calls)
    assert all(isinstance(r, dict) for r in results)
    assert executed[0] < 0 and executed[1] == 100.0, executed
    assert executed[2:] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_queue_overflow_is_rejected_with_unavailable():
    server, executed = blocking_server(DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=2)))
    with server:
        model = server.model("Queue")
        calls = [lambda v=v: model.infer({"x": np.full((1, 1), v, F32)}) for v in (-0.4, 1, 2, 3, 4, 5)]
        results = run_concurrently(server, calls)
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors and all(isinstance(e, UnavailableError) for e in errors)
    assert "queue size" in str(errors[0])
    assert isinstance(results[0], dict) and len(errors) + len(executed) == 6


@pytest.mark.parametrize("action", [TimeoutAction.REJECT, TimeoutAction.DELAY])
def test_queue_timeout_reject_vs_delay(action):
    # Requests may shorten the 2 s default timeout (Triton never lets them lengthen it).
    policy = QueuePolicy(timeout_action=action, default_timeout_microseconds=2_000_000, allow_timeout_override=True)
    server, executed = blocking_server(DynamicBatcher(default_queue_policy=policy))
    with server:
        model = server.model("Queue")
        x = {"x": np.full((1, 1), 7, F32)}
        results = run_concurrently(
            server,
            [
                lambda: model.infer({"x": np.full((1, 1), -0.5, F32)}),  # occupies the instance for 0.5 s
                lambda: model.infer(x),  # waits less than its 2 s timeout
                lambda: model.infer(x, timeout_us=100_000),  # waits past its own 100 ms
            ],
        )
    assert isinstance(results[0], dict) and isinstance(results[1], dict)
    if action is TimeoutAction.REJECT:
        assert isinstance(results[2], UnavailableError) and "timeout" in str(results[2]).lower()
        assert len(executed) == 2
    else:
        assert isinstance(results[2], dict)  # delayed, then served
        assert len(executed) == 3


def test_parameters_reach_batch_functions(add_sub_tensors):
    seen = []

    @batch
    def with_params(a, b, parameters):
        seen.append(parameters)
        return {"add": a + b, "sub": a - b}

    server = Server()
    server.bind("Params", with_params, *add_sub_tensors)
    with server:
        server.model("Params").infer(one(1), parameters={"mode": "fast", "k": 3, "on": False, "t": 0.5})
    assert seen == [[{"mode": "fast", "k": 3, "on": False, "t": 0.5}]]
