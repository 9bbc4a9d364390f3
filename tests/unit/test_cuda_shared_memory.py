"""CUDA shared-memory regions without a GPU: the region table, the checks of a client's numbers
and Triton's words, the lifetime of an opened IPC handle, and requests naming CUDA regions,
with a stand-in for the native module's CUDA calls (tests/gpu/test_cuda_shm.py runs Triton's
own clients on a GPU)."""

from __future__ import annotations

import base64
import gc
import os

import numpy as np
import pytest

from embedtriton import AlreadyExistsError, InvalidArgumentError, NotFoundError, UnavailableError
from embedtriton.frontends import kserve
from embedtriton.frontends import shared_memory as sm
from embedtriton.frontends.http import extensions
from embedtriton.frontends.shared_memory import CUDA, SYSTEM, SharedMemory

HANDLE = bytes(range(64))  # a cudaIpcMemHandle_t's 64 bytes
ALLOCATION = 4096  # the bytes of the client's allocation behind every handle


class FakeDeviceArray:
    """What ``_native.device_array`` returns: a view of device memory keeping its owner alive."""

    def __init__(self, ptr, shape, dtype, device, owner):
        self.data_ptr, self.shape, self.device, self.owner = ptr, tuple(shape), device, owner
        self.dtype = np.dtype(np.uint8) if dtype is None else np.dtype(dtype)
        self.nbytes = self.dtype.itemsize * int(np.prod(self.shape))


class FakeMapping:
    truncated = False

    def close(self):
        pass


class FakeCuda:
    """The native module's CUDA IPC calls, recorded (and a mapping for system regions)."""

    def __init__(self):
        self.opened: list[tuple[bytes, int]] = []
        self.closed: list[int] = []
        self.next = 0x7F00_0000_0000

    def map_shared(self, fd, length):  # system regions: a stand-in for the mapping
        return FakeMapping()

    def cuda_ipc_open(self, handle, device):
        if handle.startswith(b"\xff"):
            raise InvalidArgumentError("cannot open the CUDA IPC handle on GPU 0: invalid argument")
        self.opened.append((handle, device))
        self.next += 1 << 24
        return self.next

    def cuda_ipc_close(self, ptr, device=0):
        self.closed.append(ptr)

    def cuda_allocation_size(self, ptr, device):
        return ALLOCATION

    def device_array(self, ptr, shape, dtype, device, owner):
        return FakeDeviceArray(ptr, shape, dtype, device, owner)


@pytest.fixture
def cuda(monkeypatch):
    """Two GPUs and the stand-in native module, for the shared-memory module."""
    fake = FakeCuda()
    monkeypatch.setattr(sm, "native", lambda: fake)
    monkeypatch.setattr(sm, "cuda_devices", lambda: (2, ""))
    return fake


@pytest.fixture
def table(cuda):
    shm = SharedMemory()
    yield shm
    shm.clear()


def test_register_status_unregister(table, cuda):
    table.register_cuda("in", HANDLE, 1, 64)
    assert cuda.opened == [(HANDLE, 1)]
    [region] = table.status("", CUDA)
    assert region.status() == {"name": "in", "device_id": 1, "byte_size": 64}
    assert table.status("in", CUDA) == [region]
    assert table.status("", SYSTEM) == []
    with pytest.raises(NotFoundError) as info:
        table.status("in", SYSTEM)
    assert str(info.value) == "The region named 'in' is registered as CUDA shared memory, not system shared memory"
    with pytest.raises(NotFoundError) as info:
        table.status("nope", CUDA)
    assert str(info.value) == "Unable to find cuda shared memory region: 'nope'"
    table.unregister("in", SYSTEM)  # not a system region: left alone, as Triton does
    assert table.status("", CUDA) == [region]
    ptr = region.ptr
    del region
    table.unregister("in", CUDA)
    gc.collect()
    assert cuda.closed == [ptr] and table.status("", CUDA) == []


def test_names_are_shared_with_system_regions(table, cuda, tmp_path):
    table.register_cuda("r", HANDLE, 0, 64)
    with pytest.raises(AlreadyExistsError, match="shared memory region 'r' already in manager"):
        table.register("r", "/never-opened", 0, 16)  # refused before any file is opened
    with pytest.raises(AlreadyExistsError, match="shared memory region 'r' already in manager"):
        table.register_cuda("r", HANDLE, 0, 64)
    assert len(cuda.opened) == 1  # the second handle was never opened


def test_a_system_region_is_not_a_cuda_one(table):
    key = f"/embedtriton-cuda-unit-{os.getpid()}"
    fd = os.open(f"/dev/shm/{key[1:]}", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 64)
        table.register("sys", key, 0, 64)
        with pytest.raises(NotFoundError) as info:
            table.status("sys", CUDA)
        assert str(info.value) == "The region named 'sys' is registered as system shared memory, not CUDA shared memory"
        table.unregister("sys", CUDA)  # left alone
        assert [r.name for r in table.status("", SYSTEM)] == ["sys"]
        table.unregister("", CUDA)  # all CUDA regions: the system one stays
        assert [r.name for r in table.status("", SYSTEM)] == ["sys"]
    finally:
        table.clear()
        os.close(fd)
        os.unlink(f"/dev/shm/{key[1:]}")


@pytest.mark.parametrize(
    "handle, device_id, byte_size, reason",
    [
        (HANDLE[:63], 0, 64, "raw_handle must be the 64 bytes of a cudaIpcMemHandle_t, not 63"),
        (HANDLE + b"\0", 0, 64, "raw_handle must be the 64 bytes of a cudaIpcMemHandle_t, not 65"),
        (b"", 0, 64, "raw_handle must be the 64 bytes of a cudaIpcMemHandle_t, not 0"),
        (HANDLE, -1, 64, "device_id -1: this server sees 2 GPU(s)"),
        (HANDLE, 2, 64, "device_id 2: this server sees 2 GPU(s)"),
        (HANDLE, 0, -1, "byte_size -1 is negative"),
    ],
)
def test_a_clients_numbers_are_checked_before_cuda_sees_them(table, cuda, handle, device_id, byte_size, reason):
    with pytest.raises(InvalidArgumentError) as info:
        table.register_cuda("r", handle, device_id, byte_size)
    assert str(info.value) == f"failed to register shared memory region: invalid args ({reason})"
    assert cuda.opened == [] and table.status("", CUDA) == []


def test_a_handle_that_does_not_open(table, cuda):
    with pytest.raises(InvalidArgumentError) as info:
        table.register_cuda("r", b"\xff" * 64, 0, 64)
    assert str(info.value) == (
        "failed to register shared memory region: invalid args "
        "(cannot open the CUDA IPC handle on GPU 0: invalid argument)"
    )
    assert table.status("", CUDA) == []


def test_byte_size_beyond_the_allocation_is_refused_and_the_handle_closed(table, cuda):
    with pytest.raises(InvalidArgumentError) as info:
        table.register_cuda("r", HANDLE, 0, ALLOCATION + 1)
    assert str(info.value) == (
        f"failed to register shared memory region 'r': invalid args (byte_size {ALLOCATION + 1} exceeds "
        f"the {ALLOCATION} bytes of the CUDA allocation)"
    )
    assert len(cuda.closed) == 1 and table.status("", CUDA) == []
    table.register_cuda("r", HANDLE, 0, ALLOCATION)  # the whole allocation is fine


def test_a_nameless_region_is_refused(table, cuda):
    with pytest.raises(InvalidArgumentError, match="'region name' is necessary to register cuda shared memory region"):
        table.register_cuda("", HANDLE, 0, 64)
    assert cuda.opened == []


def test_without_a_gpu_registering_is_refused_as_triton_without_gpu_support(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(sm, "native", lambda: fake)
    monkeypatch.setattr(sm, "cuda_devices", lambda: (0, "no CUDA runtime"))
    with pytest.raises(InvalidArgumentError) as info:
        SharedMemory().register_cuda("gpu-in", HANDLE, 0, 64)
    assert str(info.value) == (
        "failed to register CUDA shared memory region: 'gpu-in', GPUs not supported "
        "(this server sees no GPU: use system shared memory or send tensors in the request)"
    )
    assert fake.opened == []


def test_unregistering_a_region_in_use_closes_it_when_the_last_request_lets_go(table, cuda):
    table.register_cuda("r", HANDLE, 0, 256)
    decoded = kserve.Decoded(object())
    view = kserve.shm_input(decoded, table, ("r", 0, 64), "x", "FP32", (16,))
    ptr = view.owner.ptr
    table.unregister("r", CUDA)
    gc.collect()
    assert cuda.closed == []  # a request still reads it: not closed under it
    del decoded
    gc.collect()
    assert cuda.closed == []  # the view (Triton's input) still holds it
    del view
    gc.collect()
    assert cuda.closed == [ptr]


def test_clear_forgets_every_region(table, cuda):
    table.register_cuda("a", HANDLE, 0, 64)
    table.register_cuda("b", HANDLE, 1, 64)
    table.clear()
    gc.collect()
    assert table.status("", CUDA) == [] and len(cuda.closed) == 2


# -- requests naming CUDA regions ------------------------------------------------------------------


def test_an_input_in_cuda_shared_memory_is_a_device_view(table):
    table.register_cuda("r", HANDLE, 1, 256)
    region = table.get("r")
    decoded = kserve.Decoded(object())
    array = kserve.shm_input(decoded, table, ("r", 64, 64), "x", "INT32", (1, 16))
    assert (array.data_ptr, array.shape, array.dtype, array.device) == (region.ptr + 64, (1, 16), np.int32, 1)
    assert array.owner is region and decoded.regions == [region]
    decoded.check_regions()  # nothing to check on a device


@pytest.mark.parametrize(
    "offset, size, message",
    [
        (256, 4, "Invalid offset for shared memory region: 'r'"),
        (-4, 4, "Invalid offset for shared memory region: 'r'"),
        (0, 260, "Invalid offset + byte size for shared memory region: 'r'"),
        (252, 8, "Invalid offset + byte size for shared memory region: 'r'"),
        (0, -4, "Invalid offset + byte size for shared memory region: 'r'"),
    ],
)
def test_cuda_tensors_must_fit_the_region_in_tritons_words(table, offset, size, message):
    table.register_cuda("r", HANDLE, 0, 256)
    with pytest.raises(InvalidArgumentError) as info:
        kserve.shm_input(kserve.Decoded(object()), table, ("r", offset, size), "x", "UINT8", (size,))
    assert str(info.value) == message
    with pytest.raises(InvalidArgumentError) as info:
        kserve.requested_outputs(kserve.Decoded(object()), table, [("y", _shm("r", size, offset))])
    assert str(info.value) == message


def test_a_cuda_input_must_fill_its_shape(table):
    table.register_cuda("r", HANDLE, 0, 256)
    with pytest.raises(InvalidArgumentError) as info:
        kserve.shm_input(kserve.Decoded(object()), table, ("r", 0, 60), "x", "INT32", (1, 16))
    assert str(info.value) == "input 'x': 60 bytes do not fill shape [1, 16] of INT32"


def test_bytes_tensors_are_refused_in_cuda_shared_memory(table):
    table.register_cuda("r", HANDLE, 0, 256)
    with pytest.raises(InvalidArgumentError) as info:
        kserve.shm_input(kserve.Decoded(object()), table, ("r", 0, 16), "x", "BYTES", (2,))
    assert str(info.value) == (
        "input 'x': BYTES tensors cannot be read from CUDA shared memory (region 'r'); "
        "send them in the request or in system shared memory"
    )
    model = FakeModel({"y": "INT32", "names": "BYTES"})
    kserve.requested_outputs(kserve.Decoded(model), table, [("y", _shm("r", 64))])
    with pytest.raises(InvalidArgumentError) as info:
        kserve.requested_outputs(kserve.Decoded(model), table, [("y", {}), ("names", _shm("r", 64))])
    assert str(info.value) == (
        "output 'names': BYTES tensors cannot be written into CUDA shared memory; "
        "ask for it in the response or in system shared memory"
    )


def test_outputs_in_cuda_shared_memory_are_device_buffers(table):
    table.register_cuda("r", HANDLE, 0, 256)
    region = table.get("r")
    model = FakeModel({"y": "FP32", "z": "FP32"})
    decoded = kserve.Decoded(model)
    kserve.requested_outputs(decoded, table, [("y", {}), ("z", _shm("r", 64, 128))])
    outputs = decoded.request.outputs
    assert list(outputs) == ["y", "z"] and outputs["y"] is None
    z = outputs["z"]
    assert (z.data_ptr, z.shape, z.dtype, z.owner) == (region.ptr + 128, (64,), np.uint8, region)
    assert decoded.in_shm == {"z"} and decoded.regions == [region]
    assert model.asked == 1  # the metadata is read once, for the outputs in CUDA shared memory


def test_an_output_datatype_of_a_device_array():
    assert kserve.output_datatype(np.zeros(2, np.int32)) == "INT32"
    array = FakeDeviceArray(0, (2,), np.float16, 0, None)
    assert kserve.output_datatype(array) == "FP16"
    array.dtype = "BF16"  # numpy has no bfloat16: a DeviceArray names it
    assert kserve.output_datatype(array) == "BF16"


class FakeModel:
    def __init__(self, outputs):
        self.outputs = outputs
        self.asked = 0

    def metadata(self):
        self.asked += 1
        return {"outputs": [{"name": n, "datatype": d, "shape": [-1]} for n, d in self.outputs.items()]}


def _shm(region, size, offset=0):
    return {"shared_memory_region": region, "shared_memory_byte_size": size, "shared_memory_offset": offset}


# -- the HTTP endpoint's register route, without a server ---------------------------------------------


def _register(table, enabled=True, draining=False, name="r"):
    body = b'{"raw_handle": {"b64": "%s"}, "device_id": 0, "byte_size": 64}' % base64.b64encode(HANDLE)
    rest = ["region", name, "register"] if name else ["register"]
    return extensions.shared_memory(table, enabled, draining, "cudasharedmemory", "POST", rest, body)


def test_http_register_route(table, cuda):
    with pytest.raises(InvalidArgumentError) as info:
        _register(table, enabled=False)
    assert str(info.value) == "CUDA shared memory is turned off on this endpoint (HttpOptions.shared_memory)"
    with pytest.raises(UnavailableError, match="the server is stopping"):
        _register(table, draining=True)
    assert cuda.opened == []
    _register(table)
    assert cuda.opened == [(HANDLE, 0)] and [r.status() for r in table.status("", CUDA)] == [
        {"name": "r", "device_id": 0, "byte_size": 64}
    ]
