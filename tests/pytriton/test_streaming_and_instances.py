"""PyTriton's decoupled (streaming) example, a callable object whose ``@batch`` method is a
generator, read with DecoupledModelClient (and the asyncio one) over gRPC; and its
multi-instance binding, a list of callables, each one an instance."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from embedtriton.pytriton.client import (
    AsyncioDecoupledModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from embedtriton.pytriton.decorators import batch
from embedtriton.pytriton.exceptions import PyTritonClientInferenceServerError, PyTritonClientValueError
from embedtriton.pytriton.model_config import DeviceKind, DynamicBatcher, ModelConfig, Tensor
from embedtriton.pytriton.triton import Triton


class StreamingBot:
    """Answers a prompt word by word (the chat history, an optional input, is echoed first)."""

    @batch
    def __call__(self, new_inputs, chat_history=None):
        prompt = new_inputs[0, 0].decode()
        words = ([f"[{chat_history[0, 0].decode()}]"] if chat_history is not None else []) + prompt.split()
        for word in words:
            yield {"response": np.char.encode([[word]], "utf-8")}  # with the batch axis, as declared


class Instance:
    """One of several instances: it says which one it is, and checks it is never run twice at once."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.running = 0
        self.overlapped = False

    @batch
    def __call__(self, x):
        self.running += 1
        self.overlapped |= self.running > 1
        time.sleep(0.02)
        self.running -= 1
        return {"instance": np.full((len(x), 1), self.index, np.int32), "y": x * 2}


INSTANCES = [Instance(0), Instance(1)]


@pytest.fixture(scope="module")
def triton(local_config):
    with Triton(config=local_config()) as triton:
        triton.bind(
            model_name="DialoBot",
            infer_func=StreamingBot(),
            inputs=[
                Tensor(name="new_inputs", dtype=bytes, shape=(1,)),
                Tensor(name="chat_history", optional=True, dtype=bytes, shape=(1,)),
            ],
            outputs=[Tensor(name="response", dtype=bytes, shape=(1,))],
            config=ModelConfig(decoupled=True),
            strict=True,
        )
        triton.bind(
            model_name="TwoInstances",
            infer_func=INSTANCES,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
            outputs=[
                Tensor(name="instance", dtype=np.int32, shape=(1,)),
                Tensor(name="y", dtype=np.float32, shape=(1,)),
            ],
            config=ModelConfig(max_batch_size=4, batcher=DynamicBatcher()),
        )
        yield triton


def test_decoupled_client_streams_each_response(triton, url_of):
    with DecoupledModelClient(url_of(triton, "grpc"), "DialoBot", init_timeout_s=10) as client:
        words = [r["response"][0] for r in client.infer_sample(new_inputs=np.array([b"does money buy"]))]
        assert words == [b"does", b"money", b"buy"]
        with_history = [
            r["response"][0]
            for r in client.infer_sample(new_inputs=np.array([b"hello there"]), chat_history=np.array([b"hi"]))
        ]
        assert with_history == [b"[hi]", b"hello", b"there"]


def test_asyncio_decoupled_client(triton, url_of):
    async def main():
        async with AsyncioDecoupledModelClient(url_of(triton, "grpc"), "DialoBot") as client:
            return [r["response"][0] async for r in client.infer_sample(new_inputs=np.array([b"a b c d"]))]

    assert asyncio.run(main()) == [b"a", b"b", b"c", b"d"]


def test_decoupled_needs_grpc_and_its_own_client(triton, url_of):
    with pytest.raises(PyTritonClientValueError, match="grpc"):
        DecoupledModelClient(url_of(triton, "http"), "DialoBot")
    with ModelClient(url_of(triton, "grpc"), "DialoBot") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="DecoupledModelClient"):
            client.infer_sample(new_inputs=np.array([b"x"]))
    with DecoupledModelClient(url_of(triton, "grpc"), "TwoInstances") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="coupled"):
            list(client.infer_sample(x=np.ones(1, np.float32)))


def test_a_list_of_callables_is_one_instance_each(triton, url_of, protocol):
    with ModelClient(url_of(triton, protocol), "TwoInstances") as client:
        assert client.model_config.instance_group == {DeviceKind.KIND_CPU: 2}
    with FuturesModelClient(url_of(triton, protocol), "TwoInstances", max_workers=8) as client:
        futures = [client.infer_sample(x=np.array([float(i)], np.float32)) for i in range(64)]
        results = [f.result(timeout=60) for f in futures]
    assert [r["y"][0] for r in results] == [2.0 * i for i in range(64)]
    assert {int(r["instance"][0]) for r in results} == {0, 1}  # both instances served
    assert not any(i.overlapped for i in INSTANCES)  # each callable used by one thread at a time


def test_streaming_in_process_too(triton):
    parts = list(triton.server.model("DialoBot").stream({"new_inputs": np.array([[b"x y"]], dtype=object)}))
    assert [p["response"][0, 0] for p in parts] == [b"x", b"y"]


def test_instances_run_concurrently(triton):
    """Two instances take two batches at once: 8 single-row calls of 20 ms each take well under
    8 x 20 ms when two run in parallel."""
    model = triton.server.model("TwoInstances")
    start = time.monotonic()
    threads = [threading.Thread(target=model.infer, args=({"x": np.ones((4, 1), np.float32)},)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - start < 8 * 0.02 * 0.9
