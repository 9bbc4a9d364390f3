"""Hostile clients against restricted APIs: missing, wrong, near-miss, oversized and repeated
headers, header injection, encoded paths, and the compare itself (constant time: every check
compares two SHA-256 digests with ``hmac.compare_digest``, whatever the client sent). Nothing a
refused client sends runs; the endpoint keeps serving the clients that hold the header. Also
``embedtriton serve`` with Triton's flags."""

from __future__ import annotations

import hmac
import json
import socket
import subprocess
import sys

import numpy as np
import pytest
from serving import Served

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
import grpc  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import ModelConfig, Server, Tensor  # noqa: E402
from embedtriton.frontends import security  # noqa: E402

F32 = np.float32
SECRET = "0123456789abcdef0123456789abcdef"
GRPC_KEY = "triton-grpc-protocol-token"
REFUSED_HTTP = b'{"error": "This API is restricted, expecting header \'token\'"}'


@pytest.fixture(scope="module")
def served(counter):
    calls = counter(lambda requests: [{"y": r["x"] * 2} for r in requests])
    server = Server()
    server.bind(
        "Double",
        calls,
        [Tensor(name="x", dtype=F32, shape=(1,))],
        [Tensor(name="y", dtype=F32, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    spec = f"inference,model-repository,logging:token={SECRET}"
    with server:
        grpc_port = server.serve_grpc("127.0.0.1:0", restricted_protocol=spec)
        http_port = server.serve_http("127.0.0.1:0", restricted_api=spec)
        yield server, calls, grpc_port, http_port


def _raw_http(port: int, head: bytes, body: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


INFER = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}).encode()


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b" ",
        SECRET[:-1].encode(),  # all but the last character
        SECRET.encode() + b"0",  # one more
        SECRET.upper().encode(),
        SECRET.encode() + b"\x00",
        b"\xff" * 32,
        b"x" * 15000,  # oversized, within the header limit
    ],
    ids=["empty", "space", "prefix", "longer", "upper", "nul", "binary", "oversized"],
)
def test_http_wrong_values_are_refused_and_nothing_runs(served, value):
    _, calls, _, port = served
    before = calls.requests
    answer = _raw_http(port, b"POST /v2/models/Double/infer HTTP/1.1\r\nHost: x\r\nToken: " + value + b"\r\n", INFER)
    assert answer.startswith(b"HTTP/1.1 403 Forbidden") or (value == SECRET.encode() + b"\x00" and b" 400 " in answer)
    assert REFUSED_HTTP in answer or b" 400 " in answer  # a NUL is no valid header value: llhttp refuses it
    assert calls.requests == before


def test_http_a_header_over_the_limit_is_refused_before_routing(served):
    _, calls, _, port = served
    before = calls.requests
    answer = _raw_http(port, b"POST /v2/models/Double/infer HTTP/1.1\r\nToken: " + b"x" * 20000 + b"\r\n", INFER)
    assert answer.startswith(b"HTTP/1.1 431")
    assert calls.requests == before


def test_http_header_injection_and_repeats(served):
    """A CRLF in a value cannot smuggle a header in (llhttp refuses it); a header sent twice
    counts with its first value, as Triton's evhtp_kv_find reads it."""
    server, calls, _, port = served
    before = calls.requests
    injected = _raw_http(
        port, b"POST /v2/models/Double/infer HTTP/1.1\r\nX-Note: a\r\r\nToken: " + SECRET.encode() + b"\r\n", INFER
    )
    assert injected.startswith(b"HTTP/1.1 400")
    twice = b"Token: wrong\r\nToken: " + SECRET.encode() + b"\r\n"
    answer = _raw_http(port, b"POST /v2/models/Double/infer HTTP/1.1\r\n" + twice, INFER)
    assert answer.startswith(b"HTTP/1.1 403") and REFUSED_HTTP in answer
    folded = b"Token: wrong\r\n " + SECRET.encode() + b"\r\n"  # obsolete line folding: refused by llhttp
    assert not _raw_http(port, b"POST /v2/models/Double/infer HTTP/1.1\r\n" + folded, INFER).startswith(b"HTTP/1.1 200")
    assert calls.requests == before
    good = _raw_http(port, b"POST /v2/models/Double/infer HTTP/1.1\r\nTOKEN: " + SECRET.encode() + b"\r\n", INFER)
    assert good.startswith(b"HTTP/1.1 200") and calls.requests == before + 1
    assert server.model("Double").ready


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/models/Double/unload",
        "/v2/repository/models/Double/%75nload",  # percent-encoded: routed as unload, so restricted as unload
        "/v2/repository/models/Double/unload/",
        "/v2/repository/models/Double/unload?token=" + SECRET,  # a query is no header
        "/v2/repository/models/%44ouble/unload",
    ],
)
def test_http_encoded_paths_do_not_slip_past_the_restriction(served, path):
    server, _, _, port = served
    answer = _raw_http(port, f"POST {path} HTTP/1.1\r\n".encode(), b"{}")
    assert answer.startswith(b"HTTP/1.1 403") and REFUSED_HTTP in answer
    assert server.model("Double").ready


def _unary(port: int, method: str, request, response, metadata=()):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response.FromString,
    )
    try:
        return call(request, metadata=metadata, timeout=30)
    finally:
        channel.close()


def _infer_request():
    request = service_pb2.ModelInferRequest(model_name="Double")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.ones((1, 1), F32).tobytes())
    del tensor
    return request


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        ((GRPC_KEY, ""),),
        ((GRPC_KEY, SECRET[:-1]),),
        ((GRPC_KEY, SECRET + "0"),),
        (("token", SECRET),),  # without Triton's prefix
        ((GRPC_KEY, "wrong"), (GRPC_KEY, SECRET)),  # twice: the first counts, as Triton's metadata.find
        ((GRPC_KEY, "x" * 8000),),
    ],
    ids=["missing", "empty", "prefix", "longer", "unprefixed", "twice", "oversized"],
)
def test_grpc_wrong_metadata_is_refused_and_nothing_runs(served, metadata):
    _, calls, port, _ = served
    before = calls.requests
    with pytest.raises(grpc.RpcError) as refused:
        _unary(port, "ModelInfer", _infer_request(), service_pb2.ModelInferResponse, metadata)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.value.details() == f"This protocol is restricted, expecting header '{GRPC_KEY}'"
    assert calls.requests == before
    ok = _unary(port, "ModelInfer", _infer_request(), service_pb2.ModelInferResponse, ((GRPC_KEY, SECRET),))
    assert np.frombuffer(ok.raw_output_contents[0], F32).tolist() == [2.0]


def test_grpc_metadata_over_the_limit_is_refused_before_the_service(served):
    _, calls, port, _ = served
    before = calls.requests
    with pytest.raises(grpc.RpcError) as refused:
        _unary(port, "ModelInfer", _infer_request(), service_pb2.ModelInferResponse, ((GRPC_KEY, "x" * 40000),))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert calls.requests == before


def test_grpc_a_malformed_message_is_refused_for_the_header_first(served):
    """The restriction is checked before the message is decoded (nothing of it is parsed)."""
    _, _, port, _ = served
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/inference.GRPCInferenceService/RepositoryModelUnload")
    with pytest.raises(grpc.RpcError) as refused:
        call(b"\xff\xff\xff", timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "restricted" in refused.value.details()
    channel.close()


def test_every_check_compares_digests_in_constant_time(served, monkeypatch):
    """Whatever the client sends (absent, short, long, almost right), the check is one
    hmac.compare_digest of two 32-byte digests: its time tells nothing of the value."""
    _, _, grpc_port, http_port = served
    compared: list[tuple[int, int]] = []
    compare = hmac.compare_digest

    def spy(a, b):
        compared.append((len(a), len(b)))
        return compare(a, b)

    monkeypatch.setattr(security.hmac, "compare_digest", spy)
    tries = [None, "", "x", SECRET[:-1], SECRET[:-1] + "0", "y" * 5000, SECRET]
    for value in tries:
        head = b"POST /v2/models/Double/infer HTTP/1.1\r\n"
        if value is not None:
            head += b"Token: " + value.encode() + b"\r\n"
        _raw_http(http_port, head, INFER)
        metadata = () if value is None else ((GRPC_KEY, value),)
        try:
            _unary(grpc_port, "ModelInfer", _infer_request(), service_pb2.ModelInferResponse, metadata)
        except grpc.RpcError:
            pass
    assert compared == [(32, 32)] * (2 * len(tries))


MODELS = """
import json
import numpy as np
from embedtriton import ModelConfig, Tensor

def echo(requests):
    return [{"params": np.array([[json.dumps(dict(r.parameters or {}))]], np.object_)} for r in requests]

def bind(server):
    server.bind("Echo", echo, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="params", dtype=np.bytes_, shape=(1,))], ModelConfig(max_batch_size=4))
"""


def test_serve_command_takes_tritons_flags(tmp_path):
    served = Served(
        tmp_path, MODELS, "--http", "127.0.0.1:0",
        "--grpc-restricted-protocol", "inference:k=v", "--grpc-restricted-protocol", "logging:admin=a",
        "--http-restricted-api", "inference,health:k=v",
        "--grpc-header-forward-pattern", "^x-", "--http-header-forward-pattern", "^x-",
    )  # fmt: skip
    try:
        http_port = int(next(line for line in served.lines if "serving HTTP" in line).rsplit("port ", 1)[1][:-2])
        g = grpcclient.InferenceServerClient(served.address)
        x = grpcclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.ones((1, 1), F32))
        with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-k'"):
            g.infer("Echo", [x])
        with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-admin'"):
            g.get_log_settings()
        result = g.infer("Echo", [x], headers={"triton-grpc-protocol-k": "v", "x-a": "1"})
        assert json.loads(result.as_numpy("params")[0, 0]) == {"x-a": "1"}
        h = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        hx = httpclient.InferInput("x", [1, 1], "FP32")
        hx.set_data_from_numpy(np.ones((1, 1), F32))
        with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'k'"):
            h.infer("Echo", [hx])
        assert not h.is_server_live() and h.is_server_live(headers={"k": "v"})
        result = h.infer("Echo", [hx], headers={"k": "v", "X-B": "2"})
        forwarded = json.loads(result.as_numpy("params")[0, 0])  # (names as sent: tritonclient 2.51 lower-cases)
        assert {k.lower(): v for k, v in forwarded.items()} == {"x-b": "2"}
    finally:
        served.close()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grpc-restricted-protocol", "inference"], "--grpc-restricted-protocol option format is"),
        (["--grpc-restricted-protocol", "infer:k=v"], "unknown restricted protocol 'infer'"),
        (["--http", ":0", "--http-restricted-api", "health:a=b", "--http-restricted-api", "health:c=d"],
         "restricted api 'health' can not be specified in multiple config groups"),
        (["--http-restricted-api", "health:a=b"], "--http-restricted-api applies to the HTTP endpoint, which is off"),
        (["--grpc-header-forward-pattern", "("], "is not a valid regular expression"),
    ],
)  # fmt: skip
def test_serve_command_refuses_bad_flags_before_binding(tmp_path, flags, message):
    (tmp_path / "never.py").write_text("raise SystemExit('imported')\n")
    done = subprocess.run(
        [sys.executable, "-m", "embedtriton", "serve", "never:bind", *flags],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "imported" not in done.stderr
