"""Triton's HTTP extensions besides inference, through stock ``tritonclient.http``: system and
CUDA shared memory (one region table with gRPC, as in Triton), repository index / load /
unload, logging and trace settings, server metadata; and a stop that does not wait for idle
keep-alive connections."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("opentelemetry.sdk.trace")

import tritonclient.utils.shared_memory as shm  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import ModelConfig, Server, ServerConfig, Tensor, Tracing, batch  # noqa: E402
from embedtriton.frontends import kserve, shared_memory  # noqa: E402


@pytest.fixture(scope="module")
def endpoints(add_sub, add_sub_tensors):
    server = Server(ServerConfig(model_control_mode="explicit", tracing=Tracing(tracer_provider=TracerProvider())))
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    server.bind(
        "Double",
        batch(lambda x: {"y": x * 2}),
        [Tensor(name="x", dtype=np.float32, shape=(-1,))],
        [Tensor(name="y", dtype=np.float32, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        http_port = server.serve_http("127.0.0.1:0")
        grpc_port = server.serve_grpc("127.0.0.1:0")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        yield server, client, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"


def test_system_shared_memory_over_http_shared_with_grpc(endpoints):
    server, client, grpc_address, _ = endpoints
    x = np.arange(256, dtype=np.float32).reshape(1, 256)
    key = f"/embedtriton-http-{time.monotonic_ns()}"
    handle = shm.create_shared_memory_region("io", key, 2 * x.nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("io", key, 2 * x.nbytes)
        assert client.get_system_shared_memory_status() == [
            {"name": "io", "key": key, "offset": 0, "byte_size": 2 * x.nbytes}
        ]
        assert client.get_system_shared_memory_status("io")[0]["name"] == "io"
        with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'nope'"):
            client.get_system_shared_memory_status("nope")
        with pytest.raises(InferenceServerException, match="'io' already in manager"):
            client.register_system_shared_memory("io", key, x.nbytes)

        inp = httpclient.InferInput("x", [1, 256], "FP32")
        inp.set_shared_memory("io", x.nbytes)
        out = httpclient.InferRequestedOutput("y")
        out.set_shared_memory("io", x.nbytes, offset=x.nbytes)
        result = client.infer("Double", [inp], outputs=[out])
        answer = result.get_output("y")
        assert answer["parameters"]["shared_memory_byte_size"] == x.nbytes
        assert answer["parameters"]["shared_memory_region"] == "io"
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 256], offset=x.nbytes), x * 2)

        # one region table for the server: registered over HTTP, named in a gRPC request
        shm.set_shared_memory_region(handle, [x + 1])
        grpc = grpcclient.InferenceServerClient(grpc_address)
        assert "io" in grpc.get_system_shared_memory_status().regions
        ginp = grpcclient.InferInput("x", [1, 256], "FP32")
        ginp.set_shared_memory("io", x.nbytes)
        np.testing.assert_array_equal(grpc.infer("Double", [ginp]).as_numpy("y"), (x + 1) * 2)

        big = httpclient.InferInput("x", [1, 1024], "FP32")
        big.set_shared_memory("io", 4096)
        with pytest.raises(InferenceServerException, match="do not fit shared-memory region 'io'"):
            client.infer("Double", [big])
        client.unregister_system_shared_memory("io")
        assert client.get_system_shared_memory_status() == []
        assert not grpc.get_system_shared_memory_status().regions
    finally:
        shm.destroy_shared_memory_region(handle)
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region: '/embedtriton-nope'"):
        client.register_system_shared_memory("gone", "/embedtriton-nope", 16)
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region: '../etc/passwd'"):
        client.register_system_shared_memory("evil", "../etc/passwd", 16)  # never a path outside /dev/shm


def test_cuda_shared_memory_answers_as_a_gpu_less_triton(endpoints, monkeypatch):
    monkeypatch.setattr(shared_memory, "cuda_devices", lambda: (0, "no GPU"))  # on a GPU machine too
    _, client, _, _ = endpoints
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_cuda_shared_memory()  # routine cleanup succeeds
    client.unregister_cuda_shared_memory("x")
    with pytest.raises(InferenceServerException, match="failed to register CUDA shared memory region: 'r'"):
        client.register_cuda_shared_memory("r", b"\0" * 64, 0, 16)
    with pytest.raises(InferenceServerException, match="Unable to find cuda shared memory region: 'r'"):
        client.get_cuda_shared_memory_status("r")


def test_repository_index_load_and_unload(endpoints):
    server, client, _, http_address = endpoints
    index = {(m["name"], m["version"]): m["state"] for m in client.get_model_repository_index()}
    assert index == {("AddSub", "1"): "READY", ("Double", "1"): "READY"}
    client.unload_model("Double")
    assert not client.is_model_ready("Double")
    assert {m["name"] for m in client.get_model_repository_index()} == {"AddSub", "Double"}  # still bound
    ready_only = urllib.request.Request(f"http://{http_address}/v2/repository/index", b'{"ready": true}')
    with urllib.request.urlopen(ready_only) as answer:
        assert json.loads(answer.read()) == [{"name": "AddSub", "version": "1", "state": "READY"}]
    client.load_model("Double", config='{"max_batch_size": 4}')
    assert client.is_model_ready("Double") and client.get_model_config("Double")["max_batch_size"] == 4
    with pytest.raises(InferenceServerException, match="failed to load 'Nope', failed to poll from model repository"):
        client.load_model("Nope")
    with pytest.raises(InferenceServerException) as refused:  # an upload: Triton 2.51's poll failure, 500
        client.load_model("Double", config='{"max_batch_size": 2}', files={"file:1/model.py": b"evil"})
    assert refused.value.status() == "500"
    assert refused.value.message() == "failed to load 'Double', failed to poll from model repository"
    assert client.get_model_config("Double")["max_batch_size"] == 4  # what served before serves on
    client.unload_model("Nope")  # as Triton: nothing to unload is success


def test_logging_and_trace_settings(endpoints):
    _, client, _, _ = endpoints
    assert client.get_log_settings()["log_error"] is True
    try:
        after = client.update_log_settings({"log_verbose_level": 1, "log_info": True})
        assert after["log_verbose_level"] == 1 and after["log_info"] is True
        with pytest.raises(InferenceServerException, match="log_file is fixed"):
            client.update_log_settings({"log_file": "/tmp/x.log"})
    finally:
        client.update_log_settings({"log_verbose_level": 0, "log_info": False})
    settings = client.get_trace_settings()
    assert settings["trace_level"] == ["TIMESTAMPS"]
    try:
        changed = client.update_trace_settings(settings={"trace_rate": "5", "trace_level": ["OFF"]})
        assert changed["trace_rate"] == "5" and changed["trace_level"] == ["OFF"]
        with pytest.raises(InferenceServerException, match="trace setting 'trace_file' is not supported"):
            client.update_trace_settings(settings={"trace_file": "/tmp/t.json"})
        with pytest.raises(InferenceServerException, match="server-wide"):
            client.get_trace_settings(model_name="Double")
    finally:
        client.update_trace_settings(settings={"trace_rate": None, "trace_level": ["TIMESTAMPS"]})
    assert client.get_trace_settings()["trace_rate"] == "1"


def test_server_metadata_lists_the_extensions_served(endpoints, monkeypatch):
    _, client, grpc_address, _ = endpoints
    monkeypatch.setattr(kserve, "cuda_devices", lambda: (0, "no GPU"))
    extensions = set(client.get_server_metadata()["extensions"])
    assert {"binary_tensor_data", "system_shared_memory", "model_repository", "trace", "logging"} <= extensions
    assert "cuda_shared_memory" not in extensions  # only where the server sees a GPU
    monkeypatch.setattr(kserve, "cuda_devices", lambda: (1, ""))
    assert "cuda_shared_memory" in client.get_server_metadata()["extensions"]
    assert "cuda_shared_memory" in grpcclient.InferenceServerClient(grpc_address).get_server_metadata().extensions


def test_stop_does_not_wait_for_idle_keep_alive_connections(add_sub, add_sub_tensors):
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    server.start()
    port = server.serve_http("127.0.0.1:0")
    idle = socket.create_connection(("127.0.0.1", port))
    idle.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert idle.recv(4096).startswith(b"HTTP/1.1 200")  # answered; the connection stays open, idle
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 5  # exit_timeout_secs is 30: an idle connection is not work
    assert idle.recv(4096) == b""  # and it was closed
    idle.close()


def test_https_and_client_certificates(certs, add_sub, add_sub_tensors):
    import ssl
    import urllib.error

    from embedtriton import HttpOptions, InvalidArgumentError

    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    with server:
        options = HttpOptions(tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key"))
        port = server.serve_http("127.0.0.1:0", options=options, tls_client_ca=str(certs / "ca.pem"))
        url = f"https://localhost:{port}/v2/health/ready"
        trusted = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):  # no client certificate
            urllib.request.urlopen(url, context=trusted, timeout=10)
        trusted.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
        with urllib.request.urlopen(url, context=trusted, timeout=10) as answer:
            assert answer.status == 200
        client = httpclient.InferenceServerClient(
            f"localhost:{port}",
            ssl=True,
            ssl_options={"ca_certs": str(certs / "ca.pem"), "certfile": str(certs / "client.pem"),
                         "keyfile": str(certs / "client.key")},
        )  # fmt: skip
        assert client.is_model_ready("AddSub")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:  # plain HTTP on HTTPS: cut
            plain.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"HTTP/1.1 200" not in plain.recv(4096)
    with pytest.raises(InvalidArgumentError, match="HTTPS needs both tls_cert and tls_key"):
        HttpOptions(tls_cert="x.pem")
    with pytest.raises(InvalidArgumentError, match="unknown HTTP setting"):
        Server().serve_http("127.0.0.1:0", tls_certificate="x.pem")
