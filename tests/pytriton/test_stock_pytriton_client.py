"""PyTriton's own client package (``pytriton.client`` from the nvidia-pytriton wheel), unmodified,
against our HTTP and gRPC endpoints: where a user still has it, it keeps working. The wheel is
installed with ``--no-deps``; its client needs ``typing_inspect``, ``wrapt``, ``pyzmq``, ``sh``
and ``typer``, which the test session installs."""

from __future__ import annotations

import numpy as np
import pytest

stock = pytest.importorskip("pytriton.client", reason="PyTriton's client needs its own dependencies installed")

from embedtriton.pytriton.decorators import batch  # noqa: E402
from embedtriton.pytriton.model_config import ModelConfig, Tensor  # noqa: E402
from embedtriton.pytriton.triton import Triton  # noqa: E402


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@batch
def count(n):
    for i in range(int(n[0, 0])):
        yield {"i": np.array([[i]], np.int32)}


@pytest.fixture(scope="module")
def triton(local_config):
    with Triton(config=local_config()) as triton:
        f32 = [Tensor(name=n, dtype=np.float32, shape=(1,)) for n in ("a", "b", "add", "sub")]
        triton.bind("AddSub", add_sub, f32[:2], f32[2:], config=ModelConfig(max_batch_size=8))
        triton.bind(
            "Count",
            count,
            [Tensor(name="n", dtype=np.int32, shape=(1,))],
            [Tensor(name="i", dtype=np.int32, shape=(1,))],
            config=ModelConfig(max_batch_size=1, decoupled=True),
        )
        yield triton


def test_stock_model_client_over_http_and_grpc(triton, url_of, protocol):
    with stock.ModelClient(url_of(triton, protocol), "AddSub", init_timeout_s=30) as client:
        one = client.infer_sample(np.array([1.0], np.float32), np.array([2.0], np.float32))
        assert one["add"][0] == 3.0 and one["sub"][0] == -1.0
        a = np.arange(4, dtype=np.float32).reshape(4, 1)
        many = client.infer_batch(a=a, b=a)
        np.testing.assert_array_equal(many["add"], a * 2)
        assert client.model_config.max_batch_size == 8


def test_stock_decoupled_client_streams_over_grpc(triton, url_of):
    with stock.DecoupledModelClient(url_of(triton, "grpc"), "Count", init_timeout_s=30) as client:
        got = [int(part["i"][0]) for part in client.infer_sample(np.array([4], np.int32))]
    assert got == [0, 1, 2, 3]
