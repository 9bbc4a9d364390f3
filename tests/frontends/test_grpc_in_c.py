"""Unary ModelInfer answered in C (native/_native/kserve.c): taken for plain requests on the
native transport, declined otherwise, and answering exactly as the Python path does: the same
status, the same words, the same response bytes."""

from __future__ import annotations

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

from helpers import wait_for  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402

from embedtriton import ModelConfig, Server, Tensor, _native  # noqa: E402
from embedtriton.frontends.grpc.service import Service  # noqa: E402

METHOD = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def served(add_sub, add_sub_tensors):
    def echo(requests):
        return [{"text": r["text"]} for r in requests]

    def fails(requests):
        raise ValueError("no luck")

    def spell(requests):  # numbers in, BYTES out: Triton's serialized strings, encoded in C
        return [{"text": np.array([str(v).encode() * 2 for v in r["x"]], dtype=object)} for r in requests]

    def where(requests):  # how far each input is from its datatype's alignment
        return [{"off": np.array([r["x"].ctypes.data % 8], np.int64)} for r in requests]

    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    server.bind(
        "Echo",
        echo,
        [Tensor(name="text", dtype=np.bytes_, shape=(-1,))],
        [Tensor(name="text", dtype=np.bytes_, shape=(-1,))],
    )
    server.bind(
        "Fails",
        fails,
        [Tensor(name="x", dtype=np.int32, shape=(-1,))],
        [Tensor(name="y", dtype=np.int32, shape=(-1,))],
    )
    server.bind(
        "Spell",
        spell,
        [Tensor(name="x", dtype=np.int32, shape=(-1,))],
        [Tensor(name="text", dtype=np.bytes_, shape=(-1,))],
        ModelConfig(batching=False),
    )
    server.bind(
        "Where",
        where,
        [Tensor(name="x", dtype=np.float64, shape=(-1,))],
        [Tensor(name="off", dtype=np.int64, shape=(1,))],
        ModelConfig(batching=False),
    )
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport="native")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel.unary_unary(METHOD)  # raw bytes in, raw bytes out


def ask(infer, data: bytes):
    """(status code, details, response bytes) of one ModelInfer."""
    try:
        return 0, "", infer(data, timeout=30)
    except grpc.RpcError as exc:
        return exc.code().value[0], exc.details(), b""


def both(infer, data: bytes, monkeypatch):
    """The outcome with the C path, the outcome without it, and whether the C path took it."""
    taken = _native.grpc_stats()[0]
    in_c = ask(infer, data)
    took = _native.grpc_stats()[0] > taken
    with monkeypatch.context() as m:
        m.setattr(Service, "infer_in_c", False)
        in_python = ask(infer, data)
    return in_c, in_python, took


def request(model="AddSub", inputs=None, outputs=(), raw=None, **fields) -> bytes:
    message = service_pb2.ModelInferRequest(model_name=model, **fields)
    one = np.arange(4, dtype=np.float32).reshape(4, 1)
    for name, datatype, shape in inputs if inputs is not None else [("a", "FP32", [4, 1]), ("b", "FP32", [4, 1])]:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
    message.raw_input_contents.extend(raw if raw is not None else [one.tobytes(), (one * 2).tobytes()])
    for name in outputs:
        message.outputs.add(name=name)
    return message.SerializeToString()


def test_plain_requests_are_taken_and_answered_as_the_python_path_does(served, monkeypatch):
    cases = [
        request(),
        request(id="my-id"),
        request(model_version="1"),
        request(outputs=["sub"]),
        request(parameters={"triton_enable_empty_final_response": service_pb2.InferParameter(bool_param=True)}),
        request(outputs=["sub", "add", "sub"]),  # named twice: once, as Triton
        request("Spell", [("x", "INT32", [3])], raw=[np.array([7, -1, 12345], np.int32).tobytes()]),
        request(inputs=[("a", "FP32", [2, 1]), ("b", "FP32", [2, 1])], raw=[b"\0" * 8, b"\0\0\x80?" * 2]),
    ]
    for data in cases:
        in_c, in_python, took = both(served, data, monkeypatch)
        assert took, service_pb2.ModelInferRequest.FromString(data)
        assert in_c == in_python and in_c[0] == 0
    response = service_pb2.ModelInferResponse.FromString(in_c[2])
    assert response.model_version == "1" and [o.name for o in response.outputs] == ["add", "sub"]
    add = np.frombuffer(response.raw_output_contents[0], np.float32)
    assert add.tolist() == [1, 1] and list(response.outputs[0].shape) == [2, 1]


def test_errors_keep_the_python_paths_codes_and_words(served, monkeypatch):
    cases = [
        request(model="Nope"),  # unknown model (declined: no table entry)
        request(model_version="7"),  # a version that is not loaded: Triton's NOT_FOUND
        request(model_version="x"),  # malformed version
        request(inputs=[("a", "FP32", [4, 1])], raw=[b"\0" * 16]),  # a missing input
        request(inputs=[("a", "FP32", [4, 1]), ("c", "FP32", [4, 1])]),  # an unknown input
        request(inputs=[("a", "FP32", [4, 1]), ("b", "FP32", [3, 1])]),  # bytes that do not fill it
        request(inputs=[("a", "FP32", [4, 1]), ("a", "FP32", [4, 1])]),  # named twice
        request(inputs=[("a", "INT32", [4, 1]), ("b", "FP32", [4, 1])]),  # the wrong datatype
        request(inputs=[("a", "FP32", [1, 4]), ("b", "FP32", [1, 4])]),  # the wrong shape
        request(inputs=[("a", "FP32", [16, 1]), ("b", "FP32", [16, 1])], raw=[b"\0" * 64] * 2),  # over max batch
        request(inputs=[("a", "FP32", [0, 1]), ("b", "FP32", [0, 1])], raw=[b"", b""]),  # empty batch
        request("Spell", [("x", "INT32", [0])], raw=[b""]),  # empty, no batch axis: fine (declined)
        request(outputs=["nope"]),  # an unknown output
        request(raw=[b"\0" * 16]),  # fewer raw contents than inputs
        request("Fails", inputs=[("x", "INT32", [1])], raw=[b"\1\0\0\0"]),  # the model raises
        request(parameters={"priority": service_pb2.InferParameter(int64_param=1)}),  # (declined)
        b"\xff\xff",  # not protobuf
    ]
    for data in cases:
        in_c, in_python, _ = both(served, data, monkeypatch)
        assert in_c == in_python


def test_what_it_declines_still_runs_in_python(served, monkeypatch):
    message = service_pb2.ModelInferRequest(model_name="Echo")
    message.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
    message.raw_input_contents.append(b"\5\0\0\0hello")
    declined = _native.grpc_stats()[1]
    in_c, in_python, took = both(served, message.SerializeToString(), monkeypatch)
    assert not took and _native.grpc_stats()[1] > declined
    assert in_c == in_python and in_c[0] == 0
    assert service_pb2.ModelInferResponse.FromString(in_c[2]).raw_output_contents[0] == b"\5\0\0\0hello"


def test_inputs_reach_the_model_aligned(served):
    """An input is read where it lies in the message when aligned for its datatype, else from
    an aligned copy: the model's arrays are aligned either way, as on the Python path."""
    taken = _native.grpc_stats()[0]
    for n in range(16):  # ids of 0 to 15 characters move the raw contents through every offset
        data = request("Where", [("x", "FP64", [3])], raw=[b"\0" * 24], id="i" * n)
        code, _, answer = ask(served, data)
        assert code == 0 and service_pb2.ModelInferResponse.FromString(answer).raw_output_contents[0] == bytes(8)
    assert _native.grpc_stats()[0] - taken == 16


def test_answers_in_c_delete_the_response_where_it_was_sent(served):
    """The reply is encoded on the model's instance thread, inside our backend's send, and the
    response is deleted there at once (its request still holds the model): not left to the
    graveyard for the IO thread to delete later (native/_native/kserve.c, grpc_finish)."""
    before = _native.response_stats()
    for _ in range(20):
        code, _, _ = ask(served, request())
        assert code == 0
    after = _native.response_stats()
    assert after[0] - before[0] == 20 and after[1] == before[1], (before, after)
    code, details, _ = ask(served, request("Fails", [("x", "INT32", [1, 1])], raw=[b"\0" * 4]))
    assert code != 0 and "no luck" in details
    final = _native.response_stats()  # an error's response too: the reply is encoded, then deleted
    assert final[0] - after[0] == 1 and final[1] == after[1], (after, final)


def test_many_concurrent_calls(served):
    from concurrent.futures import ThreadPoolExecutor

    taken = _native.grpc_stats()[0]
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(lambda i: ask(served, request(id=str(i))), range(400)))
    assert all(code == 0 for code, _, _ in outcomes)
    assert [service_pb2.ModelInferResponse.FromString(r).id for _, _, r in outcomes] == [str(i) for i in range(400)]
    assert _native.grpc_stats()[0] - taken == 400


@pytest.fixture(scope="module")
def limited():
    """A server whose messages are capped at 2 KiB and whose responses are compressed."""
    import threading

    gate = threading.Event()
    seen: list[int] = []

    def big(requests):
        return [{"y": np.zeros((int(r["n"][0]),), np.int32)} for r in requests]

    def slow(requests):
        seen.extend(int(r["x"][0]) for r in requests)
        gate.wait(30)
        return [{"y": r["x"]} for r in requests]

    server = Server()
    server.bind(
        "Big",
        big,
        [Tensor(name="n", dtype=np.int32, shape=(1,))],
        [Tensor(name="y", dtype=np.int32, shape=(-1,))],
        ModelConfig(batching=False),
    )
    server.bind(
        "Slow",
        slow,
        [Tensor(name="x", dtype=np.int32, shape=(1,))],
        [Tensor(name="y", dtype=np.int32, shape=(1,))],
        ModelConfig(batching=False),
    )
    with server:
        port = server.serve_grpc(
            "127.0.0.1:0", transport="native", max_message_bytes=2048, infer_response_compression_level="high"
        )
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel.unary_unary(METHOD), gate, seen


def one_int(model: str, name: str, value: int, **fields) -> bytes:
    return request(model, [(name, "INT32", [1])], raw=[np.int32(value).tobytes()], **fields)


def test_message_size_limit_and_compression_as_the_python_path(limited, monkeypatch):
    infer, gate, _ = limited
    gate.set()
    outcomes = []
    for n in (10, 400, 1000):  # 1000 int32: over 2 KiB (the limit is on the uncompressed message)
        in_c, in_python, took = both(infer, one_int("Big", "n", n), monkeypatch)
        assert took and in_c == in_python
        outcomes.append(in_c[:2])
    assert outcomes[:2] == [(0, ""), (0, "")]
    assert outcomes[2] == (
        grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
        "response message larger than max (4027 vs. 2048 bytes)",
    )


def test_a_client_that_leaves_cancels_its_request(limited):
    import threading

    infer, gate, seen = limited
    gate.clear()
    seen.clear()
    first = threading.Thread(target=ask, args=(infer, one_int("Slow", "x", 1)))
    first.start()
    assert wait_for(lambda: seen == [1]), seen  # the instance is busy with the first
    taken = _native.grpc_stats()[0]
    code = None
    try:
        infer(one_int("Slow", "x", 2), timeout=0.5)  # queued behind it, then the client leaves
    except grpc.RpcError as exc:
        code = exc.code()
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and _native.grpc_stats()[0] == taken + 1
    # A barrier: on the same connection, after the reset, the server takes this call only once it has
    # handled the reset (its events are handled in order), which cancels the request in Triton
    assert ask(infer, one_int("Big", "n", 1))[0] == 0
    gate.set()
    first.join(30)
    assert ask(infer, one_int("Slow", "x", 3))[0] == 0  # queued after x=2: had x=2 not been dropped, it ran first
    assert seen == [1, 3]  # Triton dropped the cancelled request before running it


@pytest.mark.parametrize("in_c", [True, False])
def test_stop_with_calls_in_flight_answers_them_as_the_python_path(in_c, monkeypatch):
    """Stopping while calls wait on a slow model (exit_timeout_secs=1): stop() fails each one
    with the same words on either path (UNAVAILABLE); nobody hangs, the server stops."""
    import threading
    import time

    from embedtriton import ServerConfig

    monkeypatch.setattr(Service, "infer_in_c", in_c)
    release = threading.Event()

    def slow(requests):
        release.wait(5)
        return [{"y": r["x"]} for r in requests]

    server = Server(ServerConfig(exit_timeout_secs=1))
    server.bind(
        "Slow",
        slow,
        [Tensor(name="x", dtype=np.int32, shape=(1,))],
        [Tensor(name="y", dtype=np.int32, shape=(1,))],
        ModelConfig(batching=False),
    )
    outcomes: list[tuple[int, str, bytes]] = []
    taken = _native.grpc_stats()[0]
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport="native")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        infer = channel.unary_unary(METHOD)
        data = request("Slow", [("x", "INT32", [1])], raw=[b"\1\0\0\0"])
        threads = [threading.Thread(target=lambda: outcomes.append(ask(infer, data))) for _ in range(3)]
        for t in threads:
            t.start()
        # (asserted once the callers are answered)
        all_in = wait_for(lambda: _native.pending(server._handle)[0] == 3)
        started = time.monotonic()
    release.set()
    for t in threads:
        t.join(30)
    channel.close()
    assert all_in, "the 3 calls were not all in flight before stop()"
    assert time.monotonic() - started < 15
    assert [o[:2] for o in outcomes] == [(14, "the server stopped before this request completed")] * 3
    assert (_native.grpc_stats()[0] - taken == 3) == in_c
