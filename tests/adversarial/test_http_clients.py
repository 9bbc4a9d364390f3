"""Hostile HTTP clients: a request stalled mid-body, too many connections, idle connections.
Each is bounded, and the endpoint keeps serving the others meanwhile."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

pytest.importorskip("httptools")

from embedtriton import ModelConfig, Server, Tensor, batch  # noqa: E402

F32 = np.float32


@pytest.fixture(scope="module")
def port():
    server = Server()
    server.bind(
        "Double",
        batch(lambda x: {"y": x * 2}),
        [Tensor(name="x", dtype=F32, shape=(1,))],
        [Tensor(name="y", dtype=F32, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        yield server.serve_http("127.0.0.1:0", max_connections=4, idle_timeout_s=1.0, request_timeout_s=0.5)


def live(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n")
        return s.recv(4096)


def test_a_request_stalled_mid_body_gets_408_while_others_are_served(port):
    stalled = socket.create_connection(("127.0.0.1", port), timeout=5)
    stalled.sendall(b'POST /v2/models/Double/infer HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"inputs"')
    assert live(port).startswith(b"HTTP/1.1 200")  # served meanwhile
    started = time.monotonic()
    answer = stalled.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout_s" in answer
    assert time.monotonic() - started < 2
    assert stalled.recv(4096) == b""  # and closed
    stalled.close()


def test_connections_over_the_limit_are_closed_and_idle_ones_time_out(port):
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
    time.sleep(0.1)
    extra = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert extra.recv(4096) == b""  # over max_connections: closed at once
    extra.close()
    time.sleep(1.5)  # idle_timeout_s: the held ones are closed
    assert all(s.recv(4096) == b"" for s in held)
    for s in held:
        s.close()
    assert live(port).startswith(b"HTTP/1.1 200")  # room again
