"""Asyncio completions handed to an event loop in bulk: completions that arrive while the
loop has not yet run the previous hand-over join it (the loop's mailbox), so one wake-up of
the loop resolves the completions of many batches."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import _native

F32 = np.float32


def pair(i: float) -> dict[str, np.ndarray]:
    return {"a": np.full((1, 1), i, F32), "b": np.full((1, 1), 1.0, F32)}


def test_asyncio_completions_of_many_batches_reach_the_loop(add_sub_counted):
    """Completions arriving while the loop has not yet run the previous hand-over join it
    (the loop's mailbox); none is lost and none is resolved twice."""
    model, counted = add_sub_counted

    async def go() -> list[float]:
        futures = [model.infer_async(pair(i)) for i in range(500)]
        time.sleep(0.05)  # the loop is busy: completions pile up for it meanwhile
        return [float(r["add"][0, 0]) for r in await asyncio.gather(*futures)]

    for _ in range(3):  # a new loop each time: a mailbox never outlives its loop
        assert asyncio.run(go()) == [i + 1.0 for i in range(500)]


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_completions_for_a_closed_loop_are_dropped(server):
    """A loop closed with calls still in flight: their completions are freed quietly (nobody
    waits for them: no unraisable error), the server keeps serving and other loops keep working."""
    model = server.model("AddSub")
    loop = asyncio.new_event_loop()

    async def submit_and_leave() -> None:
        for i in range(50):
            model.infer_async(pair(i))  # never awaited

    loop.run_until_complete(submit_and_leave())
    loop.close()
    # their completions come (and are dropped) while this test runs
    assert wait_for(lambda: _native.pending(server._handle) == (0, 0)), _native.pending(server._handle)

    async def one() -> dict:
        return await asyncio.wait_for(model.infer_async(pair(3)), 10)

    assert asyncio.run(one())["add"][0, 0] == 4.0
    assert model.infer(pair(1))["add"][0, 0] == 2.0
