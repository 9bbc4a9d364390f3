"""Compressed gRPC messages on the KServe-v2 endpoint: compressed requests from the stock
tritonclient (``compression_algorithm=``, ``-C`` in its examples) on both transports, and
compressed inference responses with ``infer_response_compression_level`` (Triton's
``--grpc-infer-response-compression-level``), checked on the wire with a bare HTTP/2 client."""

from __future__ import annotations

import asyncio
import gzip
import queue
import socket
import threading
import zlib

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
grpc = pytest.importorskip("grpc")
h2_config = pytest.importorskip("h2.config")
import h2.connection  # noqa: E402
import h2.events  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402

from embedtriton import ModelConfig, Server  # noqa: E402
from embedtriton.frontends.grpc.transport import GrpcioHandler  # noqa: E402

KSERVE = "/inference.GRPCInferenceService/"
ACCEPT_ALL = [(b"grpc-accept-encoding", b"identity,deflate,gzip")]  # what grpc-core clients send


@pytest.fixture
def serve(add_sub, add_sub_tensors, bind_double):
    """serve(transport, level="none") -> the address of a fresh server with AddSub and Double."""
    servers = []

    def make(transport, level="none"):
        server = Server()
        server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
        bind_double(server, lambda requests: [{"y": r["x"] * 2} for r in requests])
        server.start()
        servers.append(server)
        port = server.serve_grpc("127.0.0.1:0", transport=transport, infer_response_compression_level=level)
        return f"127.0.0.1:{port}", port

    yield make
    for server in servers:
        server.stop()


def add_sub_inputs(a, b):
    inputs = [grpcclient.InferInput("a", list(a.shape), "FP32"), grpcclient.InferInput("b", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def double_input(x):
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def check_stock_client(address, algorithm=None):
    """Unary and streaming inference through tritonclient, compressing its requests with ``algorithm``."""
    client = grpcclient.InferenceServerClient(address)
    a, b = np.array([[1.0], [2.0]], np.float32), np.array([[0.5], [4.0]], np.float32)
    result = client.infer("AddSub", add_sub_inputs(a, b), compression_algorithm=algorithm)
    assert np.array_equal(result.as_numpy("add"), a + b) and np.array_equal(result.as_numpy("sub"), a - b)
    x = np.tile(np.arange(1000, dtype=np.float32), 100).reshape(1, -1)  # 400 KB, compressible
    assert np.array_equal(client.infer("Double", double_input(x), compression_algorithm=algorithm).as_numpy("y"), 2 * x)
    results: queue.Queue = queue.Queue()
    client.start_stream(lambda result, error: results.put((result, error)), compression_algorithm=algorithm)
    try:
        for i in range(3):
            client.async_stream_infer("AddSub", add_sub_inputs(a * i, b), request_id=str(i))
        for _ in range(3):
            result, error = results.get(timeout=10)
            assert error is None, error
            i = int(result.get_response().id)
            assert np.array_equal(result.as_numpy("add"), a * i + b)
    finally:
        client.stop_stream()
    client.close()


@pytest.mark.parametrize("transport", ["native", "grpcio"])
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_from_the_stock_client(serve, transport, algorithm):
    """tritonclient's compressed requests (unary and streaming) are answered as plain ones are."""
    address, _ = serve(transport)
    check_stock_client(address, algorithm)


@pytest.mark.parametrize("transport", ["native", "grpcio"])
@pytest.mark.parametrize("level", ["low", "high"])
def test_compressed_responses_reach_the_stock_client(serve, transport, level):
    """With a response compression level, tritonclient (which accepts gzip and deflate) decodes every answer, with
    its requests compressed or not."""
    address, _ = serve(transport, level)
    check_stock_client(address)
    check_stock_client(address, "gzip")


def raw_call(port, method, body, headers=(), flag=0):
    """One gRPC call with one request message (its flag: 1 when ``body`` is compressed) over a bare
    HTTP/2 connection: (response headers, [(flag, payload), ...], trailers)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = h2.connection.H2Connection(h2_config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    request = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"localhost"), (b":path", method.encode())]
    conn.send_headers(sid, [*request, (b"content-type", b"application/grpc"), (b"te", b"trailers"), *headers])
    conn.send_data(sid, bytes([flag]) + len(body).to_bytes(4, "big") + body, end_stream=True)  # within one frame
    sock.sendall(conn.data_to_send())
    response, trailers, data, ended = {}, {}, b"", False
    while not ended:
        received = sock.recv(1 << 20)
        assert received, "the server closed the connection"
        for event in conn.receive_data(received):
            if isinstance(event, h2.events.ResponseReceived):
                response = dict(event.headers)
            elif isinstance(event, h2.events.TrailersReceived):
                trailers = dict(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                data += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, sid)
            elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                ended = True
        sock.sendall(conn.data_to_send())
    sock.close()
    messages = []
    while data:
        size = int.from_bytes(data[1:5], "big")
        messages.append((data[0], data[5 : 5 + size]))
        data = data[5 + size :]
    return response, messages, trailers


X = np.zeros((1, 2048), np.float32)  # 8 KiB of zeros each way: compresses well
DOUBLE = service_pb2.ModelInferRequest(model_name="Double", id="d")
DOUBLE.inputs.add(name="x", datatype="FP32", shape=X.shape)
DOUBLE.raw_input_contents.append(X.tobytes())


def decompress(encoding, flag, payload):
    if flag == 0:
        return payload
    return {"gzip": gzip.decompress, "deflate": zlib.decompress}[encoding.decode()](payload)


def check_infer_response(headers, messages, trailers, stream=False):
    """One answer to DOUBLE: returns (grpc-encoding or None, the message's flag)."""
    assert trailers.get(b"grpc-status", headers.get(b"grpc-status")) == b"0", (headers, trailers)
    [(flag, payload)] = messages
    encoding = headers.get(b"grpc-encoding")
    data = decompress(encoding, flag, payload)
    if stream:
        response = service_pb2.ModelStreamInferResponse.FromString(data).infer_response
    else:
        response = service_pb2.ModelInferResponse.FromString(data)
    assert response.id == "d" and response.raw_output_contents[0] == X.tobytes()
    return encoding, flag


@pytest.mark.parametrize(
    "level, accepted, expected",
    [
        ("low", b"identity,deflate,gzip", b"gzip"),  # grpc-core's order: gzip, deflate; low takes the first
        ("medium", b"identity,deflate,gzip", b"deflate"),  # the middle one: [gzip, deflate][2 // 2]
        ("high", b"identity, deflate, gzip", b"deflate"),  # the last
        ("high", b"identity,gzip", b"gzip"),  # only those the client accepts
        ("medium", b"deflate", b"deflate"),
        ("low", b"identity", None),  # none it accepts: uncompressed
        ("high", None, None),  # no grpc-accept-encoding: identity only, as grpc-core reads it
        ("none", b"identity,deflate,gzip", None),
    ],
)
def test_inference_responses_compressed_per_level(serve, level, accepted, expected):
    """ModelInfer and ModelStreamInfer answers carry the algorithm grpc-core would pick for the level among those the
    client accepts (grpc-encoding, and the compressed flag on the message); other methods' answers are never
    compressed."""
    _, port = serve("native", level)
    headers = [(b"grpc-accept-encoding", accepted)] if accepted else []
    body = DOUBLE.SerializeToString()
    compressed = (expected, 1) if expected else (None, 0)
    assert check_infer_response(*raw_call(port, KSERVE + "ModelInfer", body, headers)) == compressed
    assert check_infer_response(*raw_call(port, KSERVE + "ModelStreamInfer", body, headers), stream=True) == compressed
    answer = raw_call(port, KSERVE + "ModelInfer", gzip.compress(body), [*headers, (b"grpc-encoding", b"gzip")], 1)
    assert check_infer_response(*answer) == compressed  # whatever the request's own encoding
    for method, request in [
        ("ModelMetadata", service_pb2.ModelMetadataRequest(name="Double")),
        ("ModelConfig", service_pb2.ModelConfigRequest(name="Double")),
        ("ServerMetadata", service_pb2.ServerMetadataRequest()),
    ]:
        response, messages, _ = raw_call(port, KSERVE + method, request.SerializeToString(), headers)
        assert b"grpc-encoding" not in response and [flag for flag, _ in messages] == [0], method


def test_errors_and_incompressible_answers(serve):
    """A failed inference is a plain Trailers-Only answer; an answer that compression does not make smaller goes
    uncompressed (flag 0) under the call's grpc-encoding, as grpc-core sends it."""
    _, port = serve("native", "low")
    bad = service_pb2.ModelInferRequest(model_name="Nope").SerializeToString()
    response, messages, _ = raw_call(port, KSERVE + "ModelInfer", bad, ACCEPT_ALL)
    assert response[b"grpc-status"] != b"0" and messages == [] and b"grpc-encoding" not in response
    rng = np.random.default_rng(0)  # random floats whose doubles are random too (exponents 1..253): incompressible
    bits = rng.integers(0, 1 << 32, 2048, dtype=np.uint32) & 0x807FFFFF | rng.integers(1, 254, 2048, np.uint32) << 23
    x = bits.view(np.float32).reshape(1, -1)
    request = service_pb2.ModelInferRequest(model_name="Double", id="n")
    request.inputs.add(name="x", datatype="FP32", shape=x.shape)
    request.raw_input_contents.append(x.tobytes())
    response, [(flag, payload)], _ = raw_call(port, KSERVE + "ModelInfer", request.SerializeToString(), ACCEPT_ALL)
    assert response[b"grpc-encoding"] == b"gzip" and flag == 0
    assert service_pb2.ModelInferResponse.FromString(payload).raw_output_contents[0] == (2 * x).tobytes()


def test_grpcio_transport_compresses_inference_responses(serve):
    """On grpcio, grpc-core applies the level (it keeps the client's grpc-accept-encoding from the service)."""
    _, port = serve("grpcio", "low")
    answer = raw_call(port, KSERVE + "ModelInfer", DOUBLE.SerializeToString(), ACCEPT_ALL)
    assert check_infer_response(*answer) == (b"gzip", 1)
    answer = raw_call(port, KSERVE + "ModelInfer", DOUBLE.SerializeToString())
    assert check_infer_response(*answer) == (None, 0)


def test_grpcio_call_set_compression():
    """The grpcio adapter's Call.set_compression(), the service's per-call choice on the native transport, works
    there too: before the first send() from the handler, the replies go compressed."""

    class Zip:
        def on_message(self, call, data):
            call.user = data

        def on_half_close(self, call):
            with pytest.raises(ValueError):
                call.set_compression("br")
            call.set_compression("deflate")
            call.send(call.user)
            call.finish(0)

        def on_cancel(self, call):
            pass

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([GrpcioHandler(Zip())])
        return server, server.add_insecure_port("127.0.0.1:0")

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        response, [(flag, payload)], trailers = raw_call(port, "/x.Y/Zip", bytes(1000))
        assert response[b"grpc-encoding"] == b"deflate" and flag == 1 and zlib.decompress(payload) == bytes(1000)
        assert trailers[b"grpc-status"] == b"0"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
