"""CUDA shared-memory registration over gRPC and HTTP as a GPU build of Triton answers it, on a
machine without a GPU: the device count and the native module's CUDA IPC calls are stood in for
(tests/unit/test_cuda_shared_memory.py checks the table itself; tests/gpu/test_cuda_shm.py runs
Triton's own cudashm clients on a GPU)."""

from __future__ import annotations

import base64
import gc
import json
import urllib.error
import urllib.request

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import InvalidArgumentError, ModelConfig, Server, Tensor  # noqa: E402
from embedtriton.backend.library import native  # noqa: E402
from embedtriton.frontends import shared_memory  # noqa: E402

HANDLE = bytes(range(64))
B64 = base64.b64encode(HANDLE)  # what tritonclient's cuda_shared_memory.get_raw_handle returns


class FakeCuda:
    """The native module, with its CUDA IPC calls stood in for (and recorded)."""

    def __init__(self):
        self.opened: list[tuple[bytes, int]] = []
        self.closed: list[int] = []
        self.next = 0x7F00_0000_0000

    def __getattr__(self, name):
        return getattr(native(), name)

    def cuda_ipc_open(self, handle, device):
        if handle.startswith(b"\xff"):
            raise InvalidArgumentError("cannot open the CUDA IPC handle on GPU 0: invalid argument")
        self.opened.append((handle, device))
        self.next += 1 << 24
        return self.next

    def cuda_ipc_close(self, ptr, device=0):
        self.closed.append(ptr)

    def cuda_allocation_size(self, ptr, device):
        return 1024


@pytest.fixture(scope="module")
def endpoints():
    server = Server()
    i32 = np.int32
    server.bind(
        "simple",
        lambda requests: [
            {"OUTPUT0": r["INPUT0"] + r["INPUT1"], "OUTPUT1": r["INPUT0"] - r["INPUT1"]} for r in requests
        ],
        [Tensor(name="INPUT0", dtype=i32, shape=(16,)), Tensor(name="INPUT1", dtype=i32, shape=(16,))],
        [Tensor(name="OUTPUT0", dtype=i32, shape=(16,)), Tensor(name="OUTPUT1", dtype=i32, shape=(16,))],
        ModelConfig(max_batch_size=8),
    )
    server.bind(
        "Names",
        lambda requests: [{"y": r["x"]} for r in requests],
        [Tensor(name="x", dtype=np.bytes_, shape=(-1,))],
        [Tensor(name="y", dtype=np.bytes_, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        grpc_port = server.serve_grpc("127.0.0.1:0")
        http_port = server.serve_http("127.0.0.1:0")
        yield f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"


@pytest.fixture
def cuda(monkeypatch, endpoints):
    """Two GPUs and stand-ins for the CUDA IPC calls; every region is unregistered after."""
    fake = FakeCuda()
    monkeypatch.setattr(shared_memory, "native", lambda: fake)
    monkeypatch.setattr(shared_memory, "cuda_devices", lambda: (2, ""))
    yield fake
    grpcclient.InferenceServerClient(endpoints[0]).unregister_cuda_shared_memory()


def test_one_region_table_for_grpc_and_http(endpoints, cuda):
    grpc_address, http_address = endpoints
    g = grpcclient.InferenceServerClient(grpc_address)
    h = httpclient.InferenceServerClient(http_address)
    g.register_cuda_shared_memory("in", B64, 1, 64)
    h.register_cuda_shared_memory("out", B64, 0, 1024)
    assert cuda.opened == [(HANDLE, 1), (HANDLE, 0)]
    regions = g.get_cuda_shared_memory_status().regions
    assert {n: (r.name, r.device_id, r.byte_size) for n, r in regions.items()} == {
        "in": ("in", 1, 64),
        "out": ("out", 0, 1024),
    }
    assert sorted(h.get_cuda_shared_memory_status(), key=lambda r: r["name"]) == [
        {"name": "in", "device_id": 1, "byte_size": 64},
        {"name": "out", "device_id": 0, "byte_size": 1024},
    ]
    assert h.get_cuda_shared_memory_status("out") == [{"name": "out", "device_id": 0, "byte_size": 1024}]
    assert h.get_system_shared_memory_status() == [] and not g.get_system_shared_memory_status().regions

    with pytest.raises(InferenceServerException) as info:
        g.register_cuda_shared_memory("out", B64, 0, 64)
    assert info.value.status() == "StatusCode.ALREADY_EXISTS"
    assert "shared memory region 'out' already in manager" in info.value.message()
    with pytest.raises(InferenceServerException, match="shared memory region 'in' already in manager"):
        h.register_cuda_shared_memory("in", B64, 0, 64)
    with pytest.raises(InferenceServerException, match="shared memory region 'in' already in manager"):
        h.register_system_shared_memory("in", "/never-opened", 64)  # names are shared by both kinds
    with pytest.raises(InferenceServerException) as info:
        g.get_system_shared_memory_status("in")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert info.value.message() == "The region named 'in' is registered as CUDA shared memory, not system shared memory"
    g.unregister_system_shared_memory("in")  # not a system region: left alone, as Triton does
    h.unregister_system_shared_memory()
    assert len(h.get_cuda_shared_memory_status()) == 2

    h.unregister_cuda_shared_memory("in")
    gc.collect()
    assert len(cuda.closed) == 1 and list(g.get_cuda_shared_memory_status(as_json=True)["regions"]) == ["out"]
    g.unregister_cuda_shared_memory()
    gc.collect()
    assert len(cuda.closed) == 2 and h.get_cuda_shared_memory_status() == []


def test_grpc_registration_checks_the_clients_numbers(endpoints, cuda):
    g = grpcclient.InferenceServerClient(endpoints[0])
    refusals = [
        (base64.b64encode(HANDLE[:63]), 0, 64, "raw_handle must be the 64 bytes of a cudaIpcMemHandle_t, not 63"),
        (B64, 2, 64, "device_id 2: this server sees 2 GPU(s)"),
        (B64, -1, 64, "device_id -1: this server sees 2 GPU(s)"),
        (base64.b64encode(b"\xff" * 64), 0, 64, "cannot open the CUDA IPC handle on GPU 0: invalid argument"),
    ]
    for raw, device, size, why in refusals:
        with pytest.raises(InferenceServerException) as info:
            g.register_cuda_shared_memory("r", raw, device, size)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert info.value.message() == f"failed to register shared memory region: invalid args ({why})"
    with pytest.raises(InferenceServerException) as info:
        g.register_cuda_shared_memory("r", B64, 0, 1025)
    assert info.value.message() == (
        "failed to register shared memory region 'r': invalid args (byte_size 1025 exceeds the 1024 bytes "
        "of the CUDA allocation)"
    )
    with pytest.raises(InferenceServerException, match="'region name' is necessary to register cuda shared memory"):
        g.register_cuda_shared_memory("", B64, 0, 64)
    assert len(cuda.opened) == 1 and g.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}


def _post(address, path, body):
    request = urllib.request.Request(f"http://{address}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["error"]


@pytest.mark.parametrize(
    "body, error",
    [
        ({"device_id": 0, "byte_size": 64}, "Shared memory register request has no 'raw_handle' field"),
        (
            {"raw_handle": B64.decode(), "device_id": 0, "byte_size": 64},
            "attempt to access non-existing object member 'b64'",
        ),
        ({"raw_handle": {}, "device_id": 0, "byte_size": 64}, "attempt to access non-existing object member 'b64'"),
        ({"raw_handle": {"b64": 7}, "device_id": 0, "byte_size": 64}, "attempt to access JSON non-string as string"),
        (
            {"raw_handle": {"b64": B64.decode()}, "device_id": 0},
            "attempt to access non-existing object member 'byte_size'",
        ),
        (
            {"raw_handle": {"b64": B64.decode()}, "byte_size": 64},
            "attempt to access non-existing object member 'device_id'",
        ),
        (
            {"raw_handle": {"b64": B64.decode()}, "device_id": -1, "byte_size": 64},
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            {"raw_handle": {"b64": B64.decode()}, "device_id": 0, "byte_size": 6.5},
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            {"raw_handle": {"b64": base64.b64encode(HANDLE[:48]).decode()}, "device_id": 0, "byte_size": 64},
            "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t",
        ),
        (
            {"raw_handle": {"b64": "not base64 at all!"}, "device_id": 0, "byte_size": 64},
            "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t",
        ),
    ],
)
def test_http_register_body_is_read_in_tritons_order_and_words(endpoints, cuda, body, error):
    status, answer = _post(endpoints[1], "/v2/cudasharedmemory/region/r/register", json.dumps(body).encode())
    assert (status, answer) == (400, error)
    assert cuda.opened == []


def test_http_register_without_a_name_or_padding(endpoints, cuda):
    body = {"raw_handle": {"b64": B64.decode()}, "device_id": 0, "byte_size": 64}
    status, answer = _post(endpoints[1], "/v2/cudasharedmemory/register", json.dumps(body).encode())
    assert (status, answer) == (400, "'region name' is necessary to register cuda shared memory region")
    body["raw_handle"]["b64"] = B64.decode().rstrip("=")  # Triton's decoder needs no padding
    assert _post(endpoints[1], "/v2/cudasharedmemory/region/r/register", json.dumps(body).encode())[0] == 200
    assert cuda.opened == [(HANDLE, 0)]


def test_without_a_gpu_cuda_registration_is_refused_first(endpoints, monkeypatch):
    monkeypatch.setattr(shared_memory, "cuda_devices", lambda: (0, "no GPU"))
    status, answer = _post(endpoints[1], "/v2/cudasharedmemory/region/r/register", b"{not json")
    assert status == 400 and answer.startswith("failed to register CUDA shared memory region: 'r', GPUs not supported")


# -- inference through CUDA regions, with host memory standing in for the GPU's ----------------------


class HostArray(np.ndarray):
    """A numpy view standing in for a DeviceArray: keeps its owner (the region) alive."""

    owner: object = None


class HostCuda(FakeCuda):
    """IPC handles open to host buffers (the handle's first byte picks one): the frontends'
    whole path through CUDA regions, with the "device" arrays as numpy views of those buffers."""

    def __init__(self, buffers):
        super().__init__()
        self.buffers = buffers  # handle's first byte -> uint8 array
        self.seen: list[tuple[int, tuple[int, ...], object, int]] = []

    def cuda_ipc_open(self, handle, device):
        self.opened.append((handle, device))
        return self.buffers[handle[0]].ctypes.data

    def cuda_allocation_size(self, ptr, device):
        return next(b.nbytes for b in self.buffers.values() if b.ctypes.data == ptr)

    def device_array(self, ptr, shape, dtype, device, owner):
        self.seen.append((ptr, tuple(shape), dtype, device))
        buffer = next(b for b in self.buffers.values() if b.ctypes.data <= ptr < b.ctypes.data + b.nbytes)
        dtype = np.dtype(np.uint8) if dtype is None else np.dtype(dtype)
        start = ptr - buffer.ctypes.data
        array = buffer[start : start + dtype.itemsize * int(np.prod(shape))].view(dtype).reshape(shape).view(HostArray)
        array.owner = owner
        return array


@pytest.fixture
def host_cuda(monkeypatch, endpoints):
    buffers = {i: np.zeros(256, np.uint8) for i in range(1, 4)}
    fake = HostCuda(buffers)
    monkeypatch.setattr(shared_memory, "native", lambda: fake)
    monkeypatch.setattr(shared_memory, "cuda_devices", lambda: (1, ""))
    yield fake
    grpcclient.InferenceServerClient(endpoints[0]).unregister_cuda_shared_memory()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_inputs_and_outputs_in_cuda_regions(endpoints, host_cuda, protocol):
    """As simple_{grpc,http}_cudashm_client.py use them: inputs read from the regions (the
    arrays handed to Triton are views at the region's address plus the offset), outputs written
    into them, their shape, datatype and byte size in the response."""
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(endpoints[0] if protocol == "grpc" else endpoints[1])
    a, b = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
    host_cuda.buffers[1][:64] = a.view(np.uint8)
    host_cuda.buffers[1][64:128] = b.view(np.uint8)
    for i, name in enumerate(("inputs", "out0", "out1"), start=1):
        client.register_cuda_shared_memory(name, base64.b64encode(bytes([i]) * 64), 0, 256)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("inputs", 64)
    inputs[1].set_shared_memory("inputs", 64, offset=64)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out0", 64)
    outputs[1].set_shared_memory("out1", 64, offset=128)
    result = client.infer("simple", inputs, outputs=outputs)

    np.testing.assert_array_equal(host_cuda.buffers[2][:64].view(np.int32), a + b)
    np.testing.assert_array_equal(host_cuda.buffers[3][128:192].view(np.int32), a - b)
    base = host_cuda.buffers[1].ctypes.data
    assert host_cuda.seen[:2] == [(base, (1, 16), np.int32, 0), (base + 64, (1, 16), np.int32, 0)]
    assert host_cuda.seen[2:] == [
        (host_cuda.buffers[2].ctypes.data, (64,), None, 0),
        (host_cuda.buffers[3].ctypes.data + 128, (64,), None, 0),
    ]
    for name in ("OUTPUT0", "OUTPUT1"):
        output = result.get_output(name)
        if protocol == "grpc":
            assert (list(output.shape), output.datatype) == ([1, 16], "INT32")
            assert output.parameters["shared_memory_byte_size"].int64_param == 64
        else:
            assert (output["shape"], output["datatype"]) == ([1, 16], "INT32")
            assert output["parameters"]["shared_memory_byte_size"] == 64 and "data" not in output

    wrong = module.InferInput("INPUT0", [1, 16], "INT32")
    wrong.set_shared_memory("inputs", 64, offset=224)
    with pytest.raises(
        InferenceServerException, match="Invalid offset \\+ byte size for shared memory region: 'inputs'"
    ):
        client.infer("simple", [wrong, inputs[1]])
    short = module.InferInput("INPUT0", [1, 16], "INT32")
    short.set_shared_memory("inputs", 60)
    with pytest.raises(
        InferenceServerException, match="input 'INPUT0': 60 bytes do not fill shape \\[1, 16\\] of INT32"
    ):
        client.infer("simple", [short, inputs[1]])
    names = module.InferInput("x", [1, 2], "BYTES")
    names.set_shared_memory("inputs", 16)
    with pytest.raises(InferenceServerException, match="BYTES tensors cannot be read from CUDA shared memory"):
        client.infer("Names", [names])
    names = module.InferInput("x", [1, 2], "BYTES")
    names.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=object))
    into = module.InferRequestedOutput("y")
    into.set_shared_memory("out0", 64)
    with pytest.raises(InferenceServerException, match="BYTES tensors cannot be written into CUDA shared memory"):
        client.infer("Names", [names], outputs=[into])
