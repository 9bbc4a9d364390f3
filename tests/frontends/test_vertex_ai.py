"""``Server.serve_vertex_ai``: Triton's Vertex AI endpoint (``src/vertex_ai_server.cc``) — the
predict and health routes from ``AIP_*``, the default model, the redirect header, the binary
Content-Type, identity-only bodies, and a bare 400 for everything else."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import struct

import numpy as np
import pytest

from embedtriton import InvalidArgumentError, ModelConfig, Server, Tensor, batch

PREDICT = "/v1/endpoints/[0-9]+/deployedModels/[0-9]+:predict"
HEALTH = "/health"
F32 = [Tensor(name=n, dtype=np.float32, shape=(-1,)) for n in ("a", "b", "add", "sub")]


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@batch
def echo(a, b):
    return {"add": a, "sub": b}


@pytest.fixture(scope="module")
def server():
    server = Server()
    server.bind("AddSub", add_sub, F32[:2], F32[2:], ModelConfig(max_batch_size=8))
    server.bind("Echo", echo, F32[:2], F32[2:], ModelConfig(max_batch_size=8))
    with server:
        yield server


@pytest.fixture(scope="module")
def port(server):
    return server.serve_vertex_ai("127.0.0.1:0", predict_route=PREDICT, health_route=HEALTH, default_model="AddSub")


def ask(port: int, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body, {k.replace("_", "-"): v for k, v in headers.items()})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


BODY = json.dumps(
    {
        "inputs": [
            {"name": "a", "shape": [1, 2], "datatype": "FP32", "data": [[1, 2]]},
            {"name": "b", "shape": [1, 2], "datatype": "FP32", "data": [[3, 5]]},
        ]
    }
).encode()


def outputs(body: bytes) -> dict[str, list[float]]:
    return {o["name"]: o["data"] for o in json.loads(body)["outputs"]}


def test_predict_infers_the_default_model(port):
    status, _, body = ask(port, "POST", "/v1/endpoints/12/deployedModels/34:predict", BODY)
    assert status == 200 and outputs(body) == {"add": [4.0, 7.0], "sub": [-2.0, -3.0]}
    assert json.loads(body)["model_name"] == "AddSub"
    assert ask(port, "GET", "/v1/endpoints/12/deployedModels/34:predict")[0] == 405  # inference is a POST


def test_the_routes_match_whole_paths_and_nothing_else_is_served(port):
    for method, path in [
        ("POST", "/v1/endpoints/12/deployedModels/34:predict/more"),  # not a whole match
        ("POST", "/v2/models/AddSub/infer"),  # KServe's own paths are not served here
        ("GET", "/v2/health/ready"),
        ("GET", "/metrics"),
    ]:
        status, _, body = ask(port, method, path, BODY if method == "POST" else b"")
        assert (status, body) == (400, b""), (method, path)


def test_health_says_whether_the_server_is_ready(port):
    assert ask(port, "GET", "/health")[0] == 200
    assert ask(port, "GET", "/health?probe=1")[0] == 200  # the path is matched, not the query
    assert ask(port, "POST", "/health")[0] == 405


def test_the_redirect_header_reaches_kserve_paths_by_post(port, server):
    predict = "/v1/endpoints/1/deployedModels/2:predict"
    status, _, body = ask(port, "POST", predict, BODY, X_Vertex_Ai_Triton_Redirect="v2/models/Echo/infer")
    assert status == 200 and outputs(body) == {"add": [1.0, 2.0], "sub": [3.0, 5.0]}
    status, _, body = ask(port, "POST", predict, BODY, X_Vertex_Ai_Triton_Redirect="v2/models/Echo/versions/1/infer")
    assert status == 200 and json.loads(body)["model_name"] == "Echo"
    status, _, body = ask(port, "POST", predict, X_Vertex_Ai_Triton_Redirect="v2/models/AddSub/config")
    assert status == 200 and json.loads(body)["max_batch_size"] == 8  # answered as the GET it is
    status, _, body = ask(port, "POST", predict, X_Vertex_Ai_Triton_Redirect="v2/models/Echo")
    assert status == 200 and json.loads(body)["name"] == "Echo"
    assert ask(port, "POST", predict, X_Vertex_Ai_Triton_Redirect="v2/models/Echo/ready")[0] == 200
    assert ask(port, "POST", predict, X_Vertex_Ai_Triton_Redirect="v2/health/live")[0] == 200
    status, _, body = ask(port, "POST", predict, X_Vertex_Ai_Triton_Redirect="v2")
    assert status == 200 and json.loads(body)["name"] == "triton"
    status, _, body = ask(port, "POST", predict, X_Vertex_Ai_Triton_Redirect="v2/models/stats")
    assert status == 200 and {s["name"] for s in json.loads(body)["model_stats"]} == {"AddSub", "Echo"}
    status, headers, body = ask(port, "POST", predict, X_Vertex_Ai_Triton_Redirect="metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain") and b"nv_inference_count" in body
    status, _, body = ask(port, "POST", predict, b'{"ready": true}', X_Vertex_Ai_Triton_Redirect="v2/repository/index")
    assert status == 200 and {m["name"] for m in json.loads(body)} == {"AddSub", "Echo"}
    status, _, body = ask(port, "POST", predict, X_Vertex_Ai_Triton_Redirect="v2/systemsharedmemory/status")
    assert status == 200 and json.loads(body) == []
    # what Triton's Vertex AI endpoint does not redirect to, and redirects by another method
    for target in ("v2/models/AddSub/generate", "v2/models/AddSub/trace/setting", "v2/logging", "nowhere"):
        assert ask(port, "POST", predict, BODY, X_Vertex_Ai_Triton_Redirect=target)[:3:2] == (400, b""), target
    assert ask(port, "GET", predict, X_Vertex_Ai_Triton_Redirect="v2/models/AddSub/config")[0] == 405


def _binary_body() -> tuple[bytes, int]:
    header = json.dumps(
        {
            "inputs": [
                {"name": "a", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
                {"name": "b", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
            ]
        }
    ).encode()
    return header + struct.pack("<4f", 1, 2, 10, 20), len(header)


def test_binary_tensors_take_their_json_size_from_the_content_type(port):
    body, size = _binary_body()
    predict = "/v1/endpoints/1/deployedModels/2:predict"
    mime = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
    status, _, answer = ask(port, "POST", predict, body, Content_Type=f"{mime}{size}")
    assert status == 200 and outputs(answer) == {"add": [11.0, 22.0], "sub": [-9.0, -18.0]}
    # KServe's header is not read here: the whole body is taken as JSON, which it is not
    status, _, answer = ask(port, "POST", predict, body, Inference_Header_Content_Length=str(size))
    assert status == 400 and "malformed JSON" in json.loads(answer)["error"]
    status, _, answer = ask(port, "POST", predict, body, Content_Type=f"text/x; {mime}{size}")
    assert status == 400
    assert (
        json.loads(answer)["error"]
        == f"expect MIME type for binary data starts with '{mime}', got: text/x; {mime}{size}"
    )
    status, _, answer = ask(port, "POST", predict, body, Content_Type=f"{mime}{len(body) + 1}")
    assert status == 400
    assert (
        json.loads(answer)["error"]
        == f"inference header size should be in range (0, {len(body)}), got: {len(body) + 1}"
    )


def test_bodies_and_answers_are_never_compressed(port):
    predict = "/v1/endpoints/1/deployedModels/2:predict"
    status, headers, body = ask(port, "POST", predict, BODY, Accept_Encoding="gzip")
    assert status == 200 and "content-encoding" not in headers and outputs(body)["add"] == [4.0, 7.0]
    status, _, body = ask(port, "POST", predict, gzip.compress(BODY), Content_Encoding="gzip")
    assert status == 400 and "malformed JSON" in json.loads(body)["error"]  # read as it came: identity


def test_the_default_model_is_the_only_ready_one_or_named():
    two = Server()
    two.bind("AddSub", add_sub, F32[:2], F32[2:], ModelConfig(max_batch_size=8))
    two.bind("Echo", echo, F32[:2], F32[2:], ModelConfig(max_batch_size=8))
    with two:
        with pytest.raises(InvalidArgumentError, match="^Expect the model repository contains only a single model"):
            two.serve_vertex_ai("127.0.0.1:0", predict_route=PREDICT, health_route=HEALTH)
        with pytest.raises(InvalidArgumentError, match="^Expect the default model 'Nope' is loaded"):
            two.serve_vertex_ai("127.0.0.1:0", predict_route=PREDICT, health_route=HEALTH, default_model="Nope")
        two.unbind("AddSub")
        port = two.serve_vertex_ai("127.0.0.1:0", predict_route=PREDICT, health_route=HEALTH)
        status, _, body = ask(port, "POST", "/v1/endpoints/1/deployedModels/2:predict", BODY)
        assert status == 200 and json.loads(body)["model_name"] == "Echo"


def test_routes_and_port_come_from_the_environment(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    single = Server()
    single.bind("Echo", echo, F32[:2], F32[2:], ModelConfig(max_batch_size=8))
    with single:
        monkeypatch.delenv("AIP_PREDICT_ROUTE", raising=False)
        monkeypatch.setenv("AIP_HEALTH_ROUTE", "/ping")
        with pytest.raises(InvalidArgumentError, match="^AIP_PREDICT_ROUTE is not defined for Vertex AI endpoint$"):
            single.serve_vertex_ai("127.0.0.1:0")
        monkeypatch.setenv("AIP_PREDICT_ROUTE", "/predict")
        monkeypatch.setenv("AIP_HTTP_PORT", str(free))
        assert single.serve_vertex_ai() == free
        assert ask(free, "GET", "/ping")[0] == 200
        assert outputs(ask(free, "POST", "/predict", BODY)[2])["add"] == [1.0, 2.0]


def test_the_http_endpoint_answers_every_models_statistics_too(server):
    """``GET /v2/models/stats`` (all models; what the redirect above reaches), as tritonclient asks it."""
    import tritonclient.http

    client = tritonclient.http.InferenceServerClient(f"127.0.0.1:{server.serve_http('127.0.0.1:0')}")
    try:
        assert {s["name"] for s in client.get_inference_statistics()["model_stats"]} == {"AddSub", "Echo"}
    finally:
        client.close()
