"""Ray Serve replicas that each embed Triton (embedtriton.ray), on a local Ray instance
started here: requests spread over two replicas and Triton batches inside each; Triton's
KServe-v2 REST answers over Ray Serve's HTTP proxy (stock tritonclient.http); a replica that
dies is replaced by Ray and its callers' retries lose no request. Skips where Ray is not
installed or cannot start."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import wait_for

import embedtriton
from embedtriton import ModelConfig, Server, Tensor, batch

ray = pytest.importorskip("ray", reason='Ray Serve is not installed (pip install "embedtriton[ray]")')
serve = pytest.importorskip("ray.serve")


@batch
def scale(x):
    time.sleep(0.005)  # per call: batching pays
    return {"y": x * 2}


def count(requests):
    """Decoupled: n responses 0..n-1 for each request."""
    for step in range(max(int(r["n"][0, 0]) for r in requests)):
        yield [{"i": np.array([[step]], np.int32)} if step < int(r["n"][0, 0]) else None for r in requests]


def bind(server: Server) -> None:
    server.bind("Scale", scale, [Tensor(name="x", dtype=np.float32, shape=(4,))],
                [Tensor(name="y", dtype=np.float32, shape=(4,))], ModelConfig(max_batch_size=32))  # fmt: skip
    server.bind("Count", count, [Tensor(name="n", dtype=np.int32, shape=(1,))],
                [Tensor(name="i", dtype=np.int32, shape=(1,))], ModelConfig(decoupled=True))  # fmt: skip


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from ray import cloudpickle

    from embedtriton.ray import triton_app

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # (the replicas cannot import this test module)
    # Ray puts the current directory first on its workers' sys.path: not the checkout (its
    # embedtriton/ would shadow the installed package; see the next test)
    was = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("ray"))
    try:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    except Exception as exc:  # no Ray on this machine: say why
        pytest.skip(f"Ray cannot start here: {exc}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        handle = serve.run(
            triton_app(bind, num_replicas=2, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=16,
                       health_check_period_s=1),
            name="triton", route_prefix="/",
        )  # fmt: skip
        yield handle, port
    finally:
        serve.shutdown()
        ray.shutdown()
        os.chdir(was)


def replicas(handle, count: int) -> dict[str, dict]:
    from embedtriton.ray import replica_reports

    return {info["replica"]: info for info in replica_reports(handle, count)}


async def send(handle, xs: list[np.ndarray], callers: int) -> list[object]:
    """Each request's outputs, or the error it raised."""
    results: list[object] = [None] * len(xs)

    async def caller(k: int) -> None:
        for i in range(k, len(xs), callers):
            try:
                results[i] = (await handle.infer.remote("Scale", {"x": xs[i]}))["y"]
            except Exception as exc:
                results[i] = exc

    await asyncio.wait_for(asyncio.gather(*(caller(k) for k in range(callers))), timeout=120)
    return results


def test_requests_spread_over_replicas_and_triton_batches_in_each(app):
    handle, _ = app
    before = {r: i["models"]["Scale"]["inference_count"] for r, i in replicas(handle, 2).items()}
    xs = [np.full((1, 4), i, np.float32) for i in range(600)]
    results = asyncio.run(send(handle, xs, 48))
    assert all(np.array_equal(y, x * 2) for x, y in zip(xs, results, strict=True))
    after = replicas(handle, 2)
    assert len(after) == 2
    took = {r: i["models"]["Scale"]["inference_count"] - before.get(r, 0) for r, i in after.items()}
    assert sum(took.values()) == 600 and min(took.values()) >= 60, took  # both replicas served
    for info in after.values():
        stats = info["models"]["Scale"]
        assert stats["execution_count"] < stats["inference_count"]  # Triton batched inside the replica
        assert max(b["batch_size"] for b in stats["batch_stats"]) > 1
    assert len({i["pid"] for i in after.values()}) == 2  # two processes, two embedded Tritons


def test_a_decoupled_model_streams_through_a_streaming_handle(app):
    handle, _ = app

    async def parts(n: int) -> list[int]:
        stream = handle.options(stream=True).stream.remote("Count", {"n": np.array([[n]], np.int32)})
        return [int(p["i"][0, 0]) async for p in stream]

    async def both() -> list[list[int]]:
        return await asyncio.gather(parts(3), parts(5))

    assert asyncio.run(both()) == [[0, 1, 2], [0, 1, 2, 3, 4]]


def test_triton_rest_over_ray_serve_http_with_the_stock_client(app):
    import tritonclient.http as httpclient

    _, port = app
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    assert client.is_server_ready() and client.is_model_ready("Scale")
    assert client.get_model_metadata("Scale")["inputs"][0]["shape"] == [-1, 4]
    for binary in (False, True):
        x = httpclient.InferInput("x", [2, 4], "FP32")
        x.set_data_from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4), binary_data=binary)
        out = httpclient.InferRequestedOutput("y", binary_data=binary)
        result = client.infer("Scale", [x], outputs=[out])
        np.testing.assert_array_equal(result.as_numpy("y"), np.arange(8, dtype=np.float32).reshape(2, 4) * 2)
    with pytest.raises(Exception, match="unknown model: 'Nope' is not found"):  # Triton's error, via Ray
        client.get_model_metadata("Nope")
    client.close()


def test_a_replica_that_dies_is_replaced_and_retries_lose_nothing(app):
    handle, _ = app
    first = replicas(handle, 2)
    victim = next(iter(first.values()))
    xs = [np.full((1, 4), i, np.float32) for i in range(300)]

    async def with_a_kill() -> list[object]:
        sending = asyncio.ensure_future(send(handle, xs, 32))
        await asyncio.sleep(0.3)
        assert not sending.done()  # killed with requests in flight
        os.kill(victim["pid"], signal.SIGKILL)
        return await sending

    results = asyncio.run(with_a_kill())
    failed = [i for i, r in enumerate(results) if isinstance(r, Exception)]
    for i in failed:  # every failure is raised to its caller (Ray's actor-died errors), none hangs
        assert isinstance(results[i], ray.exceptions.RayError), repr(results[i])
    deadline = time.monotonic() + 60
    while failed and time.monotonic() < deadline:  # the callers retry, as Ray Serve documents
        retried = asyncio.run(send(handle, [xs[i] for i in failed], 8))
        for i, r in zip(list(failed), retried, strict=True):
            if not isinstance(r, Exception):
                results[i] = r
                failed.remove(i)
    assert not failed
    assert all(np.array_equal(y, x * 2) for x, y in zip(xs, results, strict=True))
    # Ray replaced the replica: two again, one a new process
    replaced = wait_for(
        lambda: victim["pid"] not in {i["pid"] for i in replicas(handle, 2).values()},
        max(deadline - time.monotonic(), 0.0),
        every=0.5,
    )
    assert replaced, "Ray did not replace the killed replica within 60 s"


def test_starting_ray_from_the_source_checkout_says_so(monkeypatch):
    from embedtriton.errors import UnavailableError
    from embedtriton.ray import triton_app

    checkout = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(checkout)
    if (checkout / "embedtriton").resolve() == Path(embedtriton.__file__).resolve().parent:
        pytest.skip("embedtriton is installed in place (pip install -e .): the checkout is the package")
    with pytest.raises(UnavailableError, match="would shadow the installed package"):
        triton_app(bind)


def test_a_replica_outside_ray_serves_and_stops_its_triton_on_shutdown():
    """The replica class itself: the handle's methods, the HTTP answer (a Starlette request
    as Ray's proxy hands it over), the health check, and ``__del__`` (what Ray Serve calls on
    shutdown) draining and stopping the embedded server."""
    from starlette.requests import Request

    from embedtriton.errors import UnavailableError
    from embedtriton.ray import TritonDeployment

    replica = TritonDeployment(bind)
    x = np.ones((1, 4), np.float32)
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'

    async def calls():
        y = (await replica.infer("Scale", {"x": x}))["y"]
        scope = {"type": "http", "method": "POST", "path": "/v2/models/Scale/infer", "root_path": "",
                 "query_string": b"", "headers": [(b"content-type", b"application/json")]}  # fmt: skip
        sent = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            return sent.pop(0)

        answer = await replica(Request(scope, receive))
        return y, answer

    y, answer = asyncio.run(calls())
    np.testing.assert_array_equal(y, x * 2)
    assert answer.status_code == 200 and b'"data": [2.0, 4.0, 6.0, 8.0]' in answer.body

    info = asyncio.run(replica.replica())
    assert info["requests"] == 1 and info["models"]["Scale"]["inference_count"] == 2 and info["replica"] is None

    async def post(replica: TritonDeployment, data: bytes):
        scope = {"type": "http", "method": "POST", "path": "/v2/models/Scale/infer", "root_path": "",
                 "query_string": b"", "headers": []}  # fmt: skip
        sent = [{"type": "http.request", "body": data, "more_body": False}]

        async def receive():
            return sent.pop(0)

        return await replica(Request(scope, receive))

    small = TritonDeployment(bind, max_body_bytes=32)  # hostile bodies: refused, the replica keeps serving
    try:
        too_big = asyncio.run(post(small, body))
        assert too_big.status_code == 413 and b"over the limit of 32 bytes" in too_big.body
        malformed = asyncio.run(post(replica, b'{"inputs": [{"name": "x", "shape": [1, 4]'))
        assert malformed.status_code == 400 and b"malformed JSON" in malformed.body
        assert asyncio.run(post(replica, body)).status_code == 200
    finally:
        small.__del__()
    replica.check_health()
    server = replica.server
    replica.__del__()
    assert not server.ready
    with pytest.raises(UnavailableError):
        replica.check_health()
