"""A plain call's response, sent by our backend, is read into one block on the model's instance
thread and deleted there at once (native/_native/outputs.c, keep_outputs): Triton's response
objects are freed by the thread whose malloc arena they came from, instead of 20 ms later by the
caller. These tests pin which responses take that path (response_stats() counts them) and that
their outputs reach every kind of caller intact: small outputs copied, larger buffers taken
over, BYTES decoded; what it buys is measured by benchmarks/bench_floor.py."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from embedtriton import ModelConfig, Server, Step, Tensor, batch
from embedtriton._native import response_stats
from embedtriton.core.request import InferRequest
from embedtriton.errors import TritonError

F32 = np.float32
SMALL, LARGE = 4, 300  # float32 elements: 16 bytes (copied) and 1,200 bytes (taken over)


def compute(x, word):
    words = np.array([[w[0] * 2, w[0] * 200] for w in word], dtype=object)
    return {
        "small": x[:, :SMALL] + 1,
        "large": np.repeat(x[:, :1], LARGE, axis=1) * 2,
        "count": np.full((len(x), 1), x.shape[1], np.int64),
        "words": words,
    }


mixed = batch(compute)
mixed_plain = batch(lambda x, word: {k: v[0] for k, v in compute(x[None], word[None]).items()})


@batch
def failing(x, word):
    raise ValueError("no")


TENSORS = (
    [Tensor(name="x", dtype=F32, shape=(-1,)), Tensor(name="word", dtype=bytes, shape=(1,))],
    [
        Tensor(name="small", dtype=F32, shape=(SMALL,)),
        Tensor(name="large", dtype=F32, shape=(LARGE,)),
        Tensor(name="count", dtype=np.int64, shape=(1,)),
        Tensor(name="words", dtype=bytes, shape=(2,)),
    ],
)


@pytest.fixture(scope="module")
def srv():
    s = Server()
    s.bind("Mixed", mixed, *TENSORS, ModelConfig(max_batch_size=8))
    s.bind("MixedPlain", mixed_plain, *TENSORS, ModelConfig(batching=False))
    s.bind("Failing", failing, *TENSORS, ModelConfig(max_batch_size=8))
    s.bind(
        "Empty",
        batch(lambda x: {"y": x[:, :0], "z": x[:, :0].astype(object)}),
        [Tensor(name="x", dtype=F32, shape=(-1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,)), Tensor(name="z", dtype=bytes, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )
    s.bind_ensemble(  # its last step's send completes the ensemble's response too
        "Twice",
        [Step("Mixed", {"x": "X", "word": "W"}, {"small": "S", "large": "L"})],
        [Tensor(name="X", dtype=F32, shape=(-1,)), Tensor(name="W", dtype=bytes, shape=(1,))],
        [Tensor(name="S", dtype=F32, shape=(SMALL,)), Tensor(name="L", dtype=F32, shape=(LARGE,))],
        ModelConfig(max_batch_size=8),
    )
    with s:
        yield s


def inputs_for(i: int, batched: bool = True) -> dict:
    x = np.arange(i, i + SMALL + 2, dtype=F32)
    word = np.array([b"w%d" % i], dtype=object)
    return {"x": x[None], "word": word[None]} if batched else {"x": x, "word": word}


def check(out: dict, i: int, batched: bool = True) -> None:
    lead = (1,) if batched else ()
    x = np.arange(i, i + SMALL + 2, dtype=F32)
    np.testing.assert_array_equal(out["small"], (x[:SMALL] + 1).reshape(lead + (SMALL,)))
    np.testing.assert_array_equal(out["large"], np.full(lead + (LARGE,), 2 * x[0], F32))
    np.testing.assert_array_equal(out["count"], np.full(lead + (1,), SMALL + 2, np.int64))
    word = b"w%d" % i
    assert out["words"].reshape(-1).tolist() == [word * 2, word * 200]
    for name in ("small", "large", "count"):
        assert out[name].flags.writeable and out[name].flags.c_contiguous


def test_sync_calls_are_kept_and_complete(srv):
    for name, batched in (("Mixed", True), ("MixedPlain", False)):
        model = srv.model(name)
        before = response_stats()
        outs = [model.infer(inputs_for(i, batched)) for i in range(50)]
        after = response_stats()
        assert after[0] - before[0] == 50, (name, before, after)
        assert after[1] == before[1], "a kept response was buried too"
        for i, out in enumerate(outs):
            check(out, i, batched)


def test_outputs_are_the_callers_own(srv):
    """Each call's arrays are its own memory: writing one changes no other (copied outputs
    come from a block that is freed, taken-over ones from buffers no one else holds)."""
    model = srv.model("Mixed")
    a, b = model.infer(inputs_for(1)), model.infer(inputs_for(1))
    for name in ("small", "large", "count"):
        a[name][...] = 0
        assert not np.shares_memory(a[name], b[name])
    check(b, 1)
    del a  # its taken-over buffer is freed with the array
    check(model.infer(inputs_for(2)), 2)


def test_many_async_and_callbacks_are_kept(srv):
    model = srv.model("Mixed")
    before = response_stats()
    outs = model.infer_many([inputs_for(i) for i in range(200)], max_in_flight=16)
    for i, out in enumerate(outs):
        check(out, i)

    async def many() -> list:
        return await asyncio.gather(*(model.infer_async(inputs_for(i)) for i in range(40)))

    for i, out in enumerate(asyncio.run(many())):
        check(out, i)
    got: dict[int, dict] = {}
    done = threading.Event()

    def target(i):
        def call(outputs, error):
            got[i] = outputs if error is None else error
            if len(got) == 10:
                done.set()

        return call

    for i in range(10):
        model.submit(InferRequest.from_options(inputs_for(i), {}), None, target(i))
    assert done.wait(30)
    for i in range(10):
        check(got[i], i)
    assert response_stats()[0] - before[0] == 250


def test_errors_and_callers_buffers_keep_the_response(srv):
    """An error response, and outputs written into the caller's own buffers, stay in Triton's
    response (buried, deleted late): the path only takes responses it can read in full."""
    before = response_stats()
    with pytest.raises(TritonError, match="no"):
        srv.model("Failing").infer(inputs_for(0))
    small = np.empty((1, SMALL), F32)
    out = srv.model("Mixed").submit(InferRequest(inputs_for(3), outputs={"small": small, "large": None}))
    np.testing.assert_array_equal(small, out["small"])
    np.testing.assert_array_equal(out["small"], (np.arange(3, 3 + SMALL, dtype=F32) + 1)[None])
    after = response_stats()
    assert after[0] == before[0] and after[1] - before[1] == 2, (before, after)


def test_an_ensembles_response_completed_by_its_last_step_is_kept_too(srv):
    """An ensemble's response reaches our callback inside its last step's send: the ensemble's
    own request is released only after it (Triton's EnsembleContext::FinishEnsemble), so it is
    read and deleted there as well, and its outputs are intact."""
    before = response_stats()
    for i in range(5):
        out = srv.model("Twice").infer({"X": inputs_for(i)["x"], "W": inputs_for(i)["word"]})
        np.testing.assert_array_equal(out["S"], (np.arange(i, i + SMALL, dtype=F32) + 1)[None])
        np.testing.assert_array_equal(out["L"], np.full((1, LARGE), 2.0 * i, F32))
    after = response_stats()
    assert after[0] - before[0] == 5 and after[1] == before[1], (before, after)


def test_empty_outputs_are_kept_as_empty_arrays(srv):
    before = response_stats()
    out = srv.model("Empty").infer({"x": np.ones((1, 3), F32)})
    assert out["y"].shape == (1, 0) and out["y"].dtype == F32
    assert out["z"].shape == (1, 0)
    assert response_stats()[0] - before[0] == 1
