"""Triton's ``--grpc-header-forward-pattern`` / ``--http-header-forward-pattern``: the headers whose
name the pattern finds (searched, ignoring case) reach the model as string request parameters,
over the request's own parameters of the same name; inference only (HTTP: ``/infer``, not the
generate extension). Stock ``tritonclient`` over both endpoints."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")

from embedtriton import InvalidArgumentError, ModelConfig, Server, Tensor  # noqa: E402
from embedtriton.frontends.grpc import GrpcOptions  # noqa: E402
from embedtriton.frontends.http.options import HttpOptions  # noqa: E402


def echo(requests):
    """Each request's parameters, as JSON."""
    return [
        {"params": np.array([[json.dumps(dict(r.parameters or {}), sort_keys=True)]], np.object_)} for r in requests
    ]


def _bind(server):
    server.bind(
        "Echo",
        echo,
        [Tensor(name="x", dtype=np.float32, shape=(1,))],
        [Tensor(name="params", dtype=np.bytes_, shape=(1,))],
        ModelConfig(max_batch_size=4),
    )


@pytest.fixture(scope="module")
def served():
    server = Server()
    _bind(server)
    with server:
        grpc_port = server.serve_grpc("127.0.0.1:0", header_forward_pattern="^x-|TENANT")
        http_port = server.serve_http("127.0.0.1:0", header_forward_pattern="^x-|TENANT")
        yield server, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"


def _params(result) -> dict:
    return json.loads(result.as_numpy("params")[0, 0])


def _grpc_x():
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    return [x]


def _http_x():
    x = httpclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    return [x]


def test_grpc_metadata_becomes_parameters(served):
    _, address, _ = served
    client = grpcclient.InferenceServerClient(address)
    headers = {"x-trace": "t1", "x-over": "from-header", "my-tenant": "acme", "other": "no"}
    result = client.infer("Echo", _grpc_x(), headers=headers, parameters={"x-over": "from-request", "k": 3})
    # searched (my-tenant), ignoring case (TENANT), over the request's own (x-over); user-agent and
    # the transport's own metadata (content-type, te, grpc-accept-encoding) are not forwarded
    assert _params(result) == {"k": 3, "my-tenant": "acme", "x-over": "from-header", "x-trace": "t1"}


def test_grpc_stream_forwards_its_metadata_to_every_request(served):
    _, address, _ = served
    client = grpcclient.InferenceServerClient(address)
    got = []
    client.start_stream(callback=lambda result, error: got.append(error or _params(result)), headers={"x-s": "1"})
    client.async_stream_infer("Echo", _grpc_x(), parameters={"n": 1})
    client.async_stream_infer("Echo", _grpc_x(), parameters={"n": 2})
    client.stop_stream()
    assert sorted(got, key=lambda p: p["n"]) == [{"n": 1, "x-s": "1"}, {"n": 2, "x-s": "1"}]


def test_http_headers_become_parameters_under_their_names_as_sent(served):
    """Names as they came on the wire (http.client sends them as given; some tritonclient
    releases lower-case them), searched ignoring case, over the request's own parameters."""
    _, _, address = served
    conn = http.client.HTTPConnection(address, timeout=30)
    body = {
        "inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}],
        "parameters": {"x-over": "from-request", "k": 3},
    }
    headers = {"X-Trace": "t1", "x-over": "from-header", "My-Tenant": "acme", "Other": "no"}
    conn.request("POST", "/v2/models/Echo/infer", body=json.dumps(body), headers=headers)
    answer = conn.getresponse()
    assert answer.status == 200
    params = json.loads(json.loads(answer.read())["outputs"][0]["data"][0])
    assert params == {"My-Tenant": "acme", "X-Trace": "t1", "k": 3, "x-over": "from-header"}


def test_stock_http_client_headers_become_parameters(served):
    _, _, address = served
    client = httpclient.InferenceServerClient(address)
    result = client.infer("Echo", _http_x(), headers={"x-trace": "t1", "other": "no"}, parameters={"k": 3})
    assert _params(result) == {"k": 3, "x-trace": "t1"}


def test_http_generate_does_not_forward_headers(served):
    """Triton's HandleGenerate never calls ForwardHeaders: only /infer forwards."""
    _, _, address = served
    conn = http.client.HTTPConnection(address, timeout=30)
    conn.request("POST", "/v2/models/Echo/generate", body=json.dumps({"x": 1.0, "p": "v"}), headers={"x-h": "1"})
    answer = conn.getresponse()
    assert answer.status == 200
    assert json.loads(json.loads(answer.read())["params"]) == {"p": "v"}


def test_without_a_pattern_nothing_is_forwarded():
    server = Server()
    _bind(server)
    with server:
        grpc_port = server.serve_grpc("127.0.0.1:0")
        http_port = server.serve_http("127.0.0.1:0")
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        h = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        assert _params(g.infer("Echo", _grpc_x(), headers={"x-a": "1"})) == {}
        assert _params(h.infer("Echo", _http_x(), headers={"x-a": "1"})) == {}


def test_a_pattern_that_is_no_regex_fails_at_construction():
    with pytest.raises(InvalidArgumentError, match="header_forward_pattern '\\(' is not a valid regular expression"):
        GrpcOptions(header_forward_pattern="(")
    with pytest.raises(InvalidArgumentError, match="not a valid regular expression"):
        HttpOptions(header_forward_pattern="[a-")


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_grpc_forwards_what_grpc_core_shows_a_server(transport):
    """A pattern that finds every key: the metadata grpc-core shows a server (so Triton's
    client_metadata) is forwarded, the same on both transports; the transport's own
    (content-type, te, grpc-accept-encoding, grpc-timeout) and binary (-bin) metadata are not."""
    server = Server()
    _bind(server)
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport=transport, header_forward_pattern=".")
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        result = client.infer("Echo", _grpc_x(), headers={"x-a": "1", "data-bin": b"\x00\x01"}, client_timeout=30)
    params = _params(result)
    assert set(params) == {"user-agent", "x-a"} and params["user-agent"].startswith("grpc-python/")


def test_routes_without_a_socket_restrict_and_forward_too():
    """RestApi.answer, as a Ray Serve replica calls it (headers lower-cased by Ray's proxy)."""
    import asyncio

    from embedtriton.frontends.http.rest import RestApi

    server = Server()
    _bind(server)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}).encode()
    with server:
        api = RestApi(server, HttpOptions(restricted_api="inference:k=v", header_forward_pattern="^x-"))

        async def ask(headers):
            return await api.answer("POST", "/v2/models/Echo/infer", headers, body)

        status, answer = asyncio.run(ask({b"x-a": b"1"}))
        assert (status, answer) == (403, {"error": "This API is restricted, expecting header 'k'"})
        status, answer = asyncio.run(ask({b"k": b"v", b"x-a": b"1"}))
        assert status == 200 and json.loads(answer["outputs"][0]["data"][0]) == {"x-a": "1"}
