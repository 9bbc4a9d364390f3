"""The REST endpoint's HTTP/1.1 parser (C, ``embedtriton._h2.HttpServer``) against hostile and odd
clients, over raw sockets: requests split at every byte, oversized lines, headers and bodies, bad
Content-Length, pipelined floods answered in order, HTTP/1.0 and ``Connection: close``, slowloris,
and property-based garbage that never crashes it (a fresh client is served after each)."""

from __future__ import annotations

import json
import re
import socket
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import read_all, wait_for

from embedtriton import ModelConfig, Server, Tensor, batch

F32 = np.float32
MAX_HEADER = 1024
MAX_BODY = 4096


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
        yield server.serve_http(
            "127.0.0.1:0",
            max_header_bytes=MAX_HEADER,
            max_body_bytes=MAX_BODY,
            request_timeout_s=0.5,
            idle_timeout_s=5.0,
        )


def infer_request(value: float = 1.0, request_id: str = "", extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [value]}]}
    if request_id:
        body["id"] = request_id
    data = json.dumps(body).encode()
    return b"POST /v2/models/Double/infer HTTP/%s\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (
        version, extra, len(data), data
    )  # fmt: skip


def exchange(port: int, data: bytes, shut: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        return read_all(s)


def answers(data: bytes) -> list[tuple[int, bytes]]:
    """The (status, body) of each answer in ``data`` (Content-Length framed)."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, data[:200]
        status = int(head.split(b" ", 2)[1])
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        out.append((status, rest[:length]))
        data = rest[length:]
    return out


def live(port: int) -> bool:
    return exchange(port, b"GET /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200")


def test_a_request_split_at_every_byte(port):
    request = infer_request(3.0)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for cut in range(1, len(request)):
            s.sendall(request[:cut])
            time.sleep(0.002)
            s.sendall(request[cut:])
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(4096)
            head, _, body = head.partition(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
            while len(body) < length:
                body += s.recv(4096)
            assert head.startswith(b"HTTP/1.1 200"), (cut, head)
            assert json.loads(body)["outputs"][0]["data"] == [6.0]


def test_one_byte_at_a_time(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in infer_request(2.0, extra=b"Connection: close\r\n"):
            s.sendall(bytes([byte]))
        ((status, body),) = answers(read_all(s))
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [4.0]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /" + b"a" * (MAX_HEADER + 1) + b" HTTP/1.1\r\n\r\n",  # the URL counts
        b"GET / HTTP/1.1\r\nX: " + b"v" * (MAX_HEADER + 1) + b"\r\n\r\n",  # one large value
        b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: vvvvvvvvvv\r\n" % i for i in range(200)) + b"\r\n",  # many fields
    ],
    ids=["url", "value", "fields"],
)
def test_oversized_heads_get_431(port, request_bytes):
    answer = exchange(port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
    assert b"request headers over the limit of 1024 bytes" in answer and b"Connection: close" in answer
    assert live(port)


def test_an_endless_header_line_gets_431_before_it_ends(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nX: " + b"v" * (4 * MAX_HEADER))  # no end of line, and the client keeps it open
        assert s.recv(4096).startswith(b"HTTP/1.1 431")


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut"])
def test_a_long_line_gets_the_same_answer_however_it_arrives(port, cut):
    """A line longer than a line may be (max_header_bytes + 256) with a bad byte in it: the server
    refuses it before it ends (431) when it arrives in pieces, so it must do so when it arrives whole
    too, not look at its bytes first (400). Found by the http1_conn fuzz target, which sends every
    input cut and whole (tests/fuzz/corpus/http1_conn/regress-line-limit)."""
    line = b"X: " + b"\0" * (MAX_HEADER + 300) + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        if cut:
            s.sendall(b"GET / HTTP/1.1\r\n" + line[: MAX_HEADER + 280])
            time.sleep(0.2)  # (the server reads the first piece alone: no counter shows a line half read)
            try:
                s.sendall(line[MAX_HEADER + 280 :])
            except OSError:  # (refused and closed already)
                pass
        else:
            s.sendall(b"GET / HTTP/1.1\r\n" + line)
        answer = read_all(s)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
    assert live(port)


# HttpOptions: the head as received may take max_header_bytes + 4 * min(max_header_bytes, 4096) + 512 bytes
RAW_HEAD_LIMIT = MAX_HEADER + 4 * MAX_HEADER + 512


@pytest.mark.parametrize("partial", [False, True], ids=["lines", "partial-line"])
def test_a_head_padded_with_spaces_gets_431_once_past_its_raw_limit(port, partial):
    """Lines of spaces count next to nothing against max_header_bytes (names and trimmed values:
    5 bytes a line here), but the head as received is bounded too: the client that sent just past
    RAW_HEAD_LIMIT bytes of it, whole lines or ending in a partial one, and waits, gets 431 at once
    (before, it was read on and on: 8 clients made a server hold 44 MB)."""
    line = b"X-Pad:" + b" " * 1000 + b"\r\n"
    head = b"GET /v2/health/live HTTP/1.1\r\n"
    while len(head) + len(line) <= RAW_HEAD_LIMIT:
        head += line
    head += line[: RAW_HEAD_LIMIT + 1 - len(head)] if partial else line
    assert RAW_HEAD_LIMIT < len(head) <= RAW_HEAD_LIMIT + len(line)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)  # and nothing more: the connection stays open
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
    assert b"request headers over the limit of 1024 bytes" in answer and b"Connection: close" in answer
    assert live(port)


@pytest.mark.parametrize("method", [b"GET", b"M" * 400], ids=["GET", "long-method"])
def test_the_largest_heads_within_max_header_bytes_pass_the_raw_limit(port, method):
    """The raw limit leaves room for the framing of every head within max_header_bytes: here the
    most fields it allows (1009 of them with a one-byte name and no value, ``X: `` and CRLF, 5 bytes
    as sent for 1 counted; with the URL, 1024 counted), with a long method too."""
    url = b"/v2/health/live"
    head = method + b" " + url + b" HTTP/1.1\r\n" + b"X: \r\n" * (MAX_HEADER - len(url)) + b"\r\n"
    assert len(head) <= RAW_HEAD_LIMIT
    answer = exchange(port, head)
    assert answer.startswith(b"HTTP/1.1 ") and not answer.startswith(b"HTTP/1.1 431"), answer[:200]
    if method == b"GET":
        assert answer.startswith(b"HTTP/1.1 200")
    assert exchange(port, head.replace(url, url + b"x", 1)).startswith(b"HTTP/1.1 431")  # (a byte more is over)


def test_an_oversized_body_gets_413_before_it_is_sent(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v2/models/Double/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413") and b"request body over the limit of 4096 bytes" in answer


def test_a_client_still_sending_a_refused_body_reads_the_refusal(port):
    """A client that sends a body the server refuses (413) in one go, as most clients do, before it
    reads: the server answers, shuts its side and reads the rest of the body into nothing until the
    client closes (a lingering close). Closed with those bytes unread, its close would be a reset:
    the client's send fails, or the reset destroys the 413 before the client reads it."""
    head = b"POST /v2/models/Double/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (8 << 20)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(head + b"x" * (8 << 20))  # (a reset would fail this)
            answer = read_all(s)  # (ends at the server's FIN)
        assert answer.startswith(b"HTTP/1.1 413") and b"request body over the limit of 4096 bytes" in answer
    assert live(port)


@pytest.mark.parametrize(
    "fields, status",
    [
        (b"Content-Length: abc\r\n", 400),
        (b"Content-Length: -1\r\n", 400),
        (b"Content-Length: 1 2\r\n", 400),
        (b"Content-Length: \r\n", 400),
        (b"Content-Length: 2\r\nContent-Length: 2\r\n", 400),
        (b"Content-Length: 99999999999999999999999999\r\n", 413),
        (b"Transfer-Encoding: chunked\r\n", 411),
        (b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", 411),
    ],
)
def test_bad_content_lengths(port, fields, status):
    answer = exchange(port, b"POST /v2/models/Double/infer HTTP/1.1\r\n" + fields + b"\r\n{}")
    assert answer.startswith(b"HTTP/1.1 %d" % status), answer[:200]
    assert "error" in json.loads(answer.partition(b"\r\n\r\n")[2])
    assert live(port)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",  # obsolete line folding
        b"GET / HTTP/1.1\r\nX : a\r\n\r\n",  # space before the colon
        b"GET / HTTP/1.1\r\n: a\r\n\r\n",  # no name
        b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",  # NUL in a value
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET /\r\n\r\n",
        b"G(T / HTTP/1.1\r\n\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\rX: a\r\n\r\n",  # a bare CR
    ],
)
def test_malformed_heads_get_400(port, request_bytes):
    answer = exchange(port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"malformed HTTP request" in answer
    assert live(port)


def test_bare_line_feeds_and_leading_empty_lines_are_accepted(port):
    answer = exchange(port, b"\r\n\r\nGET /v2/health/live HTTP/1.1\nHost: x\n\nGET /v2/health/ready HTTP/1.1\n\n")
    assert [status for status, _ in answers(answer)] == [200, 200]


def test_a_pipelined_flood_is_answered_whole_and_in_order(port):
    count = 300
    flood = b"".join(infer_request(float(i), request_id=f"r{i}") for i in range(count))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(flood + b"GET /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n")
        got = answers(read_all(s, 30))
    assert len(got) == count + 1
    ids = [json.loads(body)["id"] for _, body in got[:count]]
    assert ids == [f"r{i}" for i in range(count)]
    assert [json.loads(body)["outputs"][0]["data"][0] for _, body in got[:count]] == [2.0 * i for i in range(count)]


def test_http_1_0_closes_unless_asked_to_keep_alive(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        answer = read_all(s)  # closed after one answer
    assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        first = s.recv(4096)
        assert first.startswith(b"HTTP/1.1 200") and b"Connection: close" not in first
        s.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        assert read_all(s).startswith(b"HTTP/1.1 200")


def test_nothing_after_connection_close_is_answered(port):
    data = (
        b"GET /v2/health/live HTTP/1.1\r\n\r\n"
        b"GET /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n"
        b"GET /v2/health/live HTTP/1.1\r\n\r\n"
    )
    got = exchange(port, data, shut=False)
    assert [status for status, _ in answers(got)] == [200, 200]


def test_a_refusal_comes_after_the_answers_before_it(port):
    data = infer_request(1.0) + infer_request(2.0) + b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n" + infer_request(3.0)
    got = answers(exchange(port, data))
    assert [status for status, _ in got] == [200, 200, 400]
    assert [json.loads(body)["outputs"][0]["data"] for _, body in got[:2]] == [[2.0], [4.0]]


def test_slowloris_gets_408_while_others_are_served(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        started = time.monotonic()
        for byte in b"GET /v2/health/live HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa":
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                break
            assert live(port) if byte == ord("X") else True
            time.sleep(0.05)
            if time.monotonic() - started > 3:
                break
        answer = read_all(slow)
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout_s" in answer
    assert time.monotonic() - started < 3


def test_a_client_that_leaves_mid_request_costs_nothing(port):
    for cut in (10, 60, 90):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(infer_request(1.0)[:cut])
    assert live(port)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=600))
def test_property_based_garbage_gets_an_answer_or_a_close(port, data):
    answer = exchange(port, data)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 ")
    assert live(port)


HEAD_PARTS = st.sampled_from(
    [b"GET ", b"POST ", b"/v2/health/live", b" HTTP/1.1", b" HTTP/1.0", b"\r\n", b"\n", b"\r", b":", b" ",
     b"Content-Length: ", b"5", b"Connection: close", b"Transfer-Encoding: chunked", b"{}", b"\x00", b"\xff"]
)  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(parts=st.lists(HEAD_PARTS, max_size=40))
def test_property_based_http_shaped_garbage(port, parts):
    answer = exchange(port, b"".join(parts))
    assert answer == b"" or answer.startswith(b"HTTP/1.1 ")
    for status, _ in answers(answer) if answer.count(b"Content-Length") else []:
        assert status in (200, 400, 404, 405, 408, 411, 413, 431)
    assert live(port)


def test_every_request_lets_go_of_its_call():
    """Each request's call object (which holds the server) is released once answered: the server's
    reference count comes back, whatever the route (inference, refusals, the asyncio routes)."""
    server = Server()
    server.bind(
        "Double",
        batch(lambda x: {"y": x * 2}),
        [Tensor(name="x", dtype=F32, shape=(1,))],
        [Tensor(name="y", dtype=F32, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        port = server.serve_http("127.0.0.1:0")
        http = server.endpoint("http")._http
        before = sys.getrefcount(http)
        for _ in range(3):
            data = infer_request() * 20 + b"GET /v2/models/Double/config HTTP/1.1\r\n\r\n" * 5
            assert len(answers(exchange(port, data + b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n"))) == 26
        assert wait_for(lambda: sys.getrefcount(http) <= before, every=0.05), (sys.getrefcount(http), before)
