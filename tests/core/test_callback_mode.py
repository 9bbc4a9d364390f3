"""Completions delivered by calling a target: ``Model.submit(request, None, target)`` calls
``target(outputs, None)`` or ``target(None, error)`` exactly once, on the thread that completes
the call (Triton's), and returns at once (a cancel handle when cancellable); a stream without
a loop calls its target each time a response arrives."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from embedtriton import ModelConfig, Server, Tensor, batch
from embedtriton.core import InferRequest
from embedtriton.core.handles import STREAM_END, STREAM_ITEM, Cancel, Stream
from embedtriton.errors import TritonError

F32 = np.float32
X = [Tensor(name="x", dtype=F32, shape=(1,))]
Y = [Tensor(name="y", dtype=F32, shape=(1,))]


def _fails(x):
    raise ValueError("no good")


def _counts(x):
    for i in range(3):
        yield {"y": x + i}


@pytest.fixture(scope="module")
def server():
    srv = Server()
    srv.bind("Double", batch(lambda x: {"y": x * 2}), X, Y, ModelConfig(max_batch_size=8))
    srv.bind("Fails", batch(_fails), X, Y, ModelConfig(max_batch_size=8))
    srv.bind("Counts", batch(_counts), X, Y, ModelConfig(decoupled=True, max_batch_size=8))
    with srv:
        yield srv


class Recorder:
    """A target that records each call (outputs, error, thread)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.called = threading.Event()

    def __call__(self, outputs, error) -> None:
        self.calls.append((outputs, error, threading.get_ident()))
        self.called.set()


def request(v: float) -> InferRequest:
    return InferRequest.from_options({"x": np.full((1, 1), v, F32)}, {})


def test_a_success_calls_the_target_once_with_the_outputs(server):
    target = Recorder()
    assert server.model("Double").submit(request(3.0), None, target) is None  # at once
    assert target.called.wait(10)
    server.model("Double").infer({"x": np.full((1, 1), 1.0, F32)})  # a round trip later: no second call
    [(outputs, error, thread)] = target.calls
    assert error is None
    assert outputs["y"][0, 0] == 6.0
    assert thread != threading.get_ident()  # Triton's thread, not the caller's


def test_an_error_calls_the_target_once_with_the_error(server):
    target = Recorder()
    server.model("Fails").submit(request(1.0), None, target)
    assert target.called.wait(10)
    server.model("Double").infer({"x": np.full((1, 1), 1.0, F32)})
    [(outputs, error, _)] = target.calls
    assert outputs is None
    assert isinstance(error, TritonError)
    assert "no good" in str(error)


def test_many_in_flight_each_complete_once(server):
    targets = [Recorder() for _ in range(200)]
    for i, target in enumerate(targets):
        server.model("Double").submit(request(float(i)), None, target)
    for target in targets:
        assert target.called.wait(10)
    server.model("Double").infer({"x": np.full((1, 1), 1.0, F32)})
    assert [len(t.calls) for t in targets] == [1] * 200
    assert [t.calls[0][0]["y"][0, 0] for t in targets] == [2.0 * i for i in range(200)]


def test_a_cancellable_call_returns_a_cancel_handle(server):
    target = Recorder()
    handle = server.model("Double").submit(request(2.0), None, target, cancellable=True)
    assert isinstance(handle, Cancel)
    assert target.called.wait(10)
    handle.cancel()  # after its completion: nothing happens
    server.model("Double").infer({"x": np.full((1, 1), 1.0, F32)})
    [(outputs, error, _)] = target.calls
    assert error is None and outputs["y"][0, 0] == 4.0


def test_a_target_that_raises_is_reported_and_called_once(server, monkeypatch):
    calls, reported = [], []
    failed = threading.Event()
    monkeypatch.setattr("sys.unraisablehook", lambda unraisable: reported.append(unraisable.exc_value))

    def target(outputs, error):
        calls.append((outputs, error))
        failed.set()
        raise RuntimeError("the target's own bug")

    server.model("Double").submit(request(1.0), None, target)
    assert failed.wait(10)
    assert server.model("Double").infer({"x": np.full((1, 1), 5.0, F32)})["y"][0, 0] == 10.0
    assert len(calls) == 1
    assert [str(e) for e in reported] == ["the target's own bug"]


def test_a_stream_without_a_loop_calls_its_target_as_responses_arrive(server):
    parts, ended = [], threading.Event()
    state: dict = {}
    lock = threading.Lock()

    def wake() -> None:  # on Triton's thread, with the GIL
        handle = state.get("handle")
        if handle is None:
            return  # before submit returned: read below
        with lock:
            while True:
                status, outputs = handle.next(False)
                if status == STREAM_ITEM:
                    parts.append(float(outputs["y"][0, 0]))
                    continue
                if status == STREAM_END:
                    ended.set()
                return

    handle = server.model("Counts").submit(request(10.0), None, wake, True)
    assert isinstance(handle, Stream)
    state["handle"] = handle
    wake()
    assert ended.wait(10)
    handle.close()
    assert parts == [10.0, 11.0, 12.0]


def test_a_callable_may_submit_with_a_target_on_its_own_model_and_loop(server):
    """A call completed through a target does not wait: an async def callable (on its event
    loop) and a sync callable (on its own model) may submit one; a blocking call is refused."""
    srv = Server()
    seen: list = []

    async def forwards(x):
        done = threading.Event()
        srv.model("Double2").submit(
            request(float(x[0, 0])), None, lambda out, err: (seen.append((out, err)), done.set())
        )
        with pytest.raises(TritonError, match="blocking call from an async def callable"):
            srv.model("Double2").infer({"x": x})
        return {"y": x}

    srv.bind("Double2", batch(lambda x: {"y": x * 2}), X, Y, ModelConfig(max_batch_size=8))
    srv.bind("Forwards", batch(forwards), X, Y, ModelConfig(max_batch_size=8))
    with srv:
        srv.model("Forwards").infer({"x": np.full((1, 1), 4.0, F32)})
        for _ in range(100):
            if seen:
                break
            threading.Event().wait(0.05)
    [(outputs, error)] = seen
    assert error is None and outputs["y"][0, 0] == 8.0
