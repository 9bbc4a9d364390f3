"""PyTriton's documented quick start and binding examples, written as a PyTriton user writes
them (only the imports say embedtriton), called with ModelClient over HTTP and gRPC."""

from __future__ import annotations

import numpy as np
import pytest

from embedtriton.pytriton.client import AsyncioModelClient, FuturesModelClient, ModelClient
from embedtriton.pytriton.decorators import batch
from embedtriton.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from embedtriton.pytriton.triton import Triton

WEIGHTS = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]], dtype=np.float32)  # a Linear(2, 3) layer
BIAS = np.array([0.1, 0.2, 0.3], dtype=np.float32)


@batch
def linear(**inputs: np.ndarray):
    (x,) = inputs.values()
    return [x @ WEIGHTS + BIAS]  # a list: outputs in their declared order


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@pytest.fixture(scope="module")
def triton(local_config):
    with Triton(config=local_config()) as triton:
        triton.bind(
            model_name="Linear",
            infer_func=linear,
            inputs=[Tensor(dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=128),
        )
        triton.bind(
            model_name="AddSub",
            infer_func=add_sub,
            inputs=[Tensor(name="a", dtype=np.float32, shape=(1,)), Tensor(name="b", dtype=np.float32, shape=(1,))],
            outputs=[
                Tensor(name="add", dtype=np.float32, shape=(1,)),
                Tensor(name="sub", dtype=np.float32, shape=(1,)),
            ],
            config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=100)),
        )
        yield triton


def test_linear_batch_and_sample(triton, url_of, protocol):
    x = np.random.default_rng(0).standard_normal((16, 2)).astype(np.float32)
    with ModelClient(url_of(triton, protocol), "Linear") as client:
        result = client.infer_batch(x)
        assert list(result) == ["OUTPUT_1"]  # unnamed outputs: OUTPUT_1, ... as in PyTriton
        np.testing.assert_allclose(result["OUTPUT_1"], x @ WEIGHTS + BIAS, rtol=1e-6)
        one = client.infer_sample(x[3])
        assert one["OUTPUT_1"].shape == (3,)
        np.testing.assert_allclose(one["OUTPUT_1"], x[3] @ WEIGHTS + BIAS, rtol=1e-6)


def test_add_sub_positional_and_named(triton, url_of, protocol):
    with ModelClient(url_of(triton, protocol), "AddSub", init_timeout_s=10) as client:
        out = client.infer_sample(np.array([3.0], np.float32), np.array([1.0], np.float32))
        np.testing.assert_array_equal(out["add"], [4.0])
        np.testing.assert_array_equal(out["sub"], [2.0])
        a = np.arange(6, dtype=np.float32).reshape(6, 1)
        out = client.infer_batch(a=a, b=np.ones_like(a))
        np.testing.assert_array_equal(out["add"], a + 1)
        np.testing.assert_array_equal(out["sub"], a - 1)
        config = client.model_config
        assert config.max_batch_size == 8 and config.batching and not config.decoupled
        assert [(s.name, s.shape, s.dtype) for s in config.inputs] == [("a", (1,), np.float32), ("b", (1,), np.float32)]


def test_a_wrong_url_scheme_and_explicit_schemes(triton):
    from embedtriton.pytriton.exceptions import PyTritonClientInvalidUrlError

    with pytest.raises(PyTritonClientInvalidUrlError):
        ModelClient("ftp://127.0.0.1:1", "AddSub")
    with ModelClient(f"http://127.0.0.1:{triton.http_port}", "AddSub") as client:
        assert client.infer_sample(a=np.ones(1, np.float32), b=np.ones(1, np.float32))["add"][0] == 2.0


def test_futures_client_runs_calls_concurrently(triton, url_of, protocol):
    with FuturesModelClient(url_of(triton, protocol), "AddSub", max_workers=4) as client:
        futures = [
            client.infer_sample(np.array([float(i)], np.float32), np.array([1.0], np.float32)) for i in range(20)
        ]
        assert [f.result(timeout=30)["add"][0] for f in futures] == [i + 1.0 for i in range(20)]
        assert client.model_config().result(timeout=30).max_batch_size == 8


def test_asyncio_client(triton, url_of, protocol):
    import asyncio

    async def main():
        async with AsyncioModelClient(url_of(triton, protocol), "AddSub") as client:
            calls = [
                client.infer_sample(a=np.array([float(i)], np.float32), b=np.array([2.0], np.float32)) for i in range(8)
            ]
            results = await asyncio.gather(*calls)
            assert (await client.model_config).max_batch_size == 8
            return [r["sub"][0] for r in results]

    assert asyncio.run(main()) == [i - 2.0 for i in range(8)]


def test_in_process_calls_still_work(triton):
    out = triton.server.model("AddSub").infer({"a": np.ones((2, 1), np.float32), "b": np.ones((2, 1), np.float32)})
    np.testing.assert_array_equal(out["add"], [[2.0], [2.0]])
