"""Hostile clients of the OpenAI routes: oversized, malformed and deeply nested bodies, a wrong
type in every field (property-based), huge ``n`` / ``max_tokens``, bodies stalled mid-way, a
flood of streams that read nothing. Every bad request gets a 4xx in OpenAI's error shape; the
endpoint keeps serving meanwhile and never hangs."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import unread_posts, wait_for

from embedtriton import Server  # noqa: E402
from embedtriton.openai import bind_chat, bind_completion, bind_embedding  # noqa: E402

MAX_BODY = 64 * 1024


class Flags:
    def __init__(self) -> None:
        self.open = 0
        self.flooding = 0
        self.flooded = 0  # pieces the flood model made, in all
        self.lock = threading.Lock()


@pytest.fixture(scope="module")
def served():
    flags = Flags()

    def echo(messages, **params):
        yield str(messages[-1].get("content"))[:50]

    def endless(messages, **params):
        with flags.lock:
            flags.open += 1
        try:
            while True:
                time.sleep(0.005)
                yield "x" * 512
        finally:
            with flags.lock:
                flags.open -= 1

    def flood(messages, **params):
        with flags.lock:
            flags.flooding += 1
        try:
            while True:
                flags.flooded += 1
                yield "y" * 65536
        finally:
            with flags.lock:
                flags.flooding -= 1

    server = Server()
    bind_chat(server, "echo", echo)
    bind_chat(server, "flood", flood)
    bind_chat(server, "endless", endless)
    bind_completion(server, "same", lambda prompt, **p: prompt[:50])
    bind_embedding(server, "embed", lambda texts: np.ones((len(texts), 3), np.float32))
    with server:
        port = server.serve_http(
            "127.0.0.1:0", openai=True, max_body_bytes=MAX_BODY, request_timeout_s=0.5, max_connections=128
        )
        yield port, flags


def post(port: int, path: str, body: bytes | object, headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    answer = conn.getresponse()
    raw = answer.read()
    conn.close()
    try:
        return answer.status, json.loads(raw)
    except ValueError:
        return answer.status, {"raw": raw.decode("latin-1")}


def assert_openai_error(status: int, answer: dict, expected: int | None = None) -> None:
    assert 400 <= status < 500 if expected is None else status == expected, (status, answer)
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str), answer
    assert error["message"]


def healthy(port: int) -> None:
    status, answer = post(
        port, "/v1/chat/completions", {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 200 and answer["choices"][0]["message"]["content"] == "hi", answer


def test_oversized_and_compressed_bombs_get_413(served):
    port, _ = served
    big = {"model": "echo", "messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}
    status, answer = post(port, "/v1/chat/completions", big)
    assert_openai_error(status, answer, 413)
    bomb = gzip.compress(json.dumps({"model": "echo", "prompt": "a" * (4 * MAX_BODY)}).encode())
    status, answer = post(port, "/v1/completions", bomb, {"Content-Encoding": "gzip"})
    assert_openai_error(status, answer, 413)
    healthy(port)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"[1, 2]",
        b"null",
        b'"text"',
        b"\xff\xfe\x00",
        b"[" * 20_000 + b"]" * 20_000,
        b'{"model": "echo", "messages": ' + b"[" * 15_000 + b"]" * 15_000 + b"}",
        b'{"model": "echo", "n": 1' + b"0" * 5000 + b"}",  # an integer past Python's digit limit
        b'{"model": "echo", "temperature": NaN, "messages": [{"role": "user", "content": "a"}]}',
        b'{"model": "echo", "temperature": 1e999, "messages": [{"role": "user", "content": "a"}]}',
    ],
)
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_malformed_bodies_get_400(served, route, body):
    port, _ = served
    status, answer = post(port, route, body)
    assert_openai_error(status, answer, 400)


def test_huge_counts_and_unknown_models(served):
    port, _ = served
    messages = [{"role": "user", "content": "a"}]
    for field, value in [("n", 10**9), ("n", 0), ("max_tokens", 10**30), ("max_tokens", -1), ("seed", 2**70)]:
        status, answer = post(port, "/v1/chat/completions", {"model": "echo", "messages": messages, field: value})
        assert_openai_error(status, answer, 400)
        assert answer["error"]["param"] == field
    status, answer = post(port, "/v1/embeddings", {"model": "embed", "input": ["a"] * 5000})
    assert_openai_error(status, answer, 400)
    for name in ["nope", "x" * 10_000, "ü/../v2", "", None, 7]:
        status, answer = post(port, "/v1/chat/completions", {"model": name, "messages": messages})
        assert_openai_error(status, answer, 404 if isinstance(name, str) and name else 400)
    for route, body in [("/v1/completions", {"model": "same", "prompt": "\ud800"}),
                        ("/v1/embeddings", {"model": "embed", "input": ["ok", "\udfff"]})]:  # fmt: skip
        status, answer = post(port, route, body)  # (json.dumps escapes the lone surrogate)
        assert_openai_error(status, answer, 400)
        assert "not valid Unicode" in answer["error"]["message"]
    status, answer = post(port, "/v1/nothing/here", {})
    assert_openai_error(status, answer, 404)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("DELETE", "/v1/chat/completions")
    answer = conn.getresponse()
    assert_openai_error(answer.status, json.loads(answer.read()), 405)
    healthy(port)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
CHAT_FIELDS = ["messages", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed",
               "stream", "stream_options", "presence_penalty", "frequency_penalty", "user", "logprobs"]  # fmt: skip
EMBED_FIELDS = ["input", "encoding_format", "dimensions", "user"]


def check_answer(status: int, answer: dict) -> None:
    if status == 200:
        assert "choices" in answer or "data" in answer or "raw" in answer, answer
    else:
        assert_openai_error(status, answer)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(CHAT_FIELDS), value=JSON)
def test_any_value_in_any_chat_field(served, field, value):
    port, _ = served
    body = {"model": "echo", "messages": [{"role": "user", "content": "a"}], field: value}
    status, answer = post(port, "/v1/chat/completions", body)
    check_answer(status, answer)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(["prompt", "n", "max_tokens", "stop", "echo", "stream"]), value=JSON)
def test_any_value_in_any_completion_field(served, field, value):
    port, _ = served
    status, answer = post(port, "/v1/completions", {"model": "same", "prompt": "abc", field: value})
    check_answer(status, answer)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(EMBED_FIELDS), value=JSON)
def test_any_value_in_any_embeddings_field(served, field, value):
    port, _ = served
    status, answer = post(port, "/v1/embeddings", {"model": "embed", "input": "abc", field: value})
    check_answer(status, answer)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(messages=JSON)
def test_any_messages(served, messages):
    port, _ = served
    status, answer = post(port, "/v1/chat/completions", {"model": "echo", "messages": messages})
    check_answer(status, answer)


def test_a_body_stalled_mid_way_gets_408_while_others_are_served(served):
    port, _ = served
    stalled = []
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{"model": "ec')
        stalled.append(s)
    healthy(port)  # served meanwhile
    for s in stalled:
        head, _, body = s.recv(65536).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), head
        assert_openai_error(408, json.loads(body), 408)
        s.close()


def test_a_stream_whose_client_reads_nothing_is_let_go(served):
    port, flags = served
    body = json.dumps({"model": "flood", "messages": [{"role": "user", "content": "a"}], "stream": True}).encode()
    socks = unread_posts(port, "/v1/chat/completions", body, 4)
    assert wait_for(lambda: flags.flooding >= 4), f"{flags.flooding} of 4 floods started"
    wait_for(lambda: not flags.flooding, 20)  # the buffers fill, then request_timeout_s (0.5 s) passes
    assert flags.flooding == 0, "a stream nobody reads kept its generator running"
    # each generator was held back once 256 pieces (16 MiB) waited for its route: without that
    # they made about 10,000 pieces a second (600 MB/s) until let go, and starved the route
    assert flags.flooded < 4 * 1000, flags.flooded
    for s in socks:
        s.close()
    healthy(port)


def test_a_flood_of_streams_that_read_nothing(served):
    port, flags = served
    body = json.dumps({"model": "endless", "messages": [{"role": "user", "content": "a"}], "stream": True}).encode()
    socks = unread_posts(port, "/v1/chat/completions", body, 40)
    # each of the generator's instances (bind_chat gives it 8) runs a stream nobody reads; the rest wait in the queue
    assert wait_for(lambda: flags.open == 8), flags.open
    healthy(port)  # the others are served while 40 streams sit unread
    for s in socks:
        s.close()
    wait_for(lambda: not flags.open, 15)
    assert flags.open == 0, f"{flags.open} generators still open after their clients left"
    healthy(port)


def test_leaving_a_stream_of_several_choices_closes_every_generator(served):
    port, flags = served
    body = json.dumps({"model": "endless", "messages": [{"role": "user", "content": "a"}], "n": 4, "stream": True})
    body = body.encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_for(lambda: flags.open >= 4, 10)
    assert flags.open == 4
    s.close()
    wait_for(lambda: not flags.open, 10)
    assert flags.open == 0, f"{flags.open} of 4 generators still open after the client left"
    healthy(port)
