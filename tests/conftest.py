"""Shared fixtures: one running server with a few models for the fast tests."""

from __future__ import annotations

import numpy as np
import pytest

from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor, batch

F32 = np.float32


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


def add_sub_tensors():
    return (
        [Tensor(name="a", dtype=F32, shape=(1,)), Tensor(name="b", dtype=F32, shape=(1,))],
        [Tensor(name="add", dtype=F32, shape=(1,)), Tensor(name="sub", dtype=F32, shape=(1,))],
    )


def bind_double(server, func, max_batch_size=4):
    """Bind ``func`` as model "Double": FP32 input "x" and output "y", both [-1]."""
    server.bind(
        "Double",
        func,
        [Tensor(name="x", dtype=F32, shape=(-1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,))],
        ModelConfig(max_batch_size=max_batch_size),
    )
    return server.model("Double")


class Counter:
    """A raw callable wrapper that counts the batches and requests it saw."""

    def __init__(self, func):
        self.func = func
        self.batches = 0
        self.requests = 0

    def __call__(self, requests):
        self.batches += 1
        self.requests += len(requests)
        return self.func(requests)


@pytest.fixture(scope="session")
def server():
    srv = Server()
    inputs, outputs = add_sub_tensors()
    srv.bind("AddSub", add_sub, inputs, outputs, ModelConfig(max_batch_size=8))
    with srv:
        yield srv


@pytest.fixture
def add_sub_counted(server):
    """AddSub with a call counter, bound fresh for one test."""
    counter = Counter(add_sub)
    inputs, outputs = add_sub_tensors()
    server.bind(
        "AddSubCounted",
        counter,
        inputs,
        outputs,
        ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=20000)),
    )
    yield server.model("AddSubCounted"), counter
    server.unbind("AddSubCounted")
