"""The KServe-v2 HTTP/REST endpoint (first slice): health, metadata, config, statistics and JSON
inference, with stock tritonclient.http and raw HTTP/1.1."""

from __future__ import annotations

import asyncio
import json
import re
import socket

import numpy as np
import pytest
from helpers import wait_for

httpclient = pytest.importorskip("tritonclient.http")

from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import ModelConfig, Server, Tensor, batch  # noqa: E402


@pytest.fixture(scope="module")
def endpoint(add_sub, add_sub_tensors):
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    server.bind(
        "Echo",
        batch(lambda x: {"y": x}),
        [Tensor(name="x", dtype=np.bytes_, shape=(-1,))],
        [Tensor(name="y", dtype=np.bytes_, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        port = server.serve_http("127.0.0.1:0", max_body_bytes=1024 * 1024)
        yield server, f"127.0.0.1:{port}", port


def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_stock_http_client_health_metadata_and_json_inference(endpoint):
    _, address, _ = endpoint
    client = httpclient.InferenceServerClient(address)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("AddSub")
    assert client.get_server_metadata()["name"] == "triton"
    assert [t["name"] for t in client.get_model_metadata("AddSub")["inputs"]] == ["a", "b"]
    assert client.get_model_config("AddSub")["max_batch_size"] == 8
    a = np.array([[1.0], [2.0]], np.float32)
    inputs = [httpclient.InferInput("a", [2, 1], "FP32"), httpclient.InferInput("b", [2, 1], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a, binary_data=False)  # JSON tensors
    outputs = [httpclient.InferRequestedOutput("add", binary_data=False)]
    result = client.infer("AddSub", inputs, outputs=outputs, request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("add"), a * 2)
    assert result.get_response()["id"] == "r1"
    text = httpclient.InferInput("x", [1, 2], "BYTES")
    text.set_data_from_numpy(np.array([[b"hi", b"there"]], dtype=np.object_), binary_data=False)
    echoed = client.infer("Echo", [text], outputs=[httpclient.InferRequestedOutput("y", binary_data=False)])
    assert echoed.get_response()["outputs"][0]["data"] == ["hi", "there"]
    # (Triton reports a request's statistics after its answer is sent, which may reach us first)
    count = lambda: client.get_inference_statistics("AddSub")["model_stats"][0]["inference_count"]  # noqa: E731
    assert wait_for(lambda: count() >= 2), count()


def test_stock_asyncio_http_client_many_in_flight(endpoint):
    aio = pytest.importorskip("tritonclient.http.aio")
    _, address, _ = endpoint

    async def main() -> list[np.ndarray]:
        client = aio.InferenceServerClient(address)
        try:
            assert await client.is_server_ready() and await client.is_model_ready("AddSub")

            async def one(i: int) -> np.ndarray:
                a = np.full((1, 1), i, np.float32)
                inputs = [aio.InferInput("a", [1, 1], "FP32"), aio.InferInput("b", [1, 1], "FP32")]
                inputs[0].set_data_from_numpy(a)  # binary tensors, the client's default
                inputs[1].set_data_from_numpy(a * 3)
                return (await client.infer("AddSub", inputs, request_id=str(i))).as_numpy("sub")

            results = await asyncio.gather(*(one(i) for i in range(64)))
            with pytest.raises(InferenceServerException, match="unknown model"):
                await client.infer("Nope", [aio.InferInput("a", [1, 1], "FP32")])
            return results
        finally:
            await client.close()

    assert [float(r[0, 0]) for r in asyncio.run(main())] == [-2.0 * i for i in range(64)]  # each its own answer


def test_errors_are_tritons_json_with_client_mistakes_as_4xx(endpoint):
    _, address, port = endpoint
    client = httpclient.InferenceServerClient(address)
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'Nope' is not found"):
        client.get_model_metadata("Nope")
    assert not client.is_model_ready("Nope")
    answer = raw(port, b"POST /v2/models/AddSub/infer HTTP/1.1\r\nContent-Length: 5\r\n\r\n{bad}")
    assert answer.startswith(b"HTTP/1.1 400") and b'"error": "malformed JSON request body' in answer
    wrong = {"inputs": [{"name": "a", "shape": [1, 1], "datatype": "FP32", "data": [1, 2, 3]}]}
    body = json.dumps(wrong).encode()
    answer = raw(port, b"POST /v2/models/AddSub/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    assert answer.startswith(b"HTTP/1.1 400") and b"more values than its shape holds" in answer
    answer = raw(port, b"POST /v2/models/AddSub/infer HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413")
    answer = raw(port, b"GET /nowhere HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 404") and json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert raw(port, b"NOT HTTP\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert client.is_server_live()  # still serving


def test_keep_alive_and_pipelining_answer_in_order(endpoint):
    _, _, port = endpoint
    requests = b"".join(b"GET /v2/health/live HTTP/1.1\r\n\r\nGET /v2/models/Nope HTTP/1.1\r\n\r\n" for _ in range(3))
    answer = raw(port, requests + b"GET /v2/health/ready HTTP/1.1\r\nConnection: close\r\n\r\n")
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert statuses == [b"200", b"400"] * 3 + [b"200"]  # (Triton: an unknown model is INVALID_ARG, 400)


def test_binary_tensor_data_extension_as_the_stock_client_sends_it(endpoint):
    """tritonclient.http's defaults: inputs and outputs as raw bytes after the JSON header."""
    _, address, port = endpoint
    client = httpclient.InferenceServerClient(address)
    a = np.arange(4, dtype=np.float32).reshape(4, 1)
    inputs = [httpclient.InferInput("a", [4, 1], "FP32"), httpclient.InferInput("b", [4, 1], "FP32")]
    inputs[0].set_data_from_numpy(a)  # binary_data=True by default
    inputs[1].set_data_from_numpy(np.ones_like(a))
    result = client.infer("AddSub", inputs)  # no outputs named: binary_data_output
    np.testing.assert_array_equal(result.as_numpy("add"), a + 1)
    np.testing.assert_array_equal(result.as_numpy("sub"), a - 1)
    mixed = client.infer(
        "AddSub",
        inputs,
        outputs=[httpclient.InferRequestedOutput("add"), httpclient.InferRequestedOutput("sub", binary_data=False)],
    )
    assert mixed.get_output("sub")["data"] == [-1.0, 0.0, 1.0, 2.0]  # JSON
    np.testing.assert_array_equal(mixed.as_numpy("add"), a + 1)  # binary
    text = httpclient.InferInput("x", [1, 2], "BYTES")
    text.set_data_from_numpy(np.array([[b"\x00raw", "w\u00f6rld".encode()]], dtype=np.object_))
    assert client.infer("Echo", [text]).as_numpy("y").tolist() == [[b"\x00raw", "w\u00f6rld".encode()]]
    # sizes that do not add up are the client's mistake
    header = json.dumps(
        {"inputs": [{"name": "a", "shape": [1, 1], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}
    ).encode()
    body = header + b"\0" * 4
    request = (
        b"POST /v2/models/AddSub/infer HTTP/1.1\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
        % (len(header), len(body))
    )
    answer = raw(port, request + body)
    assert answer.startswith(b"HTTP/1.1 400") and b"binary_data_size 8 does not fit the 4 bytes" in answer


def test_perf_analyzer_over_http(endpoint, perf_analyzer):
    """Triton's own load generator, unmodified, over HTTP (binary tensors, keep-alive, 4 in flight)."""
    import subprocess

    server, address, _ = endpoint
    binary, env = perf_analyzer
    before = server.model("AddSub").statistics()["inference_stats"]["success"]["count"]
    run = subprocess.run(
        [binary, "-m", "AddSub", "-i", "http", "-u", address,
         "--concurrency-range", "4", "--measurement-interval", "500", "--stability-percentage", "100",
         "--max-trials", "3"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    throughput = float(re.search(r"Throughput: ([\d.]+) infer/sec", run.stdout).group(1))
    after = server.model("AddSub").statistics()["inference_stats"]["success"]["count"]
    assert throughput > 100 and after - before > 100  # requests really went through Triton


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_answers_as_tritonclient_sends_them(endpoint, algorithm):
    _, address, port = endpoint
    client = httpclient.InferenceServerClient(address)
    a = np.arange(64, dtype=np.float32).reshape(64, 1) % 8  # a batch of 64 > max_batch_size 8: sent in 8s
    for rows in (a[:8], a[8:16]):
        inputs = [httpclient.InferInput("a", [8, 1], "FP32"), httpclient.InferInput("b", [8, 1], "FP32")]
        inputs[0].set_data_from_numpy(rows)
        inputs[1].set_data_from_numpy(rows)
        result = client.infer(
            "AddSub", inputs, request_compression_algorithm=algorithm, response_compression_algorithm=algorithm
        )
        np.testing.assert_array_equal(result.as_numpy("add"), rows * 2)
    import zlib

    body = json.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}).encode()
    head = "POST /v2/models/AddSub/infer HTTP/1.1\r\nContent-Encoding: {}\r\nContent-Length: {}\r\n\r\n"
    answer = raw(port, head.format("br", len(body)).encode() + body)
    assert answer.startswith(b"HTTP/1.1 415") and b"only gzip and deflate" in answer
    answer = raw(port, head.format("gzip", len(body)).encode() + body)  # not gzip at all
    assert answer.startswith(b"HTTP/1.1 400") and b"does not inflate" in answer
    bomb = zlib.compress(b" " * (2 * 1024 * 1024))  # 2 KiB that inflate past the 1 MiB limit
    answer = raw(port, head.format("deflate", len(bomb)).encode() + bomb)
    assert answer.startswith(b"HTTP/1.1 413") and b"inflates past the limit" in answer
    truncated = zlib.compress(body)[:-6]
    answer = raw(port, head.format("deflate", len(truncated)).encode() + truncated)
    assert answer.startswith(b"HTTP/1.1 400") and b"truncated" in answer


def test_a_bug_of_ours_is_answered_500_and_logged_not_left_hanging(endpoint, monkeypatch, caplog):
    """An exception no route expects (here: server metadata raising) still answers the client,
    500 with the reason, and the traceback goes to the log; the endpoint keeps serving."""
    from embedtriton.frontends.http.rest import RestApi

    _, address, port = endpoint

    def broken(self):
        raise RuntimeError("metadata exploded")

    monkeypatch.setattr(RestApi, "_server_metadata", broken)
    with caplog.at_level("ERROR", logger="embedtriton"):
        answer = raw(port, b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500") and b"internal error: RuntimeError: metadata exploded" in answer
    assert "HTTP GET /v2 failed" in caplog.text
    assert httpclient.InferenceServerClient(address).is_server_live()
