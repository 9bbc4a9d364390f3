"""The HTTP IO thread hands inference requests to the C path in two steps: with the GIL it finds
each one's model and makes its Python objects, then, without it, decodes and submits them all, and
takes the GIL again only for those the C path declined after all (a body it does not take), which
the Python path then answers. Requests the C path takes and declines, mixed on one pipelined
connection and over many, get the same answers, in order, as with the C path off."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

import numpy as np
import pytest
from serving import wait_for

from embedtriton import ModelConfig, Server, Tensor, _native

GOOD = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]}
DECLINED_LATE = [  # the model is in the C path's table; the body is what the C path declines
    {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [1.5, 2]}]},  # Python's words
    {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "INT32", "data": [1, 2]}]},  # shape unfilled
    {"inputs": [{"name": "nope", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]},  # Triton's words
    {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}], "parameters": {"priority": 1}},
]


@pytest.fixture(scope="module")
def served():
    def double(requests):
        return [{"y": r["x"] * 2} for r in requests]

    server = Server()
    server.bind(
        "Double",
        double,
        [Tensor(name="x", dtype=np.int32, shape=(-1,))],
        [Tensor(name="y", dtype=np.int32, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        port = server.serve_http("127.0.0.1:0")
        yield port, server.endpoint("http")


def raw(body: dict, model: str = "Double") -> bytes:
    data = json.dumps(body).encode()
    return b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        model.encode(),
        len(data),
        data,
    )


def answers(port: int, requests: list[bytes]) -> list[tuple[int, bytes]]:
    """The answers to requests sent at once (pipelined) on one connection."""
    got = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"".join(requests))
        buf = b""
        while len(got) < len(requests):
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                assert chunk, f"closed after {len(got)} answers"
                buf += chunk
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = next(
                int(v)
                for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
                if k.lower() == b"content-length"
            )
            while len(buf) < length:
                buf += sock.recv(65536)
            got.append((int(head.split(b" ", 2)[1]), buf[:length]))
            buf = buf[length:]
    return got


def mixed() -> list[bytes]:
    out = []
    for i, bad in enumerate(DECLINED_LATE * 3):
        out.append(raw({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [i, -i]}]}))
        out.append(raw(bad))
    out.append(raw(GOOD, model="Missing"))  # not in the table: declined at the first step
    out.append(raw(GOOD))
    return out


def test_declined_requests_get_the_python_paths_answers_in_order(served):
    port, endpoint = served
    taken, declined = _native.http_stats()
    with_c = answers(port, mixed())
    now_taken, now_declined = _native.http_stats()
    assert now_taken - taken == len(DECLINED_LATE) * 3 + 1  # the good ones
    assert now_declined - declined >= len(DECLINED_LATE) * 3  # the bad ones, declined after the first step
    endpoint.use_c_path(False)
    try:
        without_c = answers(port, mixed())
    finally:
        endpoint.use_c_path(True)
    assert [status for status, _ in with_c] == [status for status, _ in without_c]
    assert [json.loads(body) for _, body in with_c] == [json.loads(body) for _, body in without_c]
    goods = [json.loads(body)["outputs"][0]["data"] for status, body in with_c[0:-2:2]]
    assert goods == [[2 * i, -2 * i] for i in range(len(DECLINED_LATE) * 3)]
    assert [status for status, _ in with_c].count(400) >= len(DECLINED_LATE) * 3 // 2  # (words of the Python path)
    assert with_c[-2][0] == 400 and with_c[-1][0] == 200


def test_many_clients_mixing_taken_and_declined_requests(served):
    port, _ = served
    errors: list[BaseException] = []
    reference = answers(port, mixed())

    def client() -> None:
        try:
            for _ in range(5):
                assert answers(port, mixed()) == reference
        except BaseException as exc:  # (reported by the test's thread)
            errors.append(exc)

    def run_clients() -> None:
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[0]

    run_clients()
    time.sleep(0.2)  # (the baseline once the first round let go of what it held: its count is what we measure)
    refs = sys.getrefcount(served[1])
    run_clients()  # 560 more requests hold nothing once answered
    # (+1: the Python path lets go of its last answered call at a later request, C path or not)
    assert wait_for(lambda: sys.getrefcount(served[1]) <= refs + 1), (sys.getrefcount(served[1]), refs)
