"""Triton's restricted APIs (``--grpc-restricted-protocol`` / ``--http-restricted-api``) on both
endpoints, with stock ``tritonclient`` and raw HTTP: every RPC and route goes with Triton's group
(``grpc_server.cc``, ``http_server.cc`` of r24.10), a call without the agreed header gets Triton's
refusal (gRPC UNAVAILABLE "This protocol is restricted, expecting header
'triton-grpc-protocol-<key>'", HTTP 403 ``{"error": "This API is restricted, expecting header
'<key>'"}``) and changes nothing; with the header it runs."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import InvalidArgumentError, Server, ServerConfig  # noqa: E402
from embedtriton.frontends.grpc import GrpcOptions  # noqa: E402
from embedtriton.frontends.http.options import HttpOptions  # noqa: E402

F32 = np.float32
# every group restricted, in two specs with different keys (as an operator would split users from admins)
USERS = "health,metadata,inference:user-key=u5er"
ADMINS = "shared-memory,model-config,model-repository,statistics,trace,logging:admin-key=4dmin"
GROUP_KEY = {g: "user-key" for g in USERS.split(":")[0].split(",")} | {
    g: "admin-key" for g in ADMINS.split(":")[0].split(",")
}
VALUES = {"user-key": "u5er", "admin-key": "4dmin"}


def _grpc_headers(key: str, value: str | None = None) -> dict[str, str]:
    return {f"triton-grpc-protocol-{key}": VALUES[key] if value is None else value}


@pytest.fixture(scope="module")
def served(bind_double, counter):
    calls = counter(lambda requests: [{"y": r["x"] * 2} for r in requests])
    server = Server(ServerConfig(model_control_mode="explicit"))  # with the admin key, clients may load models
    bind_double(server, calls)
    with server:
        grpc_port = server.serve_grpc("127.0.0.1:0", restricted_protocol=[USERS, ADMINS])
        http_port = server.serve_http("127.0.0.1:0", restricted_api=[USERS, ADMINS])
        yield server, calls, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"


def _x() -> list:
    x = grpcclient.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), F32))
    return [x]


def _health_check(address: str, metadata=()):
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
    return stub.Check(health_pb2.HealthCheckRequest(service=""), metadata=metadata, timeout=10).status


# (group, what the client does): every RPC of KServe-v2 and grpc.health.v1.Check, with Triton's group
GRPC_CALLS = [
    ("health", lambda c, h: c.is_server_live(headers=h)),
    ("health", lambda c, h: c.is_server_ready(headers=h)),
    ("health", lambda c, h: c.is_model_ready("Double", headers=h)),
    ("metadata", lambda c, h: c.get_server_metadata(headers=h)),
    ("metadata", lambda c, h: c.get_model_metadata("Double", headers=h)),
    ("inference", lambda c, h: c.infer("Double", _x(), headers=h)),
    ("model-config", lambda c, h: c.get_model_config("Double", headers=h)),
    ("statistics", lambda c, h: c.get_inference_statistics("Double", headers=h)),
    ("model-repository", lambda c, h: c.get_model_repository_index(headers=h)),
    ("model-repository", lambda c, h: c.load_model("Double", headers=h)),
    ("shared-memory", lambda c, h: c.get_system_shared_memory_status(headers=h)),
    ("shared-memory", lambda c, h: c.unregister_system_shared_memory(headers=h)),
    ("shared-memory", lambda c, h: c.get_cuda_shared_memory_status(headers=h)),
    ("shared-memory", lambda c, h: c.unregister_cuda_shared_memory(headers=h)),
    ("trace", lambda c, h: c.get_trace_settings(headers=h)),
    ("logging", lambda c, h: c.get_log_settings(headers=h)),
]


@pytest.mark.parametrize(("group", "call"), GRPC_CALLS, ids=[f"{g}-{i}" for i, (g, _) in enumerate(GRPC_CALLS)])
def test_grpc_each_method_needs_its_groups_header(served, group, call):
    _, _, address, _ = served
    client = grpcclient.InferenceServerClient(address)
    key = GROUP_KEY[group]
    expected = f"This protocol is restricted, expecting header 'triton-grpc-protocol-{key}'"
    for headers in (None, {"other-key": "x"}, _grpc_headers(key, "wrong"), {key: VALUES[key]}):  # unprefixed: no
        with pytest.raises(InferenceServerException) as refused:
            call(client, headers)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert refused.value.message() == expected
    other = "admin-key" if key == "user-key" else "user-key"
    with pytest.raises(InferenceServerException, match="restricted"):  # another group's header opens nothing
        call(client, _grpc_headers(other))
    try:  # runs (trace settings then say that tracing is off: not a refusal)
        call(client, _grpc_headers(key))
    except InferenceServerException as exc:
        assert "restricted" not in exc.message() and group == "trace", exc


def test_grpc_health_check_and_streams_are_restricted_too(served):
    _, calls, address, _ = served
    with pytest.raises(grpc.RpcError) as refused:
        _health_check(address)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.value.details() == "This protocol is restricted, expecting header 'triton-grpc-protocol-user-key'"
    assert _health_check(address, tuple(_grpc_headers("user-key").items())) == health_pb2.HealthCheckResponse.SERVING

    before = calls.requests
    for headers, refusal in ((None, "This protocol is restricted"), (_grpc_headers("user-key"), None)):
        client = grpcclient.InferenceServerClient(address)
        got: list = []
        client.start_stream(callback=lambda result, error, got=got: got.append((result, error)), headers=headers)
        client.async_stream_infer("Double", _x())
        client.stop_stream()
        if refusal is None:
            assert got and got[0][1] is None and got[0][0].as_numpy("y").tolist() == [[2.0, 2.0]]
        else:
            assert got and refusal in str(got[0][1]) and "UNAVAILABLE" in str(got[0][1])
    assert calls.requests == before + 1  # the refused stream's request never reached the model


def test_grpc_refused_calls_change_nothing(served, tmp_path):
    server, calls, address, _ = served
    client = grpcclient.InferenceServerClient(address)
    admin = _grpc_headers("admin-key")
    before = calls.requests
    with pytest.raises(InferenceServerException, match="restricted"):
        client.infer("Double", _x())
    with pytest.raises(InferenceServerException, match="restricted"):
        client.unload_model("Double")
    with pytest.raises(InferenceServerException, match="restricted"):
        client.update_log_settings({"log_verbose_level": 3})
    with pytest.raises(InferenceServerException, match="restricted"):
        client.register_system_shared_memory("r", "/embedtriton_restricted_test", 64)
    assert calls.requests == before
    assert server.model("Double").ready
    assert server.log_settings()["log_verbose_level"] == 0
    assert client.get_system_shared_memory_status(headers=admin).regions == {}


def test_only_restricted_groups_need_a_header(bind_double):
    server = Server()
    bind_double(server, lambda requests: [{"y": r["x"]} for r in requests])
    with server:
        port = server.serve_grpc("127.0.0.1:0", restricted_protocol="model-repository:k=v")
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_live() and client.get_model_config("Double").config.name == "Double"
        assert client.infer("Double", _x()).as_numpy("y").tolist() == [[1.0, 1.0]]
        with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-k'"):
            client.get_model_repository_index()


def test_grpcio_transport_refuses_as_the_native_one(bind_double):
    server = Server()
    bind_double(server, lambda requests: [{"y": r["x"]} for r in requests])
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport="grpcio", restricted_protocol="inference:k=v")
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        with pytest.raises(InferenceServerException) as refused:
            client.infer("Double", _x())
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert refused.value.message() == "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
        assert client.infer("Double", _x(), headers={"triton-grpc-protocol-k": "v"}).as_numpy("y").shape == (1, 2)


INFER_BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
# (group, method, path, body): every route of Triton's HTTP/REST API, with Triton's group
HTTP_ROUTES = [
    ("health", "GET", "/v2/health/live", None),
    ("health", "GET", "/v2/health/ready", None),
    ("health", "GET", "/v2/models/Double/ready", None),
    ("health", "GET", "/v2/models/Double/versions/1/ready", None),
    ("metadata", "GET", "/v2", None),
    ("metadata", "GET", "/v2/models/Double", None),
    ("inference", "POST", "/v2/models/Double/infer", INFER_BODY),
    ("inference", "POST", "/v2/models/Double/versions/1/infer", INFER_BODY),
    ("inference", "POST", "/v2/models/Double/generate", json.dumps({"x": [1.0, 2.0]})),
    ("inference", "POST", "/v2/models/Double/generate_stream", json.dumps({"x": [1.0, 2.0]})),
    ("model-config", "GET", "/v2/models/Double/config", None),
    ("statistics", "GET", "/v2/models/Double/stats", None),
    ("statistics", "GET", "/v2/models/stats", None),
    ("model-repository", "POST", "/v2/repository/index", "{}"),
    ("model-repository", "POST", "/v2/repository/models/Double/load", "{}"),
    ("shared-memory", "GET", "/v2/systemsharedmemory/status", None),
    ("shared-memory", "POST", "/v2/systemsharedmemory/unregister", None),
    ("shared-memory", "GET", "/v2/cudasharedmemory/status", None),
    ("trace", "GET", "/v2/trace/setting", None),
    ("trace", "GET", "/v2/models/Double/trace/setting", None),
    ("logging", "GET", "/v2/logging", None),
]


def _request(address: str, method: str, path: str, body: str | None = None, headers=None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(address, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


@pytest.mark.parametrize(("group", "method", "path", "body"), HTTP_ROUTES, ids=[r[2] for r in HTTP_ROUTES])
def test_http_each_route_needs_its_groups_header(served, group, method, path, body):
    _, _, _, address = served
    key = GROUP_KEY[group]
    expected = {"error": f"This API is restricted, expecting header '{key}'"}
    for headers in (None, {key: "wrong"}, {key: VALUES[key] + "x"}, {f"triton-grpc-protocol-{key}": VALUES[key]}):
        status, answer = _request(address, method, path, body, headers)
        assert (status, json.loads(answer)) == (403, expected)
    status, answer = _request(address, method, path, body, {key.upper(): VALUES[key]})  # names: any case
    assert status != 403, answer
    if method == "GET":  # the group is checked before the method, as Triton: 403, then 405
        assert _request(address, "DELETE", path)[0] == 403
        assert _request(address, "DELETE", path, headers={key: VALUES[key]})[0] == 405


def test_http_stock_client_with_and_without_the_header(served):
    _, calls, _, address = served
    client = httpclient.InferenceServerClient(address)
    x = httpclient.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), F32))
    before = calls.requests
    with pytest.raises(InferenceServerException) as refused:
        client.infer("Double", [x])
    assert refused.value.status() == "403"
    assert refused.value.message() == "This API is restricted, expecting header 'user-key'"
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        client.unload_model("Double")
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        client.update_log_settings({"log_verbose_level": 3})
    assert calls.requests == before and client.is_model_ready("Double", headers={"user-key": "u5er"})
    assert client.get_log_settings(headers={"admin-key": "4dmin"})["log_verbose_level"] == 0
    result = client.infer("Double", [x], headers={"user-key": "u5er"})
    assert result.as_numpy("y").tolist() == [[2.0, 2.0]]


def test_metrics_and_unknown_routes_belong_to_no_group(served):
    _, _, _, address = served
    status, body = _request(address, "GET", "/metrics")
    assert status == 200 and b"nv_inference" in body
    assert _request(address, "GET", "/v2/nowhere")[0] == 404
    assert _request(address, "GET", "/v2/models/Double/nowhere")[0] == 404


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ("inference", "option format is '<config name>:<setting>=<value>'. Got inference"),
        ("inference:key", "option format is '<config name>:<setting>=<value>'. Got inference:key"),
        ("inference:key=", "Got inference:key="),
        (":key=v", "Got :key=v"),
        ("inference:=v", "Got inference:=v"),
        ("inference,infer:k=v", "unknown restricted protocol 'infer'"),
        ("Inference:k=v", "unknown restricted protocol 'Inference'"),
        ("inference,,health:k=v", "unknown restricted protocol ''"),
        (["inference:a=b", "health,inference:c=d"], "restricted protocol 'inference' can not be specified in multiple"),
        ("inference,inference:a=b", "restricted protocol 'inference' can not be specified in multiple"),
    ],
)
def test_invalid_specs_fail_at_construction_in_tritons_words(specs, message):
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GrpcOptions(restricted_protocol=specs)
    api = message.replace("restricted protocol", "restricted api")
    with pytest.raises(InvalidArgumentError, match=api.replace("(", r"\(").replace(")", r"\)")):
        HttpOptions(restricted_api=specs)
    server = Server()
    with pytest.raises(InvalidArgumentError, match="restricted|format"):
        server.serve_grpc("127.0.0.1:0", restricted_protocol=specs)  # before the server even starts


def test_specs_parse_as_triton_splits_them():
    options = GrpcOptions(restricted_protocol="inference,health:My-Key=a=b:c")  # value: all after the first '='
    assert options.restrictions.groups == {
        "inference": "triton-grpc-protocol-my-key",
        "health": "triton-grpc-protocol-my-key",
    }
    restriction = options.restrictions.get("inference")
    assert restriction.admits("a=b:c") and not restriction.admits("a=b") and not restriction.admits(None)
    assert options.restrictions.get("metadata") is None
    http_options = HttpOptions(restricted_api=("logging:k=v", "trace:K2=w"))
    assert http_options.restrictions.groups == {"logging": "k", "trace": "k2"}
    assert not HttpOptions().restrictions and not GrpcOptions().restrictions
    accented = HttpOptions(restricted_api="inference:k=clé").restrictions.get("inference")
    assert accented.admits("clé".encode()) and accented.admits("clé".encode().decode("latin-1"))  # UTF-8 bytes
    assert not accented.admits("clé".encode("latin-1"))


def test_secrets_stay_out_of_repr():
    options = GrpcOptions(restricted_protocol="inference:k=s3cret-value")
    http_options = HttpOptions(restricted_api="inference:k=s3cret-value")
    assert "s3cret-value" not in repr(options) and "s3cret-value" not in repr(http_options)
    assert "s3cret-value" not in repr(options.restrictions.get("inference"))
