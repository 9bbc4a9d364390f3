"""Shared fixtures for every tier (unit, core, frontends, adversarial).

The helpers are fixtures, not importable names: a test takes ``add_sub``, ``add_sub_tensors``,
``bind_double`` or ``counter`` as a parameter. They are session-scoped, so module- and
session-scoped fixtures can use them too. Building one of them starts nothing: only the
``server`` fixture (and ``add_sub_counted`` on top of it) runs Triton.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor, batch

F32 = np.float32


@batch
def _add_sub(a, b):
    return {"add": a + b, "sub": a - b}


def _bind_double(server, func, max_batch_size=4):
    """Bind ``func`` as model "Double": FP32 input "x" and output "y", both [-1]."""
    server.bind(
        "Double",
        func,
        [Tensor(name="x", dtype=F32, shape=(-1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,))],
        ModelConfig(max_batch_size=max_batch_size),
    )
    return server.model("Double")


class _Counter:
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
def add_sub():
    """The AddSub model function (``@batch``): FP32 "a", "b" -> "add" = a + b, "sub" = a - b."""
    return _add_sub


@pytest.fixture(scope="session")
def add_sub_tensors():
    """AddSub's ``(inputs, outputs)``: FP32 "a", "b" -> "add", "sub", each of shape (1,).
    Tuples, so no test can change them for the next: ``server.bind(name, f, *add_sub_tensors)``."""
    return (
        (Tensor(name="a", dtype=F32, shape=(1,)), Tensor(name="b", dtype=F32, shape=(1,))),
        (Tensor(name="add", dtype=F32, shape=(1,)), Tensor(name="sub", dtype=F32, shape=(1,))),
    )


@pytest.fixture(scope="session")
def bind_double():
    """``bind_double(server, func, max_batch_size=4)``: binds ``func`` as model "Double"
    (FP32 input "x" and output "y", both [-1]) and returns its Model."""
    return _bind_double


@pytest.fixture(scope="session")
def counter():
    """The class ``Counter(func)``: a raw callable wrapper counting its ``batches`` and ``requests``."""
    return _Counter


@pytest.fixture(scope="session")
def server(add_sub, add_sub_tensors):
    """One running server with model "AddSub" (max_batch_size 8), shared by the session."""
    srv = Server()
    srv.bind("AddSub", add_sub, *add_sub_tensors, ModelConfig(max_batch_size=8))
    with srv:
        yield srv


@pytest.fixture
def add_sub_counted(server, add_sub, add_sub_tensors, counter):
    """AddSub with a call counter, bound fresh for one test: ``(model, counter)``."""
    counted = counter(add_sub)
    server.bind(
        "AddSubCounted",
        counted,
        *add_sub_tensors,
        ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=20000)),
    )
    yield server.model("AddSubCounted"), counted
    server.unbind("AddSubCounted")


@pytest.fixture
def own_process(request):
    """For a test that starts a server with a response cache. Triton keeps one cache per process,
    and a stopped server is deleted only once no other runs (the session's ``server`` does), so
    such a test runs again in a fresh process: True there (run the test body), False here once
    that run passed (the body returns at once)."""
    if os.environ.get("EMBEDTRITON_OWN_PROCESS") == request.node.nodeid:
        return True
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--timeout",
            "120",
            f"{request.config.rootpath}/{request.node.nodeid}",
        ],
        cwd=tempfile.gettempdir(),  # (not the source tree: the installed package is imported)
        env={**os.environ, "EMBEDTRITON_OWN_PROCESS": request.node.nodeid},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    return False
