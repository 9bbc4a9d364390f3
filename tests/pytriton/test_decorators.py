"""PyTriton's decorator examples (optional inputs with fill_optionals / first_value, grouping,
padding, triton_context, sample) and a callable reading request parameters, through the real
runtime, called with ModelClient over HTTP and gRPC."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from embedtriton.pytriton.client import ModelClient
from embedtriton.pytriton.decorators import (
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from embedtriton.pytriton.exceptions import PyTritonClientInferenceServerError, PyTritonValidationError
from embedtriton.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from embedtriton.pytriton.triton import Triton

F32 = np.float32
SEEN: dict[str, list] = {"groups": [], "padded": [], "keys": []}
LOCK = threading.Lock()


@fill_optionals(t=np.array([2.0], dtype=F32))
@batch
@first_value("w")
def add_sub_optional(a, b, t, **inputs):
    w = inputs.get("w", 1)  # a scalar once @first_value took it
    return {"add": a * w + b + t, "sub": a * w - b + t}


@batch
@group_by_values("temperature")
def scaled(x, temperature):
    with LOCK:
        SEEN["groups"].append(sorted(set(temperature.ravel().tolist())))
    return {"y": x * temperature}


@group_by_keys
@batch
def keyed(x, bias=None):
    with LOCK:
        SEEN["keys"].append((len(x), bias is not None))
    return {"y": x + (bias if bias is not None else 0)}


@batch
@pad_batch
def padded(x):
    with LOCK:
        SEEN["padded"].append(len(x))
    return {"y": x * 10}


@triton_context
def with_context(requests, triton_context):
    limit = triton_context.model_config.max_batch_size
    return [{"limit": np.full((len(r["x"]), 1), limit, dtype=np.int32)} for r in requests]


@sample
def no_batching(x):
    return {"y": x[::-1].copy()}


def with_parameters(requests):
    """A raw callable: every request's parameters and inputs (request.data, or the mapping)."""
    responses = []
    for request in requests:
        a, b = request.values()
        scale = float(request.parameters["scale"])
        shift = float(request.parameters.get("shift", 0))
        responses.append({"scaled_add": (a + b) * scale + shift, "scaled_sub": (request.data["INPUT_1"] - b) * scale})
    return responses


@pytest.fixture(scope="module")
def triton(local_config):
    vector = Tensor(dtype=F32, shape=(-1,))
    with Triton(config=local_config()) as triton:
        triton.bind(
            "AddSubOptional",
            add_sub_optional,
            inputs=[
                Tensor(dtype=F32, shape=(-1,), name="a"),
                Tensor(dtype=F32, shape=(-1,), name="b"),
                Tensor(dtype=F32, shape=(-1,), name="t", optional=True),
                Tensor(dtype=F32, shape=(-1,), name="w", optional=True),
            ],
            outputs=[Tensor(name="add", dtype=F32, shape=(-1,)), Tensor(name="sub", dtype=F32, shape=(-1,))],
            config=ModelConfig(max_batch_size=128),
            strict=True,
        )
        triton.bind(
            "Scaled",
            scaled,
            [Tensor(name="x", dtype=F32, shape=(1,)), Tensor(name="temperature", dtype=F32, shape=(1,))],
            [Tensor(name="y", dtype=F32, shape=(1,))],
            config=ModelConfig(max_batch_size=16),
        )
        triton.bind(
            "Keyed",
            keyed,
            [Tensor(name="x", dtype=F32, shape=(1,)), Tensor(name="bias", dtype=F32, shape=(1,), optional=True)],
            [Tensor(name="y", dtype=F32, shape=(1,))],
            config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=200_000)),
        )
        triton.bind(
            "Padded",
            padded,
            [Tensor(name="x", dtype=F32, shape=(1,))],
            [Tensor(name="y", dtype=F32, shape=(1,))],
            config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=[4])),
        )
        triton.bind("Context", with_context, [Tensor(name="x", dtype=F32, shape=(1,))],
                    [Tensor(name="limit", dtype=np.int32, shape=(1,))], config=ModelConfig(max_batch_size=6))  # fmt: skip
        triton.bind("NoBatching", no_batching, [Tensor(name="x", dtype=F32, shape=(3,))],
                    [Tensor(name="y", dtype=F32, shape=(3,))], config=ModelConfig(batching=False))  # fmt: skip
        triton.bind("Params", with_parameters, [vector, vector],
                    [Tensor(name="scaled_add", dtype=F32, shape=(-1,)), Tensor(name="scaled_sub", dtype=F32, shape=(-1,))],
                    config=ModelConfig(max_batch_size=128), strict=True)  # fmt: skip
        yield triton


def test_optional_inputs_with_fill_optionals_and_first_value(triton, url_of, protocol):
    a, b = np.ones((2, 1), F32), np.ones((2, 1), F32)
    with ModelClient(url_of(triton, protocol), "AddSubOptional") as client:
        out = client.infer_batch(a, b)  # t filled with 2, no w
        np.testing.assert_array_equal(out["add"], a + b + 2)
        out = client.infer_batch(a=a, b=b, w=np.full((2, 1), 3, F32))  # w: first value, a scalar
        np.testing.assert_array_equal(out["add"], a * 3 + b + 2)
        np.testing.assert_array_equal(out["sub"], a * 3 - b + 2)
        out = client.infer_batch(a, b, np.full((2, 1), 5, F32))  # positional: a, b, t
        np.testing.assert_array_equal(out["add"], a + b + 5)
        out = client.infer_batch(a, b, np.full((2, 1), 5, F32), np.full((2, 1), 3, F32))
        np.testing.assert_array_equal(out["sub"], a * 3 - b + 5)


def test_first_value_refuses_differing_values(triton, url_of, protocol):
    a = np.ones((2, 1), F32)
    with ModelClient(url_of(triton, protocol), "AddSubOptional") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="The values on the 'w' input are not equal"):
            client.infer_batch(a=a, b=a, w=np.array([[1.0], [2.0]], F32))


def test_group_by_values_calls_once_per_value(triton, url_of, protocol):
    SEEN["groups"].clear()
    x = np.arange(6, dtype=F32).reshape(6, 1)
    temperature = np.array([[0.5], [2.0], [0.5], [3.0], [2.0], [0.5]], F32)
    with ModelClient(url_of(triton, protocol), "Scaled") as client:
        out = client.infer_batch(x=x, temperature=temperature)
    np.testing.assert_array_equal(out["y"], x * temperature)  # merged back in row order
    assert sorted(SEEN["groups"]) == [[0.5], [2.0], [3.0]]


def test_group_by_keys_batches_requests_with_the_same_inputs(triton, url_of, protocol):
    """Concurrent requests with and without the optional input reach one callable call each
    group (the batcher waits 200 ms, so they arrive as one batch)."""
    from concurrent.futures import ThreadPoolExecutor

    SEEN["keys"].clear()
    url = url_of(triton, protocol)

    def call(i):
        with ModelClient(url, "Keyed") as client:
            inputs = {"x": np.array([float(i)], F32)}
            if i % 2:
                inputs["bias"] = np.array([100.0], F32)
            return client.infer_sample(**inputs)["y"][0]

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(call, range(6)))
    assert answers == [i + (100.0 if i % 2 else 0.0) for i in range(6)]
    assert sum(n for n, _ in SEEN["keys"]) == 6
    assert {has_bias for _, has_bias in SEEN["keys"]} == {True, False}


def test_pad_batch_pads_to_the_preferred_size_and_cuts_back(triton, url_of, protocol):
    SEEN["padded"].clear()
    x = np.arange(3, dtype=F32).reshape(3, 1)
    with ModelClient(url_of(triton, protocol), "Padded") as client:
        out = client.infer_batch(x=x)
        np.testing.assert_array_equal(out["y"], x * 10)
        out = client.infer_batch(x=np.ones((5, 1), F32))
        assert out["y"].shape == (5, 1)
    assert SEEN["padded"] == [4, 8]  # preferred size 4, then max_batch_size 8


def test_triton_context_gives_the_model_config(triton, url_of, protocol):
    with ModelClient(url_of(triton, protocol), "Context") as client:
        assert client.infer_sample(x=np.ones(1, F32))["limit"][0] == 6
    context = triton._triton_context
    assert context.model_configs[with_context].max_batch_size == 6


def test_sample_on_a_model_without_batching(triton, url_of, protocol):
    with ModelClient(url_of(triton, protocol), "NoBatching") as client:
        np.testing.assert_array_equal(client.infer_sample(x=np.array([1, 2, 3], F32))["y"], [3, 2, 1])
        assert not client.is_batching_supported


def test_request_parameters_reach_the_callable(triton, url_of, protocol):
    a, b = np.full((2, 1), 2.0, F32), np.ones((2, 1), F32)
    with ModelClient(url_of(triton, protocol), "Params") as client:
        out = client.infer_batch(a, b, parameters={"scale": 3, "shift": 1})
        np.testing.assert_array_equal(out["scaled_add"], (a + b) * 3 + 1)
        np.testing.assert_array_equal(out["scaled_sub"], (a - b) * 3)
        out = client.infer_batch(a, b, parameters={"scale": "0.5"})  # str parameters too
        np.testing.assert_array_equal(out["scaled_add"], (a + b) * 0.5)


def test_decorators_outside_a_bound_model_say_so():
    from embedtriton import Request

    with pytest.raises(PyTritonValidationError, match="must bound with triton"):
        with_context([Request(x=np.ones((1, 1), F32))])
    # @batch alone needs no model: a dict of outputs is split back per request
    requests = [
        Request(a=np.ones((1, 1), F32), b=np.ones((1, 1), F32)),
        Request(a=np.zeros((2, 1), F32), b=np.ones((2, 1), F32)),
    ]
    answers = batch(lambda a, b: {"add": a + b})(requests)
    assert [r["add"].ravel().tolist() for r in answers] == [[2.0], [1.0, 1.0]]


def test_group_by_keys_splits_a_mixed_batch_and_keeps_the_order():
    from embedtriton import Request

    SEEN["keys"].clear()
    requests = [Request(x=np.array([[1.0]], F32)), Request(x=np.array([[2.0]], F32), bias=np.array([[10.0]], F32)),
                Request(x=np.array([[3.0]], F32))]  # fmt: skip
    answers = keyed(requests)
    assert [a["y"][0, 0] for a in answers] == [1.0, 12.0, 3.0]
    assert sorted(SEEN["keys"]) == [(1, True), (2, False)]
    with pytest.raises(PyTritonValidationError, match="different set of inputs keys"):
        batch(lambda x, bias=None: {"y": x})(requests)  # @batch alone refuses mixed inputs
