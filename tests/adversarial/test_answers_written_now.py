"""Answers of the C path written by the thread that made them (Triton's), not the IO thread: an
HTTP/1.1 answer that is its connection's next one goes to the socket at once, and a gRPC answer is
written while the IO thread sleeps in epoll_wait. What the socket does not take (a client that
reads slowly) is left to the IO thread, answers stay in request order on a pipelined connection,
a client that is gone by then costs nothing but its connection, and the counters
(``written_now``) show that this path, not the IO thread's, wrote them."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serving import wait_for

from embedtriton import ModelConfig, Server, Tensor

F32 = np.float32
BIG = 1 << 20  # elements of the large answer: 4 MiB of FP32, more than a socket buffer takes at once


@pytest.fixture(scope="module")
def served():
    """``Echo`` answers its input; ``Big`` answers n (a [1] INT32) with n float32 values."""

    def echo(requests):
        return [{"y": r["x"]} for r in requests]

    def big(requests):
        return [{"y": np.arange(int(r["n"][0]), dtype=F32)} for r in requests]

    def slow(requests):
        time.sleep(0.02)  # (the IO thread is surely back in epoll_wait when the answer comes)
        return [{"y": r["x"]} for r in requests]

    server = Server()
    server.bind(
        "Echo",
        echo,
        [Tensor(name="x", dtype=F32, shape=(-1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,))],
        ModelConfig(batching=False),
    )
    server.bind(
        "Big",
        big,
        [Tensor(name="n", dtype=np.int32, shape=(1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,))],
        ModelConfig(batching=False),
    )
    server.bind(
        "Slow",
        slow,
        [Tensor(name="x", dtype=F32, shape=(-1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,))],
        ModelConfig(batching=False),
    )
    with server:
        http_port = server.serve_http("127.0.0.1:0")
        grpc_port = server.serve_grpc("127.0.0.1:0")
        yield server, http_port, grpc_port


def echo_request(values: list[float]) -> bytes:
    body = json.dumps({"inputs": [{"name": "x", "shape": [len(values)], "datatype": "FP32", "data": values}]})
    return b"POST /v2/models/Echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body.encode(),
    )


def big_request(n: int) -> bytes:
    body = json.dumps({"inputs": [{"name": "n", "shape": [1], "datatype": "INT32", "data": [n]}]})
    return b"POST /v2/models/Big/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body.encode(),
    )


def read_answer(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """One HTTP/1.1 answer (status, body) from sock; what follows it stays in buf."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed mid-answer: {bytes(buf[:200])!r}"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(1 << 20)
        assert chunk, "the connection closed mid-body"
        rest += chunk
    del buf[:]
    buf += rest[length:]
    return int(head.split(b" ", 2)[1]), rest[:length]


def http_stats(server: Server) -> dict:
    return server.endpoint("http").stats()


def test_http_answers_on_a_keep_alive_connection_are_written_by_tritons_thread(served):
    server, port, _ = served
    before = http_stats(server)["written_now"]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        buf = bytearray()
        for i in range(20):
            sock.sendall(echo_request([float(i), 0.5]))
            status, body = read_answer(sock, buf)
            assert status == 200, body
            assert json.loads(body)["outputs"][0]["data"] == [float(i), 0.5]
    # Each answer is its connection's next one, with nothing else being written: Triton's thread
    # writes it, unless the IO thread has not yet retired the one before (a loaded machine).
    assert http_stats(server)["written_now"] - before >= 15


def test_http_pipelined_answers_stay_in_request_order(served):
    _, port, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"".join(echo_request([float(i)]) for i in range(30)))
        buf = bytearray()
        got = [json.loads(read_answer(sock, buf)[1])["outputs"][0]["data"] for _ in range(30)]
    assert got == [[float(i)] for i in range(30)]


def test_http_a_large_answer_to_a_slow_reader_is_finished_by_the_io_thread(served):
    server, port, _ = served
    before = http_stats(server)["written_now"]
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(big_request(BIG))
        # the answer is made while nobody reads: the socket takes part of it, the rest waits for the IO thread
        assert wait_for(lambda: http_stats(server)["buffered_bytes"] > 0), http_stats(server)
        buf = bytearray()
        status, body = read_answer(sock, buf)
        assert status == 200
        # then the connection serves on
        sock.sendall(echo_request([7.0]))
        assert json.loads(read_answer(sock, buf)[1])["outputs"][0]["data"] == [7.0]
    answer = json.loads(body)
    assert answer["outputs"][0]["shape"] == [BIG]
    assert answer["outputs"][0]["data"][-3:] == [BIG - 3.0, BIG - 2.0, BIG - 1.0]
    assert http_stats(server)["written_now"] - before >= 1  # the large answer's start
    assert http_stats(server)["buffered_bytes"] == 0


def test_http_clients_gone_before_their_answer_leave_the_server_serving(served):
    server, port, _ = served
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.sendall(big_request(1 << 16))
        sock.close()  # a reset: the answer's write fails, or finds the connection closed
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(echo_request([1.0]))
        assert json.loads(read_answer(sock, bytearray())[1])["outputs"][0]["data"] == [1.0]
    assert wait_for(lambda: http_stats(server)["connections"] == 0)
    assert http_stats(server)["buffered_bytes"] == 0


def grpc_written_now(server: Server) -> int:
    return server.endpoint("grpc").stats()["written_now"]


def test_grpc_answers_are_written_while_the_io_thread_sleeps(served):
    server, _, port = served
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        for model in ("Echo", "Slow"):
            before = grpc_written_now(server)
            for i in range(10):
                x = np.array([i, 0.25], dtype=F32)
                inp = grpcclient.InferInput("x", [2], "FP32")
                inp.set_data_from_numpy(x)
                result = client.infer(model, [inp])
                np.testing.assert_array_equal(result.as_numpy("y"), x)
        # (Echo's answers may come while the IO thread is still awake: then it writes them itself)
        assert grpc_written_now(server) - before == 10  # Slow's, all written by Triton's thread
        # a large answer: more than the connection's flow-control window takes at once
        n = grpcclient.InferInput("n", [1], "INT32")
        n.set_data_from_numpy(np.array([BIG], dtype=np.int32))
        y = client.infer("Big", [n]).as_numpy("y")
        np.testing.assert_array_equal(y, np.arange(BIG, dtype=F32))
    finally:
        client.close()
