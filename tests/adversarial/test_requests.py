"""Hostile ModelInfer requests over gRPC: declared shapes and counts are never trusted, a bad
request fails alone with INVALID_ARGUMENT, and work whose client left is cancelled."""

from __future__ import annotations

import queue
import resource
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

grpcclient = pytest.importorskip("tritonclient.grpc")
grpc = pytest.importorskip("grpc")
from serving import wait_for  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402

from embedtriton import InvalidArgumentError, ModelConfig, Server, Tensor, _native, batch  # noqa: E402

F32 = np.float32


class Slow:
    """A model that takes ``delay`` seconds per batch and counts the requests it ran."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.ran = 0

    def __call__(self, requests):
        self.ran += len(requests)
        time.sleep(self.delay)
        return [{"y": r["x"]} for r in requests]


@pytest.fixture(scope="module")
def endpoint():
    slow = Slow(0.1)
    server = Server()
    x, y = [Tensor(name="x", dtype=F32, shape=(-1,))], [Tensor(name="y", dtype=F32, shape=(-1,))]
    server.bind("Double", batch(lambda x: {"y": x * 2}), x, y, ModelConfig(max_batch_size=8))
    server.bind("Slow", slow, x, y, ModelConfig(max_batch_size=1))
    server.bind(
        "Text",
        batch(lambda t: {"n": np.array([[len(v)] for v in t.reshape(-1)], np.int64)}),
        [Tensor(name="t", dtype=np.bytes_, shape=(-1,))],
        [Tensor(name="n", dtype=np.int64, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        port = server.serve_grpc("127.0.0.1:0")
        yield server, f"127.0.0.1:{port}", slow


def raw_infer(address: str, request: service_pb2.ModelInferRequest, timeout: float = 10) -> grpc.RpcError:
    channel = grpc.insecure_channel(address)
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    try:
        with pytest.raises(grpc.RpcError) as info:
            call(request.SerializeToString(), timeout=timeout)
        return info.value
    finally:
        channel.close()


def double_works(address: str) -> None:
    client = grpcclient.InferenceServerClient(address)
    x = grpcclient.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1, 2]], F32))
    np.testing.assert_array_equal(client.infer("Double", [x]).as_numpy("y"), [[2, 4]])


def test_more_dimensions_than_supported(endpoint):
    _, address, _ = endpoint
    request = service_pb2.ModelInferRequest(model_name="Double")
    request.inputs.add(name="x", datatype="FP32", shape=[1] * 33)
    request.raw_input_contents.append(np.ones(1, F32).tobytes())
    error = raw_infer(address, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "33 dimensions; at most 32" in error.details()
    double_works(address)


def test_a_declared_shape_is_checked_against_the_bytes_sent(endpoint):
    """32 bytes declaring 2**27 BYTES elements: refused at once, nothing allocated for them."""
    _, address, _ = endpoint
    request = service_pb2.ModelInferRequest(model_name="Text")
    request.inputs.add(name="t", datatype="BYTES", shape=[1, 2**27])
    request.raw_input_contents.append(b"\x03\x00\x00\x00abc" * 4 + b"\x00" * 4)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    error = raw_infer(address, request)
    elapsed = time.monotonic() - started
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "each with a 4-byte length" in error.details()
    assert elapsed < 0.5, f"{elapsed:.2f} s: it did work proportional to the declared shape"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100 * 1024  # KiB: no 1 GiB array
    for shape, payload, message in (
        ([1, 1], b"\x05\x00\x00\x00abc", "declares 5 bytes"),  # a length beyond the data
        ([1, 1], b"\x01\x00\x00\x00ab", "left after"),  # bytes after the last element
        ([1, -1], b"", "negative dimension"),
        ([1, 1], b"\x01\x00", "has no 4-byte length|each with a 4-byte length"),
    ):
        request = service_pb2.ModelInferRequest(model_name="Text")
        request.inputs.add(name="t", datatype="BYTES", shape=shape)
        request.raw_input_contents.append(payload)
        error = raw_infer(address, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (shape, error.details())
        assert any(m in error.details() for m in message.split("|")), error.details()
    double_works(address)


@pytest.mark.parametrize(
    "shape,contents",
    [([-2, -2], [1.0, 2.0, 3.0, 4.0]), ([2, -2], [1.0, 2.0, 3.0, 4.0]), ([3], [1.0, 2.0]), ([2**40, 2**40], [1.0])],
)
def test_malformed_typed_contents_are_invalid_argument(endpoint, shape, contents):
    _, address, _ = endpoint
    request = service_pb2.ModelInferRequest(model_name="Double")
    request.inputs.add(name="x", datatype="FP32", shape=shape).contents.fp32_contents.extend(contents)
    error = raw_infer(address, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    double_works(address)


def test_a_bad_request_in_a_stream_fails_alone(endpoint):
    """One malformed request must not end a ModelStreamInfer stream carrying others."""
    _, address, _ = endpoint
    client = grpcclient.InferenceServerClient(address)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        good = grpcclient.InferInput("x", [1, 1], "FP32")
        good.set_data_from_numpy(np.ones((1, 1), F32))
        bad = grpcclient.InferInput("x", [-2, -2], "FP32")
        bad._input.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
        client.async_stream_infer("Double", [good], request_id="1")
        client.async_stream_infer("Double", [bad], request_id="bad")
        client.async_stream_infer("Double", [good], request_id="2")
        outcomes = [results.get(timeout=10) for _ in range(3)]
        errors = [e for _, e in outcomes if e is not None]
        oks = sorted(r.get_response().id for r, e in outcomes if e is None)
        assert oks == ["1", "2"] and len(errors) == 1 and "negative dimension" in str(errors[0])
        client.async_stream_infer("Double", [good], request_id="3")  # the stream is still open
        result, error = results.get(timeout=10)
        assert error is None and result.get_response().id == "3"
    finally:
        client.stop_stream()


def test_cancelled_calls_are_not_run(endpoint):
    """A client that resets its calls (or disconnects) gets them cancelled in Triton: the
    queued ones never reach the model."""
    server, address, slow = endpoint

    def in_flight() -> int:
        return _native.pending(server._handle)[0]

    before = slow.ran
    channel = grpc.insecure_channel(address)
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    request = service_pb2.ModelInferRequest(model_name="Slow")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.ones(1, F32).tobytes())
    futures = [call.future(request.SerializeToString(), timeout=30) for _ in range(20)]
    # all are queued behind the first batch (0.1 s each, one at a time)
    assert wait_for(lambda: in_flight() >= 20), f"{in_flight()} of 20 calls reached Triton"
    for f in futures:
        f.cancel()
    channel.close()
    # nothing left in flight: each call was cancelled, or ran (then within 2 s, and the count below says so)
    assert wait_for(lambda: in_flight() == 0), f"{in_flight()} calls still in flight"
    ran = slow.ran - before
    assert ran <= 4, f"{ran} of 20 cancelled calls still ran"
    # a closed connection cancels too
    channels = [grpc.insecure_channel(address) for _ in range(10)]
    calls = [  # (kept: grpc cancels a call whose future is dropped)
        ch.unary_unary("/inference.GRPCInferenceService/ModelInfer").future(request.SerializeToString(), timeout=30)
        for ch in channels
    ]
    assert wait_for(lambda: in_flight() >= 10), f"{in_flight()} of 10 calls reached Triton"
    before = slow.ran
    for ch in channels:
        ch.close()
    assert wait_for(lambda: in_flight() == 0), f"{in_flight()} calls still in flight"
    assert slow.ran - before <= 3, f"{slow.ran - before} calls of closed connections still ran"
    assert all(c.done() for c in calls)
    double_works(address)


def test_replies_for_clients_that_left_are_dropped_quietly(endpoint, monkeypatch):
    """Replies completed on Triton's thread (the call's target) for clients that already closed
    their connections: each is dropped where it lands, no target raises, and the endpoint
    keeps answering."""
    import sys

    server, address, _ = endpoint
    raised: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: raised.append(f"{u.exc_type.__name__}: {u.exc_value}"))
    request = service_pb2.ModelInferRequest(model_name="Double")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.ones(2, F32).tobytes())
    data = request.SerializeToString()
    for _ in range(5):
        channels = [grpc.insecure_channel(address) for _ in range(20)]
        for channel in channels:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            for _ in range(10):
                infer.future(data, timeout=30)
        for channel in channels:
            channel.close()  # (most replies are still on their way)
    # every reply has landed and Triton let go of every request
    assert wait_for(lambda: _native.pending(server._handle) == (0, 0)), _native.pending(server._handle)
    double_works(address)
    assert raised == []


def test_many_clients_with_bad_requests_do_not_disturb_good_ones(endpoint):
    _, address, _ = endpoint
    failures: list[str] = []

    def bad_client():
        request = service_pb2.ModelInferRequest(model_name="Double")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 2**30])
        request.raw_input_contents.append(b"\x00" * 8)
        for _ in range(20):
            try:
                raw_infer(address, request)
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                failures.append(repr(exc))

    threads = [threading.Thread(target=bad_client) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(20):
        double_works(address)
    for t in threads:
        t.join(timeout=30)
    assert not failures


def test_endpoint_limits_and_shared_memory_off(caplog, tmp_path):
    """serve_grpc(limits=GrpcLimits(...), shared_memory=False) reach the transport and the service."""
    import logging
    import socket

    from embedtriton import GrpcLimits, InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="max_connections"):
        GrpcLimits(max_connections=0)
    with pytest.raises(InvalidArgumentError, match="idle_timeout_s"):
        GrpcLimits(idle_timeout_s=-1)
    server = Server()
    server.bind("Double", batch(lambda x: {"y": x * 2}), [Tensor(name="x", dtype=F32, shape=(-1,))],
                [Tensor(name="y", dtype=F32, shape=(-1,))], ModelConfig(max_batch_size=8))  # fmt: skip
    with server, caplog.at_level(logging.INFO, logger="embedtriton"):
        limits = GrpcLimits(max_connections=2, idle_timeout_s=0.5)
        port = server.serve_grpc("127.0.0.1:0", limits=limits, shared_memory=False)
        assert "gRPC transport: libnghttp2" in caplog.text  # which copy serves is logged
        address = f"127.0.0.1:{port}"
        client = grpcclient.InferenceServerClient(address)
        key = f"/embedtriton-off-{time.monotonic_ns()}"
        with open(f"/dev/shm/{key[1:]}", "wb") as f:
            f.write(b"\0" * 64)
        try:
            with pytest.raises(Exception, match="shared memory is turned off") as info:
                client.register_system_shared_memory("r", key, 64)
            assert "UNIMPLEMENTED" in str(info.value.status())
        finally:
            import os

            os.unlink(f"/dev/shm/{key[1:]}")
        client.close()
        stats = server.endpoint("grpc").stats
        assert wait_for(lambda: stats()["connections"] == 0), stats()  # the client's connection is gone
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
        held = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(preface)
            held.append(s)
            time.sleep(0.1)  # one at a time: a burst accepted in one loop turn refuses its excess instead
        assert wait_for(lambda: stats()["evicted"] == 1), stats()  # the third made room

        def closed(s: socket.socket) -> bool:
            try:
                while s.recv(65536):
                    pass
                return True
            except ConnectionResetError:  # closed with our preface unread
                return True
            except TimeoutError:
                return False

        for s in held:
            s.settimeout(0.1)
        assert [closed(s) for s in held] == [True, False, False]  # at the cap, the third closed the longest idle
        for s in held[1:]:
            s.settimeout(2)
        assert all(closed(s) for s in held[1:])  # then the idle timeout closes the others
        for s in held:
            s.close()
        double_works(address)


INPUT = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "x", "z", ""]),  # repeats, unknown and empty names
        "shape": st.lists(st.integers(-2, 4), max_size=3),
        "typed": st.lists(st.floats(allow_nan=False, width=32), max_size=4) | st.none(),
        "shm": st.booleans(),  # names a region that is not registered
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    inputs=st.lists(INPUT, max_size=4),
    raw=st.lists(st.binary(max_size=24), max_size=5),
    version=st.text(max_size=8) | st.sampled_from(["", "1", "2", "-1", "+1", "1x", "99999999999999999999"]),
)
def test_mixed_input_data_and_versions_fail_alone(endpoint, inputs, raw, version):
    """Any mix of raw, typed and shared-memory inputs, repeated names and version strings gets
    an answer a client can act on (OK, INVALID_ARGUMENT or NOT_FOUND), never an internal error,
    and the endpoint keeps serving."""
    _, address, _ = endpoint
    request = service_pb2.ModelInferRequest(model_name="Double", model_version=version)
    for spec in inputs:
        tensor = request.inputs.add(name=spec["name"], datatype="FP32", shape=spec["shape"])
        if spec["typed"] is not None:
            tensor.contents.fp32_contents.extend(spec["typed"])
        if spec["shm"]:
            tensor.parameters["shared_memory_region"].string_param = "nowhere"
            tensor.parameters["shared_memory_byte_size"].int64_param = 8
    request.raw_input_contents.extend(raw)
    channel = grpc.insecure_channel(address)
    try:
        channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(request.SerializeToString(), timeout=10)
    except grpc.RpcError as error:
        assert error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), error.details()
    finally:
        channel.close()
    double_works(address)


def test_an_empty_batch_is_refused_not_handed_to_the_model(endpoint):
    """A batched model's input with batch size 0 (found by the property test above): Triton
    passes [0, 0] on without a shape; it is refused as the client's mistake, in process too."""
    server, address, _ = endpoint
    request = service_pb2.ModelInferRequest(model_name="Double")
    request.inputs.add(name="x", datatype="FP32", shape=[0, 0])
    error = raw_infer(address, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "input 'x' has batch size 0 for model 'Double'; send at least one row"
    with pytest.raises(InvalidArgumentError, match="input 'x' has batch size 0 for model 'Double'"):
        server.model("Double").infer({"x": np.zeros((0, 0), F32)})
    double_works(address)
