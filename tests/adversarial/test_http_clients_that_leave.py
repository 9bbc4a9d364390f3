"""HTTP/REST clients that leave before their answer: the inference they asked for is cancelled
in Triton (a queued request never reaches the model), on each of the endpoint's three ways to
/infer: the C path, the Python path on the IO thread, and the asyncio route (a compressed body).
A client that closes, one that resets, and one that only shuts its sending side (which still
reads an answer) all count as gone, as Go's net/http and nginx take them. Nothing is leaked: the
calls let go of the server, and the endpoint keeps answering."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import struct
import sys
import threading
import time

import numpy as np
import pytest
from serving import wait_for

from embedtriton import ModelConfig, Server, Tensor, _native

I32 = np.int32


@pytest.fixture(scope="module")
def served():
    """A model with one instance and no batching that records each x it runs and blocks on a gate."""
    gate = threading.Event()
    seen: list[int] = []

    def slow(requests):
        seen.extend(int(r["x"][0]) for r in requests)
        gate.wait(30)
        return [{"y": r["x"]} for r in requests]

    server = Server()
    server.bind(
        "Slow",
        slow,
        [Tensor(name="x", dtype=I32, shape=(1,))],
        [Tensor(name="y", dtype=I32, shape=(1,))],
        ModelConfig(batching=False),
    )
    with server:
        port = server.serve_http("127.0.0.1:0")
        yield port, server.endpoint("http"), gate, seen, lambda: _native.pending(server._handle)[0]


def body(x: int) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [x]}]}).encode()


def request(x: int, compressed: bool = False) -> bytes:
    data = gzip.compress(body(x)) if compressed else body(x)
    extra = b"Content-Encoding: gzip\r\n" if compressed else b""
    return b"POST /v2/models/Slow/infer HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (
        extra,
        len(data),
        data,
    )


def post(port: int, x: int) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v2/models/Slow/infer", body(x))
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def live(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/v2/health/live")
        return conn.getresponse().status
    finally:
        conn.close()


def leave(port: int, data: bytes, how: str, queued) -> bytes:
    """Send data, then go: "close", "reset" (RST), or "shut" (shut the sending side and read
    what comes back). ``queued()``: whether the request reached Triton's queue."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(data)
        # (the request reaches Triton's queue, behind the busy instance)
        assert wait_for(queued), "the request never reached Triton"
        if how == "reset":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif how == "shut":
            s.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)
        return b""
    finally:
        s.close()


def busy(port: int, gate: threading.Event, seen: list[int]) -> threading.Thread:
    """The instance runs x=1 (blocked on the gate) from a client that stays."""
    gate.clear()
    seen.clear()
    first = threading.Thread(target=post, args=(port, 1))
    first.start()
    assert wait_for(lambda: seen == [1])
    return first


@pytest.mark.parametrize("route", ["c", "python", "asyncio"])
@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_client_that_leaves_cancels_its_queued_request(served, route, how):
    port, endpoint, gate, seen, in_flight = served
    endpoint.use_c_path(route == "c")
    try:
        first = busy(port, gate, seen)
        taken = _native.http_stats()[0]
        threads = [
            threading.Thread(target=leave, args=(port, request(x, route == "asyncio"), how, lambda: in_flight() >= 3))
            for x in (2, 3)
        ]  # (each waits for both: x=1 runs, x=2 and x=3 queue)
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert (_native.http_stats()[0] - taken == 2) == (route == "c")  # (each went the way named)
        # The IO thread cancels their calls in Triton first thing in a dispatch, before it hands on a request that
        # came later (the barrier below): for a close, in the loop turn that reads the end; for a reset, in the turn
        # after the one that closes the connection (then only the busy client's is open)
        if how == "reset":
            assert wait_for(lambda: endpoint.stats()["connections"] == 1), endpoint.stats()
        assert live(port) == 200
        gate.set()
        first.join(30)
        assert post(port, 4) == (200, post_answer(4))  # still serving: the next client is answered
        assert seen == [1, 4]  # the two whose clients left never ran
    finally:
        gate.set()
        endpoint.use_c_path(True)


def post_answer(x: int) -> bytes:
    outputs = [{"name": "y", "datatype": "INT32", "shape": [1], "data": [x]}]
    return json.dumps({"model_name": "Slow", "model_version": "1", "outputs": outputs}).encode()


def test_a_client_that_shuts_its_sending_side_reads_the_same_answer_on_every_route(served):
    """A client that shut its sending side is taken as gone too: its queued request is cancelled,
    and the answer it still reads is the cancellation, worded alike on the three routes."""
    port, endpoint, gate, seen, in_flight = served
    answers = []
    for route in ("c", "python", "asyncio"):
        endpoint.use_c_path(route == "c")
        try:
            first = busy(port, gate, seen)
            threading.Timer(0.5, gate.set).start()  # (a cancelled request leaves the queue once x=1 is done)
            got = leave(port, request(2, route == "asyncio"), "shut", lambda: in_flight() >= 2)
            first.join(30)
        finally:
            gate.set()
            endpoint.use_c_path(True)
        assert seen == [1]
        head, _, rest = got.partition(b"\r\n\r\n")
        answers.append((head.split(b"\r\n")[0], json.loads(rest)))
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][0] == b"HTTP/1.1 400 Bad Request" and "cancelled" in answers[0][1]["error"].lower()


def test_clients_that_leave_let_go_of_everything(served):
    """Many clients leaving mid-request, on both paths: every call lets go of the server (no cycle
    through the cancel hook is left), answers are complete for those that stay."""
    port, endpoint, gate, _, _ = served
    gate.set()
    http_server = endpoint._http
    before = sys.getrefcount(http_server)
    for in_c in (True, False):
        endpoint.use_c_path(in_c)
        try:
            for round_ in range(3):
                sockets = []
                for x in range(30):
                    s = socket.create_connection(("127.0.0.1", port), timeout=30)
                    s.sendall(request(x) * 3)
                    sockets.append(s)
                for s in sockets:
                    s.close()
                assert post(port, round_) == (200, post_answer(round_))
        finally:
            endpoint.use_c_path(True)
    assert wait_for(lambda: sys.getrefcount(http_server) <= before), (sys.getrefcount(http_server), before)


def test_clients_that_leave_as_their_answers_are_written(served):
    """Clients that close while the model's thread answers them: the IO thread closing a connection
    races the thread that queues its answer. Under ASan (nox -s tests-asan) this found the answer
    putting a connection back on the list of those to write after its close had taken it off, and
    then freed it (http1_conn.c h1_close detaches its requests first now)."""
    port, endpoint, gate, _, _ = served
    gate.set()
    rng = np.random.default_rng(7)
    for in_c in (True, False):
        endpoint.use_c_path(in_c)
        try:
            for round_ in range(40):
                sockets = []
                for x in range(16):
                    s = socket.create_connection(("127.0.0.1", port), timeout=30)
                    s.sendall(request(x) * 2)
                    sockets.append(s)
                time.sleep(float(rng.uniform(0, 0.003)))  # (closes spread over the answers' writing)
                for s in sockets:
                    if rng.random() < 0.5:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                if round_ % 10 == 9:
                    assert post(port, round_) == (200, post_answer(round_))
        finally:
            endpoint.use_c_path(True)
    assert post(port, 99) == (200, post_answer(99))
