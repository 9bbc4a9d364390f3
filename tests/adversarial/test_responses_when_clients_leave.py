"""Clients that leave mid-request, against the response path: a response is read and deleted on
the model's thread as it is sent (native/_native/outputs.c keep_outputs, kserve.c grpc_finish),
buried for late deletion otherwise. With gRPC clients whose deadlines expire while their
requests wait or run, and in-process callers that give up, every response Triton made is
deleted exactly once (kept or buried: response_stats() accounts for each), nothing is left
hanging, and the server keeps answering."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

from serving import wait_for  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402

from embedtriton import ModelConfig, Server, Tensor, _native  # noqa: E402

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def slowish(requests):
    time.sleep(0.004)  # a few requests finish inside a 10 ms deadline, most queue past it
    return [{"y": r["x"] * 2} for r in requests]


def message(value: int) -> bytes:
    m = service_pb2.ModelInferRequest(model_name="Slowish")
    m.inputs.add(name="x", datatype="INT32", shape=[1, 1])
    m.raw_input_contents.append(np.int32(value).tobytes())
    return m.SerializeToString()


@pytest.fixture(scope="module")
def served():
    server = Server()
    server.bind(
        "Slowish",
        slowish,
        [Tensor(name="x", dtype=np.int32, shape=(1,))],
        [Tensor(name="y", dtype=np.int32, shape=(1,))],
        ModelConfig(max_batch_size=4),
    )
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport="native")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield server, channel.unary_unary(METHOD)


def settled(server, taken_before: int, before: tuple[int, int]) -> tuple[int, int, int]:
    """Once nothing is in flight and every request the C path took has its response deleted
    (or 30 s passed): (requests taken, responses kept, responses buried) since before. A client
    whose deadline expires before the server reads its request is never taken (no response)."""

    def counts() -> tuple[int, int, int]:
        taken = _native.grpc_stats()[0] - taken_before
        kept, buried = (now - then for now, then in zip(_native.response_stats(), before, strict=True))
        return taken, kept, buried

    def done() -> bool:
        taken, kept, buried = counts()
        return _native.pending(server._handle) == (0, 0) and kept + buried == taken

    wait_for(done, 30, every=0.05)  # (what did not settle, the caller's assertions say)
    return counts()


def test_grpc_clients_whose_deadlines_expire_leave_no_response_behind(served):
    server, infer = served
    taken_before, declined_before = _native.grpc_stats()
    before = _native.response_stats()
    futures = [infer.future(message(i), timeout=0.01) for i in range(300)]
    expired = 0
    for f in futures:
        try:
            f.result()
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
            expired += 1
    assert expired > 0, "no deadline expired: the test did not test leaving clients"
    # each request taken ends in exactly one response, answered or cancelled, deleted once
    taken, kept, buried = settled(server, taken_before, before)
    assert taken > 100 and kept + buried == taken, (taken, kept, buried)
    assert _native.grpc_stats()[1] == declined_before
    assert infer(message(21), timeout=30)  # it keeps serving


def test_in_process_callers_that_give_up_leave_no_response_behind(served):
    """asyncio callers cancelled while their requests wait or run: Triton still answers each
    request; the answers nobody takes are deleted too (once)."""
    server, _ = served
    model = server.model("Slowish")
    before = _native.response_stats()

    async def give_up() -> int:
        tasks = [asyncio.ensure_future(model.infer_async({"x": np.full((1, 1), i, np.int32)})) for i in range(100)]
        await asyncio.sleep(0.01)
        for t in tasks[::2]:
            t.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return sum(isinstance(d, dict) for d in done)

    answered = asyncio.run(give_up())
    assert answered >= 50
    assert wait_for(lambda: sum(_native.response_stats()) - sum(before) >= 100, 30, every=0.05), (
        before,
        _native.response_stats(),
    )
    after = _native.response_stats()
    assert sum(after) - sum(before) == 100, (before, after)
    out = model.infer({"x": np.full((1, 1), 5, np.int32)})
    assert out["y"][0, 0] == 10
