"""Binding callables and calling them in-process through the real Triton runtime."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedtriton import (
    DynamicBatcher,
    InvalidArgumentError,
    ModelConfig,
    NotFoundError,
    QueuePolicy,
    Server,
    Tensor,
    TimeoutAction,
    batch,
)


def test_add_sub_in_process(server):
    out = server.model("AddSub").infer({"a": np.ones((2, 1), np.float32), "b": np.full((2, 1), 3, np.float32)})
    assert set(out) == {"add", "sub"}
    assert out["add"].dtype == np.float32 and out["add"].shape == (2, 1)
    np.testing.assert_array_equal(out["add"], [[4], [4]])
    np.testing.assert_array_equal(out["sub"], [[-2], [-2]])


def test_outputs_are_writable_arrays_that_own_their_memory(server):
    out = server.model("AddSub").infer({"a": np.ones((1, 1), np.float32), "b": np.ones((1, 1), np.float32)})
    out["add"] += 1  # the caller owns the result
    np.testing.assert_array_equal(out["add"], [[3]])


def test_requested_outputs_only(server):
    out = server.model("AddSub").infer(
        {"a": np.ones((1, 1), np.float32), "b": np.ones((1, 1), np.float32)}, outputs=["sub"]
    )
    assert list(out) == ["sub"]


NUMERIC = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
NUMERIC += [np.float16, np.float32, np.float64]


@pytest.fixture(scope="module")
def identity_server():
    srv = Server()

    def identity(requests):
        return [{"y": r["x"]} for r in requests]

    for dtype in NUMERIC + [np.bytes_]:
        name = f"id_{np.dtype(dtype).name}"
        srv.bind(
            name, identity, [Tensor(name="x", dtype=dtype, shape=(-1,))], [Tensor(name="y", dtype=dtype, shape=(-1,))]
        )
    with srv:
        yield srv


@pytest.mark.parametrize("dtype", NUMERIC)
def test_every_numeric_dtype_round_trips(identity_server, dtype):
    rng = np.random.default_rng(0)
    x = (rng.random((3, 5)) * 100).astype(dtype)
    out = identity_server.model(f"id_{np.dtype(dtype).name}").infer({"x": x})
    assert out["y"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out["y"], x)


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, np.uint32, np.float16, np.float32, np.float64])
def test_byte_swapped_inputs_arrive_with_their_values(identity_server, dtype):
    """A non-native byte order (e.g. from a big-endian file) is converted, not sent as raw bytes."""
    x = (np.arange(15).reshape(3, 5) * 3 + 1).astype(np.dtype(dtype).newbyteorder())
    model = identity_server.model(f"id_{np.dtype(dtype).name}")
    np.testing.assert_array_equal(model.infer({"x": x})["y"], x)
    np.testing.assert_array_equal(model.infer({"x": x[:, ::2]})["y"], x[:, ::2])  # strided too
    np.testing.assert_array_equal(model.infer_many([{"x": x}] * 3)[2]["y"], x)


@pytest.mark.parametrize("kind", ["object", "bytes_", "str"])
def test_bytes_tensors_round_trip(identity_server, kind):
    values = [[b"", b"hello", b"\x00\xff binary"], [b"a", b"bb", b"ccc"]]
    if kind == "object":
        x = np.array(values, dtype=object)
    elif kind == "bytes_":
        x = np.array(values, dtype=np.bytes_)
    else:
        x = np.array([[v.decode("latin-1") for v in row] for row in values[1:]], dtype=str)
        values = values[1:]
    out = identity_server.model("id_bytes").infer({"x": x})
    assert out["y"].dtype == object and out["y"].shape == x.shape
    assert out["y"].tolist() == values


def test_variable_dimensions(identity_server):
    model = identity_server.model("id_float32")
    for n in (1, 7, 300):
        x = np.arange(2 * n, dtype=np.float32).reshape(2, n)
        np.testing.assert_array_equal(model.infer({"x": x})["y"], x)


def test_unnamed_tensors_get_positional_names():
    srv = Server()
    srv.bind(
        "Unnamed",
        batch(lambda INPUT_1, INPUT_2: {"OUTPUT_1": INPUT_1 * 2, "OUTPUT_2": INPUT_2 + 1}),
        [Tensor(dtype=np.int32, shape=(2,)), Tensor(dtype=np.int32, shape=(2,))],
        [Tensor(dtype=np.int32, shape=(2,)), Tensor(dtype=np.int32, shape=(2,))],
    )
    with srv:
        meta = srv.model("Unnamed").metadata()
        assert [t["name"] for t in meta["inputs"]] == ["INPUT_1", "INPUT_2"]
        assert [t["name"] for t in meta["outputs"]] == ["OUTPUT_1", "OUTPUT_2"]
        x = np.array([[1, 2]], np.int32)
        out = srv.model("Unnamed").infer({"INPUT_1": x, "INPUT_2": x})
        np.testing.assert_array_equal(out["OUTPUT_1"], [[2, 4]])
        np.testing.assert_array_equal(out["OUTPUT_2"], [[2, 3]])


def test_raw_callable_sees_requests_and_parameters(server):
    seen = []

    def raw(requests):
        seen.extend((dict(r.parameters), sorted(r)) for r in requests)
        return [{"n": np.array([len(r["x"])], np.int64)} for r in requests]

    server.bind(
        "Raw",
        raw,
        [Tensor(name="x", dtype=np.float32, shape=(-1,))],
        [Tensor(name="n", dtype=np.int64, shape=(1,))],
        ModelConfig(batching=False),
    )
    try:
        params = {"s": "text", "i": -5, "f": 0.25, "t": True}
        out = server.model("Raw").infer({"x": np.zeros(4, np.float32)}, parameters=params)
        np.testing.assert_array_equal(out["n"], [4])
        assert seen == [(params, ["x"])]
    finally:
        server.unbind("Raw")


def test_batch_decorator_splits_outputs_per_request(add_sub_counted):
    model, counter = add_sub_counted
    x = np.arange(6, dtype=np.float32).reshape(6, 1)
    out = model.infer({"a": x, "b": x})
    np.testing.assert_array_equal(out["add"], 2 * x)
    assert counter.requests == 1


def test_concurrent_requests_are_batched_and_routed(add_sub_counted):
    from concurrent.futures import ThreadPoolExecutor

    model, counter = add_sub_counted

    def one(i):
        a = np.full((1, 1), i, np.float32)
        return i, model.infer({"a": a, "b": np.ones((1, 1), np.float32)})

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(64)))
    for i, out in results:
        assert out["add"][0, 0] == i + 1 and out["sub"][0, 0] == i - 1
    stats = model.statistics()
    assert stats["inference_count"] == 64
    assert stats["execution_count"] < 32, stats["execution_count"]
    assert counter.batches == stats["execution_count"]
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 1
    assert all(b["batch_size"] <= 8 for b in stats["batch_stats"])


def test_infer_async_many_in_flight(add_sub_counted):
    model, counter = add_sub_counted

    async def main():
        calls = [
            model.infer_async({"a": np.full((1, 1), i, np.float32), "b": np.full((1, 1), i, np.float32)})
            for i in range(100)
        ]
        return await asyncio.gather(*calls)

    results = asyncio.run(main())
    for i, out in enumerate(results):
        assert out["add"][0, 0] == 2 * i and out["sub"][0, 0] == 0
    assert counter.batches < 100 // 2


def test_infer_async_error_is_raised_in_the_awaiting_task(server):
    async def main():
        return await server.model("AddSub").infer_async({"a": np.ones((1, 1), np.float64)})

    with pytest.raises(InvalidArgumentError):
        asyncio.run(main())


def test_bind_after_start_and_unbind(server, add_sub_tensors):
    inputs, outputs = add_sub_tensors
    model = server.bind("Late", batch(lambda a, b: {"add": a * b, "sub": a / b}), inputs, outputs)
    assert model.ready
    out = model.infer({"a": np.full((1, 1), 3, np.float32), "b": np.full((1, 1), 2, np.float32)})
    assert out["add"][0, 0] == 6
    assert "Late" in [m.name for m in server.models()]
    server.unbind("Late")
    assert not model.ready
    with pytest.raises(NotFoundError):
        server.model("Late")
    with pytest.raises(NotFoundError, match="Late"):
        model.infer({"a": np.ones((1, 1), np.float32), "b": np.ones((1, 1), np.float32)})


def test_server_metadata_metrics_statistics_config(server):
    assert server.live and server.ready
    meta = server.metadata()
    assert meta["name"] == "triton" and meta["version"].startswith("2.")
    model = server.model("AddSub")
    model.infer({"a": np.ones((1, 1), np.float32), "b": np.ones((1, 1), np.float32)})
    assert 'nv_inference_request_success{model="AddSub",version="1"}' in server.metrics()
    stats = model.statistics()
    assert stats["name"] == "AddSub" and stats["inference_count"] >= 1
    config = model.config()
    assert config["backend"] == "embedtriton" and config["max_batch_size"] == 8
    assert [i["name"] for i in config["input"]] == ["a", "b"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"


def test_dynamic_batcher_settings_reach_triton(add_sub_tensors):
    srv = Server()
    inputs, outputs = add_sub_tensors
    policy = QueuePolicy(
        timeout_action=TimeoutAction.DELAY,
        default_timeout_microseconds=500,
        allow_timeout_override=True,
        max_queue_size=7,
    )
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=100,
        preferred_batch_size=[2, 4],
        preserve_ordering=False,
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=policy,
        priority_queue_policy={1: QueuePolicy(max_queue_size=3)},
    )
    srv.bind(
        "Configured", batch(lambda a, b: {"add": a + b, "sub": a - b}), inputs, outputs, ModelConfig(batcher=batcher)
    )
    with srv:
        applied = srv.model("Configured").config()
    dyn = applied["dynamic_batching"]
    assert applied["max_batch_size"] == 4
    assert dyn["preferred_batch_size"] == [2, 4] and dyn["preserve_ordering"] is False
    assert int(dyn["max_queue_delay_microseconds"]) == 100
    assert int(dyn["priority_levels"]) == 2 and int(dyn["default_priority_level"]) == 2
    assert dyn["default_queue_policy"]["timeout_action"] == "DELAY"
    assert dyn["default_queue_policy"]["max_queue_size"] == 7
    assert dyn["priority_queue_policy"]["1"]["max_queue_size"] == 3


def test_servers_one_after_another(add_sub_tensors):
    inputs, outputs = add_sub_tensors
    for i in range(3):
        srv = Server()
        srv.bind("AddSub", batch(lambda a, b, k=i: {"add": a + b + k, "sub": a - b}), inputs, outputs)
        with srv:
            out = srv.model("AddSub").infer({"a": np.ones((1, 1), np.float32), "b": np.ones((1, 1), np.float32)})
            assert out["add"][0, 0] == 2 + i
        assert not srv.live
    srv.start()  # and the same object again
    try:
        assert srv.model("AddSub").ready
    finally:
        srv.stop()


def test_input_view_kept_by_the_callable_gets_its_own_copy(server):
    kept = []

    def keep(requests):
        kept.append(requests[0]["x"])
        return [{"y": r["x"]} for r in requests]

    server.bind(
        "Keeper",
        keep,
        [Tensor(name="x", dtype=np.float32, shape=(3,))],
        [Tensor(name="y", dtype=np.float32, shape=(3,))],
    )
    try:
        x = np.array([[1, 2, 3]], np.float32)
        server.model("Keeper").infer({"x": x})
        x[:] = 0  # the caller reuses its buffer
        np.testing.assert_array_equal(kept[0], [[1, 2, 3]])
        assert not kept[0].flags.writeable
    finally:
        server.unbind("Keeper")
