"""gRPC endpoint extensions: shared memory, health, TLS, limits, admin RPCs and tracing."""

from __future__ import annotations

import ctypes
import os
import socket
import time

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
grpc = pytest.importorskip("grpc")

import tritonclient.utils.shared_memory as shm  # noqa: E402  (the [grpc] extra brings these)
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size  # noqa: E402

from embedtriton import GrpcOptions, InvalidArgumentError, ModelConfig, Server, ServerConfig, Tensor, batch  # noqa: E402
from embedtriton.frontends import shared_memory  # noqa: E402


def add_sub_inputs(a, b):
    inputs = [grpcclient.InferInput("a", list(a.shape), "FP32"), grpcclient.InferInput("b", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


@pytest.fixture(scope="module")
def endpoint(add_sub, add_sub_tensors, bind_double):
    seen = {}

    def identity(requests):
        for r in requests:
            seen["address"] = r["x"].__array_interface__["data"][0]  # where the model reads from
            seen["x"] = r["x"].copy()
        return [{"y": r["x"] * 2} for r in requests]

    @batch
    def echo(x):
        return {"y": x}

    server = Server(ServerConfig(model_control_mode="explicit"))  # clients load and unload (Triton's default: none)
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    bind_double(server, identity)

    @batch
    def scores(x):
        return {"probs": x, "codes": (x * 10).astype(np.int16), "flags": x > 0.5}

    server.bind(
        "Classes",
        scores,
        [Tensor(name="x", dtype=np.float32, shape=(4,))],
        [
            Tensor(name="probs", dtype=np.float32, shape=(4,), labels=["cat", "dog", "", "bird"]),
            Tensor(name="codes", dtype=np.int16, shape=(4,)),
            Tensor(name="flags", dtype=np.bool_, shape=(4,)),
        ],
        config=ModelConfig(max_batch_size=8),
    )
    server.bind(
        "Echo",
        echo,
        [Tensor(name="x", dtype=np.bytes_, shape=(-1,))],
        [Tensor(name="y", dtype=np.bytes_, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    with server:
        port = server.serve_grpc("127.0.0.1:0", max_message_bytes=4 * 1024 * 1024)
        server.seen = seen
        yield server, f"127.0.0.1:{port}"


# -- system shared memory ------------------------------------------------------------


def test_system_shared_memory_inputs_and_outputs(endpoint):
    server, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    x = np.arange(1024, dtype=np.float32).reshape(1, 1024)
    nbytes = x.nbytes
    key = f"/embedtriton-test-{time.monotonic_ns()}"
    handle = shm.create_shared_memory_region("io", key, 2 * nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("io", key, 2 * nbytes)
        status = client.get_system_shared_memory_status()
        assert status.regions["io"].key == key and status.regions["io"].byte_size == 2 * nbytes

        inp = grpcclient.InferInput("x", [1, 1024], "FP32")
        inp.set_shared_memory("io", nbytes)
        out = grpcclient.InferRequestedOutput("y")
        out.set_shared_memory("io", nbytes, offset=nbytes)
        result = client.infer("Double", [inp], outputs=[out])
        assert list(result.get_output("y").shape) == [1, 1024]
        y = shm.get_contents_as_numpy(handle, np.float32, [1, 1024], offset=nbytes)
        np.testing.assert_array_equal(y, x * 2)  # written straight into the client's region
        np.testing.assert_array_equal(server.seen["x"], x)
        region = server.endpoint("grpc").service.shm.get("io").mapping
        assert server.seen["address"] == ctypes.addressof(ctypes.c_char.from_buffer(region))  # no copy on the way in

        # a request that does not fit the region is refused; the server keeps serving
        big = grpcclient.InferInput("x", [1, 4096], "FP32")
        big.set_shared_memory("io", 4096 * 4)
        with pytest.raises(InferenceServerException, match="do not fit shared-memory region 'io'"):
            client.infer("Double", [big])
        unknown = grpcclient.InferInput("x", [1, 1024], "FP32")
        unknown.set_shared_memory("nope", nbytes)
        with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'nope'"):
            client.infer("Double", [unknown])
        with pytest.raises(InferenceServerException, match="'io' already in manager"):
            client.register_system_shared_memory("io", key, nbytes)
        garbled = grpc.insecure_channel(address).unary_unary(
            "/inference.GRPCInferenceService/SystemSharedMemoryUnregister"
        )
        with pytest.raises(grpc.RpcError) as err:  # a malformed request must not run as an empty one
            garbled(b"\xff\xff\xff garbage")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "io" in client.get_system_shared_memory_status().regions
        client.unregister_system_shared_memory("io")
        assert not client.get_system_shared_memory_status().regions
    finally:
        shm.destroy_shared_memory_region(handle)
    with pytest.raises(
        InferenceServerException, match="Unable to open shared memory region: '/embedtriton-does-not-exist'"
    ):
        client.register_system_shared_memory("gone", "/embedtriton-does-not-exist", 16)
    assert client.infer("AddSub", add_sub_inputs(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)))


def test_bytes_through_system_shared_memory(endpoint):
    """Triton's shm string client flow: BYTES in and out of a region, in Triton's
    length-prefixed layout; a region too small for the output fails that request only."""
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    x = np.array([[b"hello", b"", "w\u00f6rld".encode(), b"\x00\xff"]], dtype=np.object_)
    serialized = serialize_byte_tensor(x)
    nbytes = serialized_byte_size(serialized)
    key = f"/embedtriton-test-{time.monotonic_ns()}"
    handle = shm.create_shared_memory_region("strings", key, 2 * nbytes)
    try:
        shm.set_shared_memory_region(handle, [serialized])
        client.register_system_shared_memory("strings", key, 2 * nbytes)
        inp = grpcclient.InferInput("x", list(x.shape), "BYTES")
        inp.set_shared_memory("strings", nbytes)
        out = grpcclient.InferRequestedOutput("y")
        out.set_shared_memory("strings", nbytes, offset=nbytes)
        result = client.infer("Echo", [inp], outputs=[out])
        output = result.get_output("y")
        assert output.datatype == "BYTES" and list(output.shape) == [1, 4]
        assert output.parameters["shared_memory_byte_size"].int64_param == nbytes
        y = shm.get_contents_as_numpy(handle, np.object_, [1, 4], offset=nbytes)
        assert y.tolist() == x.tolist()

        small = grpcclient.InferRequestedOutput("y")
        small.set_shared_memory("strings", nbytes - 1, offset=nbytes)
        with pytest.raises(InferenceServerException, match=f"output 'y' needs {nbytes} bytes"):
            client.infer("Echo", [inp], outputs=[small])
        assert client.infer("Echo", [inp]).as_numpy("y").tolist() == x.tolist()  # still serving
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
    assert not client.get_system_shared_memory_status().regions


def test_classification_extension(endpoint):
    """``class_count`` on a requested output: per batch entry the top k as BYTES
    "value:index[:label]", labels from the output's declaration, as Triton answers."""
    server, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    x = np.array([[0.1, 0.7, 0.2, 0.7], [0.9, 0.0, 0.3, 0.05]], dtype=np.float32)
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    outputs = [
        grpcclient.InferRequestedOutput("probs", class_count=3),
        grpcclient.InferRequestedOutput("codes", class_count=10),
        grpcclient.InferRequestedOutput("flags"),
    ]
    result = client.infer("Classes", [inp], outputs=outputs)
    probs = result.as_numpy("probs")
    assert result.get_output("probs").datatype == "BYTES" and probs.shape == (2, 3)
    assert probs.tolist() == [  # ties keep the lower index first; index 2 has an empty label
        [b"0.700000:1:dog", b"0.700000:3:bird", b"0.200000:2"],
        [b"0.900000:0:cat", b"0.300000:2", b"0.050000:3:bird"],
    ]
    codes = result.as_numpy("codes")
    assert codes.shape == (2, 4)  # k is capped at the number of classes
    assert codes[1].tolist() == [b"9:0", b"3:2", b"0:1", b"0:3"]
    assert result.as_numpy("flags").dtype == np.bool_  # an output not asked as classes is unchanged
    assert server.model("Classes").config()["output"][0]["label_filename"] == "labels_0.txt"

    with pytest.raises(InferenceServerException, match="unsupported type 'BOOL'"):
        client.infer("Classes", [inp], outputs=[grpcclient.InferRequestedOutput("flags", class_count=1)])

    def raw(**params) -> grpc.RpcError:
        request = service_pb2.ModelInferRequest(model_name="Classes")
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
        request.raw_input_contents.append(x.tobytes())
        out = request.outputs.add(name="probs")
        for key, value in params.items():
            setattr(out.parameters[key], "int64_param" if isinstance(value, int) else "string_param", value)
        assert tensor.name == "x"
        with pytest.raises(grpc.RpcError) as err:
            grpc.insecure_channel(address).unary_unary("/inference.GRPCInferenceService/ModelInfer")(
                request.SerializeToString()
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return err.value

    assert "expected >= 0" in raw(classification=0).details()
    assert "expected int64_param" in raw(classification="3").details()
    both = raw(classification=2, shared_memory_region="r", shared_memory_byte_size=8)
    assert both.details() == "output can't set both 'shared_memory_region' and 'classification'"


def test_requested_outputs_named_twice(endpoint):
    """Triton returns an output named twice once; named twice with different parameters
    (where Triton would silently honour only one) it is refused."""
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    x = np.ones((1, 4), dtype=np.float32)
    inp = grpcclient.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    twice = [grpcclient.InferRequestedOutput("codes"), grpcclient.InferRequestedOutput("codes")]
    response = client.infer("Classes", [inp], outputs=twice).get_response()
    assert [o.name for o in response.outputs] == ["codes"]
    clash = [grpcclient.InferRequestedOutput("codes"), grpcclient.InferRequestedOutput("codes", class_count=2)]
    with pytest.raises(InferenceServerException, match="output 'codes' is requested twice with different parameters"):
        client.infer("Classes", [inp], outputs=clash)


def test_cuda_shared_memory_answers_as_a_gpu_less_triton(endpoint, monkeypatch):
    """Without a GPU, status lists no region and unregistering succeeds (every shared-memory
    client's routine cleanup, perf_analyzer's too); only registering fails, with Triton's wording."""
    monkeypatch.setattr(shared_memory, "cuda_devices", lambda: (0, "no GPU"))  # on a GPU machine too
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    status = client.get_cuda_shared_memory_status(as_json=True)
    assert status.get("regions", {}) == {}
    client.unregister_cuda_shared_memory()  # all: nothing to do, no error
    client.unregister_cuda_shared_memory("never-registered")  # as Triton: succeeds
    with pytest.raises(InferenceServerException) as info:
        client.register_cuda_shared_memory("gpu-in", b"\0" * 64, 0, 64)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "failed to register CUDA shared memory region: 'gpu-in', GPUs not supported" in info.value.message()
    assert "use system shared memory" in info.value.message()  # and what to do instead
    with pytest.raises(InferenceServerException) as info:
        client.get_cuda_shared_memory_status("never-registered")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert info.value.message() == "Unable to find cuda shared memory region: 'never-registered'"
    key = f"/embedtriton-cuda-{os.getpid()}"
    handle = shm.create_shared_memory_region("sys", key, 16)
    try:  # names are shared with system regions, as in Triton
        client.register_system_shared_memory("sys", key, 16)
        with pytest.raises(InferenceServerException) as info:
            client.get_cuda_shared_memory_status("sys")
        assert info.value.message() == (
            "The region named 'sys' is registered as system shared memory, not CUDA shared memory"
        )
        client.unregister_cuda_shared_memory("sys")  # not a CUDA region: left alone, as Triton does
        assert [r["name"] for r in client.get_system_shared_memory_status(as_json=True)["regions"].values()] == ["sys"]
    finally:
        client.unregister_system_shared_memory("sys")
        shm.destroy_shared_memory_region(handle)


def test_input_data_is_found_as_triton_finds_it(endpoint):
    """Raw contents go, in order, to the inputs with neither shared memory nor typed contents
    (so shared memory and raw mix); typed contents beside raw ones, or an input with no data,
    are refused in Triton's words."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    _, address = endpoint
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))
    client = grpcclient.InferenceServerClient(address)
    ones = np.ones((1, 1), np.float32)

    def request(*names: str) -> service_pb2.ModelInferRequest:
        r = service_pb2.ModelInferRequest(model_name="AddSub")
        for name in names:
            r.inputs.add(name=name, datatype="FP32", shape=[1, 1])
        return r

    r = request("a", "b")
    r.inputs[0].contents.fp32_contents.append(1.0)
    r.raw_input_contents.append((2 * ones).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(r)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'a' for model 'AddSub'"
    )
    r = request("a", "b")
    r.raw_input_contents.append(ones.tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(r)
    assert info.value.details() == "unable to find data for input tensor 'b' for model 'AddSub' in request."
    r = request("a", "b", "a")  # the last 'a' used to replace the first one silently
    r.raw_input_contents.extend([ones.tobytes()] * 3)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(r)
    assert info.value.details() == "input 'a' already exists in request"

    key = f"/embedtriton-mixed-{os.getpid()}"
    handle = shm.create_shared_memory_region("mixed", key, 4)
    try:
        shm.set_shared_memory_region(handle, [3 * ones])
        client.register_system_shared_memory("mixed", key, 4)
        r = request("a", "b")
        r.inputs[0].parameters["shared_memory_region"].string_param = "mixed"
        r.inputs[0].parameters["shared_memory_byte_size"].int64_param = 4
        r.raw_input_contents.append(ones.tobytes())  # the first raw content is b's
        reply = stub.ModelInfer(r)
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [4.0]  # a + b
        r.inputs[0].contents.fp32_contents.append(1.0)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(r)
        assert info.value.details() == (
            "unexpected 'content' provided when using shared memory for input tensor 'a' for model 'AddSub'"
        )
    finally:
        client.unregister_system_shared_memory("mixed")
        shm.destroy_shared_memory_region(handle)


# -- health, admin and settings -----------------------------------------------------


def test_grpc_health_follows_server_and_model_readiness(endpoint):
    server, address = endpoint
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
    SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert stub.Check(health_pb2.HealthCheckRequest()).status == SERVING
    assert stub.Check(health_pb2.HealthCheckRequest(service="Double")).status == SERVING
    with pytest.raises(grpc.RpcError) as info:
        stub.Check(health_pb2.HealthCheckRequest(service="Nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND

    watch = stub.Watch(health_pb2.HealthCheckRequest(service="Double"))
    assert next(watch).status == SERVING
    client = grpcclient.InferenceServerClient(address)
    client.unload_model("Double")  # RepositoryModelUnload
    try:
        assert not client.is_model_ready("Double")
        assert stub.Check(health_pb2.HealthCheckRequest(service="Double")).status == NOT_SERVING
        assert next(watch).status == NOT_SERVING  # Watch reports the change
        with pytest.raises(InferenceServerException):
            client.infer("Double", [_double_input()])
    finally:
        client.load_model("Double")  # RepositoryModelLoad
    assert client.is_model_ready("Double")
    assert next(watch).status == SERVING
    watch.cancel()
    assert client.infer("Double", [_double_input()]).as_numpy("y")[0, 0] == 2.0
    with pytest.raises(InferenceServerException, match="failed to load 'Nope', failed to poll from model repository"):
        client.load_model("Nope")  # Triton's words (and code: INTERNAL) for a name it does not have
    client.unload_model("Nope")  # Triton: unloading what is not loaded succeeds


def _double_input():
    inp = grpcclient.InferInput("x", [1, 1], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1), np.float32))
    return inp


def test_log_settings(endpoint):
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    before = client.get_log_settings(as_json=True)["settings"]
    assert before["log_error"]["bool_param"] is True
    try:
        after = client.update_log_settings({"log_verbose_level": 2, "log_info": True}, as_json=True)["settings"]
        assert after["log_verbose_level"]["uint32_param"] == 2 and after["log_info"]["bool_param"] is True
        with pytest.raises(InferenceServerException, match="log_file is fixed"):
            client.update_log_settings({"log_file": "/tmp/x.log"})
        with pytest.raises(InferenceServerException, match="log_format must be"):
            client.update_log_settings({"log_format": "fancy"})
    finally:
        client.update_log_settings({"log_verbose_level": 0, "log_info": False})


def test_trace_setting_without_tracing_is_a_clear_error(endpoint):
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    with pytest.raises(InferenceServerException, match="tracing is off"):
        client.get_trace_settings()


# -- limits and malformed input ------------------------------------------------------


def test_oversized_and_malformed_requests_get_status_codes(endpoint):
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    big = np.zeros((1, 2 * 1024 * 1024), np.float32)  # 8 MiB > the 4 MiB limit
    inp = grpcclient.InferInput("x", list(big.shape), "FP32")
    inp.set_data_from_numpy(big)
    with pytest.raises(InferenceServerException) as info:
        client.infer("Double", [inp])
    assert "RESOURCE_EXHAUSTED" in str(info.value.status())

    channel = grpc.insecure_channel(address)
    raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    with pytest.raises(grpc.RpcError) as err:
        raw(b"\xff\xff\xff garbage")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in err.value.details()
    unknown = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")
    with pytest.raises(grpc.RpcError) as err:
        unknown(b"")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED

    wrong = grpcclient.InferInput("x", [1, 4], "INT32")
    wrong.set_data_from_numpy(np.ones((1, 4), np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("Double", [wrong])
    assert "INVALID_ARGUMENT" in str(info.value.status()) and "INT32" in str(info.value)
    short = grpcclient.InferInput("x", [1, 4], "FP32")
    short._raw_content = b"\x00" * 3  # 3 bytes cannot fill 4 floats
    short._input.ClearField("contents")
    with pytest.raises(InferenceServerException, match="do not fill shape"):
        client.infer("Double", [short])
    assert client.infer("Double", [_double_input()]).as_numpy("y")[0, 0] == 2.0  # still serving


# -- TLS -------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_tls_and_client_certificates(certs, transport, add_sub, add_sub_tensors):
    read = lambda name: (certs / name).read_bytes()  # noqa: E731
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    with server:
        options = GrpcOptions(tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key"))
        port = server.serve_grpc(
            "127.0.0.1:0", options=options, tls_client_ca=str(certs / "ca.pem"), transport=transport
        )
        address = f"localhost:{port}"
        a = np.ones((1, 1), np.float32)
        client = grpcclient.InferenceServerClient(
            address, ssl=True, root_certificates=str(certs / "ca.pem"),
            private_key=str(certs / "client.key"), certificate_chain=str(certs / "client.pem"),
        )  # fmt: skip
        assert client.infer("AddSub", add_sub_inputs(a, a)).as_numpy("add")[0, 0] == 2.0

        no_cert = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=read("ca.pem")))
        with pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(no_cert).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # handshake refused: no client certificate

        plain = grpcclient.InferenceServerClient(address)
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
    with pytest.raises(Exception, match="TLS needs both"):
        Server().serve_grpc("127.0.0.1:0", tls_cert=str(certs / "server.pem"))


# -- endpoint settings as a GrpcOptions object -------------------------------------------


def test_grpc_options_object(add_sub, add_sub_tensors):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    with pytest.raises(InvalidArgumentError, match=r"unknown gRPC setting\(s\) \['tls'\]"):
        server.serve_grpc(tls=True)
    with pytest.raises(InvalidArgumentError, match="TLS needs both"):
        GrpcOptions(tls_cert="cert.pem")
    with server:
        assert server.serve_grpc(options=GrpcOptions(address=f"127.0.0.1:{port}", max_message_bytes=1 << 20)) == port
        assert grpcclient.InferenceServerClient(f"127.0.0.1:{port}").is_model_ready("AddSub")
        with pytest.raises(InvalidArgumentError, match="already serving gRPC"):
            server.serve_grpc("127.0.0.1:0")
    with pytest.raises(InferenceServerException):
        grpcclient.InferenceServerClient(f"127.0.0.1:{port}").is_server_live(client_timeout=2)


def test_int_and_colon_ports_bind_loopback(add_sub, add_sub_tensors):
    import urllib.request

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    grpc_port, metrics_port = free_port(), free_port()
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    with server:
        assert server.serve_grpc(grpc_port) == grpc_port  # an int port, as users type it
        assert server.endpoint("grpc").address == f"127.0.0.1:{grpc_port}"  # loopback, not every interface
        assert grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}").is_model_ready("AddSub")
        assert server.serve_metrics(f":{metrics_port}") == metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
            assert b"nv_inference_request_success" in reply.read()
        with pytest.raises(InvalidArgumentError, match="gRPC address must look like host:port"):
            server.serve_grpc("127.0.0.1:http")
