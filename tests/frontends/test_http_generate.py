"""Triton's generate extension over HTTP (``/generate``, ``/generate_stream`` as Server-Sent
Events) and ``/metrics`` on the HTTP port, through raw HTTP/1.1, ``http.client`` and ``curl``."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import ModelConfig, Server, Tensor, batch  # noqa: E402

TEXT_IN = [Tensor(name="text_input", dtype=np.bytes_, shape=(1,))]
TEXT_OUT = [Tensor(name="text_output", dtype=np.bytes_, shape=(1,))]


@pytest.fixture(scope="module")
def endpoint():
    closed: list[float] = []

    def upper(requests):
        out = []
        for r in requests:
            suffix = str((r.parameters or {}).get("suffix", "")).encode()
            out.append(
                {"text_output": np.array([[v.upper() + suffix for v in row] for row in r["text_input"]], object)}
            )
        return out

    @batch
    def words(text_input):
        for word in text_input[0, 0].split():
            if word == b"BOOM":
                raise RuntimeError("the tokenizer broke")
            yield {"text_output": np.array([[word]], dtype=np.bytes_)}

    @batch
    def endless(text_input):
        try:
            while True:
                yield {"text_output": np.array([[b"tick"]], dtype=np.bytes_)}
                time.sleep(0.01)
        finally:
            closed.append(time.monotonic())

    server = Server()
    server.bind("Upper", upper, TEXT_IN, TEXT_OUT, ModelConfig(max_batch_size=8))
    server.bind("Words", words, TEXT_IN, TEXT_OUT, ModelConfig(max_batch_size=1, decoupled=True))
    server.bind("Endless", endless, TEXT_IN, TEXT_OUT, ModelConfig(max_batch_size=1, decoupled=True))
    server.bind(
        "Sum",
        batch(lambda x: {"total": x.sum(axis=1, keepdims=True)}),
        [Tensor(name="x", dtype=np.float32, shape=(-1,))],
        [Tensor(name="total", dtype=np.float32, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    server.bind(
        "Pair",
        batch(lambda x: {"total": x.sum(axis=1, keepdims=True)}),
        [Tensor(name="x", dtype=np.float32, shape=(2,))],
        [Tensor(name="total", dtype=np.float32, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        port = server.serve_http("127.0.0.1:0")
        yield port, closed


def post(port: int, path: str, body: object) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", path, json.dumps(body) if not isinstance(body, bytes) else body)
    answer = conn.getresponse()
    data = answer.read()  # (http.client undoes the chunked encoding)
    conn.close()
    return answer.status, answer.getheader("Content-Type") or "", data


def events(data: bytes) -> list[dict]:
    chunks = data.decode().split("\n\n")
    assert chunks[-1] == "" and all(c.startswith("data: ") for c in chunks[:-1]), data
    return [json.loads(c[len("data: ") :]) for c in chunks[:-1]]


def test_generate_maps_keys_to_inputs_and_parameters(endpoint):
    port, _ = endpoint
    status, kind, data = post(port, "/v2/models/Upper/generate", {"text_input": "hello", "suffix": "!"})
    assert (status, kind) == (200, "application/json")
    assert json.loads(data) == {"model_name": "Upper", "model_version": "1", "text_output": "HELLO!"}
    status, _, data = post(port, "/v2/models/Upper/generate", {"text_input": "a", "parameters": {"suffix": "?"}})
    assert json.loads(data)["text_output"] == "A?"
    status, _, data = post(port, "/v2/models/Sum/versions/1/generate", {"x": [1, 2, 3.5]})
    assert status == 200 and json.loads(data) == {"model_name": "Sum", "model_version": "1", "total": 6.5}
    status, _, data = post(port, "/v2/models/Pair/generate", {"x": [1, 2, 3, 4]})  # [-1, 2]: two rows
    assert status == 200 and json.loads(data)["total"] == [3.0, 7.0]


def test_generate_errors(endpoint):
    port, _ = endpoint
    status, _, data = post(port, "/v2/models/Words/generate", {"text_input": "one two three"})
    assert status == 500 and "generate expects model to produce exactly 1 response" in json.loads(data)["error"]
    assert post(port, "/v2/models/Upper/generate", b"{not json")[0] == 400
    assert post(port, "/v2/models/Upper/generate", [1, 2])[0] == 400
    status, _, data = post(port, "/v2/models/Sum/generate", {"x": [[1, 2], [3]]})
    assert status == 400 and "flat list" in json.loads(data)["error"]
    status, _, data = post(port, "/v2/models/Pair/generate", {"x": [1, 2, 3]})
    assert status == 400 and "can not convert input 'x' to tensor with proper shape" in json.loads(data)["error"]
    status, _, data = post(port, "/v2/models/Nope/generate", {"text_input": "a"})
    assert status == 400 and "unknown model" in json.loads(data)["error"]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v2/models/Upper/generate")
    assert conn.getresponse().status == 405


def test_generate_stream_sends_one_event_per_response(endpoint):
    port, _ = endpoint
    status, kind, data = post(port, "/v2/models/Words/generate_stream", {"text_input": "one two three"})
    assert (status, kind) == (200, "text/event-stream; charset=utf-8")
    assert [e["text_output"] for e in events(data)] == ["one", "two", "three"]
    assert all(e["model_name"] == "Words" for e in events(data))
    # a non-decoupled model streams its one response
    status, _, data = post(port, "/v2/models/Upper/generate_stream", {"text_input": "x"})
    assert status == 200 and [e["text_output"] for e in events(data)] == ["X"]


def test_error_after_the_first_response_is_an_error_event(endpoint):
    port, _ = endpoint
    status, _, data = post(port, "/v2/models/Words/generate_stream", {"text_input": "fine BOOM"})
    got = events(data)
    assert status == 200 and got[0]["text_output"] == "fine"
    assert "the tokenizer broke" in got[1]["error"] and len(got) == 2
    status, kind, data = post(port, "/v2/models/Words/generate_stream", {"text_input": "BOOM"})
    assert (status, kind) == (500, "application/json") and "the tokenizer broke" in json.loads(data)["error"]


def test_a_client_leaving_mid_stream_cancels_the_request(endpoint):
    port, closed = endpoint
    before = len(closed)
    body = json.dumps({"text_input": "go"}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST /v2/models/Endless/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        seen = b""
        while seen.count(b"data: ") < 3:
            seen += s.recv(4096)
    assert wait_for(lambda: len(closed) > before), "the model kept generating for a client that left"
    assert len(closed) == before + 1, "the model kept generating for a client that left"
    assert post(port, "/v2/models/Upper/generate", {"text_input": "still"})[0] == 200


def test_streams_and_requests_share_a_keep_alive_connection(endpoint):
    port, _ = endpoint
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(2):
        conn.request("POST", "/v2/models/Words/generate_stream", json.dumps({"text_input": "a b"}))
        answer = conn.getresponse()
        assert [e["text_output"] for e in events(answer.read())] == ["a", "b"]
        conn.request("GET", "/v2/health/ready")
        ready = conn.getresponse()
        assert ready.status == 200 and ready.read() == b""
    conn.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_health_infer_generate_stream_and_metrics(endpoint):
    port, _ = endpoint
    base = f"http://127.0.0.1:{port}"

    def curl(*args: str) -> str:
        return subprocess.run(
            ["curl", "-sS", "--fail-with-body", *args], capture_output=True, text=True, check=True
        ).stdout

    assert curl("-o", "/dev/null", "-w", "%{http_code}", f"{base}/v2/health/ready") == "200"
    answer = json.loads(
        curl(
            "-d",
            '{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]}]}',
            f"{base}/v2/models/Sum/infer",
        )
    )
    assert answer["outputs"][0]["data"] == [3.0]
    streamed = curl("-N", "-d", '{"text_input":"x y"}', f"{base}/v2/models/Words/generate_stream")
    assert [e["text_output"] for e in events(streamed.encode())] == ["x", "y"]
    assert 'nv_inference_request_success{model="Sum",version="1"}' in curl(f"{base}/metrics")
    kind = curl("-o", "/dev/null", "-w", "%{content_type}", f"{base}/metrics")
    assert kind.startswith("text/plain"), kind  # Prometheus' text format, not octet-stream
