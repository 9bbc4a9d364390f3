"""DLPack inputs and the GPU options' behaviour on a machine without a GPU."""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import (
    InstanceGroup,
    InternalError,
    InvalidArgumentError,
    ModelConfig,
    Server,
    ServerConfig,
    Tensor,
    UnsupportedError,
)
from embedtriton.triton.devices import cuda_devices


class DLPackOnly:
    """Exposes a host array only through the DLPack protocol (like a CPU torch/jax tensor)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


@pytest.fixture(scope="module")
def doubler(bind_double):
    seen = {}

    def double(requests):
        seen["address"] = requests[0]["x"].__array_interface__["data"][0]
        return [{"y": r["x"] * 2} for r in requests]

    server = Server()
    model = bind_double(server, double, max_batch_size=8)
    with server:
        yield model, seen


def test_dlpack_input_reaches_the_model_without_a_copy(doubler):
    model, seen = doubler
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = model.infer({"x": DLPackOnly(x)})
    np.testing.assert_array_equal(out["y"], x * 2)
    assert seen["address"] == x.__array_interface__["data"][0]  # the model read the caller's memory


def test_dlpack_input_is_released_after_the_request(doubler):
    model, _ = doubler
    x = np.ones((2, 4), np.float32)
    ref = weakref.ref(x)
    model.infer({"x": DLPackOnly(x)})
    del x

    def freed() -> bool:
        gc.collect()
        return ref() is None

    assert wait_for(freed), "the input is still held"  # Triton lets go of the request just after the response


def test_dlpack_input_async(doubler):
    model, _ = doubler

    async def call():
        return await model.infer_async({"x": DLPackOnly(np.full((1, 2), 3, np.float32))})

    assert asyncio.run(call())["y"].tolist() == [[6.0, 6.0]]


def test_bad_dlpack_inputs_get_clear_errors(doubler):
    model, _ = doubler
    with pytest.raises(InvalidArgumentError, match="not C-contiguous"):
        model.infer({"x": DLPackOnly(np.ones((4, 2), np.float32).T)})
    with pytest.raises(InvalidArgumentError, match="cannot be carried"):
        model.infer({"x": DLPackOnly(np.ones((1, 2), np.complex64))})

    class Broken:
        def __dlpack__(self, stream=None):
            raise BufferError("not exportable right now")

    with pytest.raises(InvalidArgumentError, match="__dlpack__\\(\\) failed: not exportable"):
        model.infer({"x": Broken()})
    assert model.infer({"x": np.ones((1, 1), np.float32)})["y"][0, 0] == 2.0  # still serving


def test_torch_cpu_tensors_go_through_dlpack(doubler):
    torch = pytest.importorskip("torch")
    model, seen = doubler
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    out = model.infer({"x": x})
    np.testing.assert_array_equal(out["y"], x.numpy() * 2)
    assert seen["address"] == x.data_ptr()


def test_output_device_values(doubler):
    model, _ = doubler
    with pytest.raises(InvalidArgumentError, match="output_device must be"):
        model.infer({"x": np.ones((1, 1), np.float32)}, output_device="tpu")
    assert model.infer({"x": np.ones((1, 1), np.float32)}, output_device="cpu")["y"][0, 0] == 2.0


no_gpu = pytest.mark.skipif(cuda_devices()[0] > 0, reason="checks the errors of a machine without a GPU")


@no_gpu
def test_gpu_options_without_a_gpu_are_clear_errors(doubler):
    model, _ = doubler
    with pytest.raises(UnsupportedError, match="output_device='gpu' needs a CUDA GPU, and this process sees none"):
        model.infer({"x": np.ones((1, 1), np.float32)}, output_device="gpu")
    server = Server()
    tensors = ([Tensor(name="x", dtype=np.float32, shape=(1,))], [Tensor(name="y", dtype=np.float32, shape=(1,))])
    with pytest.raises(UnsupportedError, match="InstanceGroup\\(kind='GPU'\\) needs a CUDA GPU"):
        server.bind("G", lambda r: r, *tensors, ModelConfig(instance_group=[InstanceGroup(kind="GPU", gpus=[0])]))
    with pytest.raises(UnsupportedError, match="device='gpu' needs a CUDA GPU"):
        server.bind("G", lambda r: r, [Tensor(name="x", dtype=np.float32, shape=(1,), device="gpu")], tensors[1])
    with pytest.raises(UnsupportedError, match="cuda_memory_pool_byte_size needs a CUDA GPU"):
        Server(ServerConfig(cuda_memory_pool_byte_size={0: 1 << 20})).start()
    with pytest.raises(InvalidArgumentError, match="device must be 'cpu' or 'gpu'"):
        Tensor(name="x", dtype=np.float32, shape=(1,), device="cuda:0")


def test_device_array_describes_device_memory_without_touching_it():
    """A DeviceArray is a view (pointer, shape, dtype, device): its protocols need no GPU until
    data moves, so they are checked here; tests/gpu moves the data."""
    from embedtriton import DeviceArray
    from embedtriton.backend.library import native

    owner = object()
    before = sys.getrefcount(owner)
    a = native().device_array(0x7F0000001000, (2, 3), np.float32, 0, owner)
    assert isinstance(a, DeviceArray)
    assert sys.getrefcount(owner) == before + 1  # the view keeps its owner alive
    assert (a.shape, a.dtype, a.device, a.data_ptr, a.nbytes) == ((2, 3), np.dtype(np.float32), 0, 0x7F0000001000, 24)
    assert repr(a) == "DeviceArray(shape=(2, 3), dtype=FP32, device=0)"
    assert a.__dlpack_device__() == (2, 0)  # kDLCUDA
    assert a.__cuda_array_interface__ == {
        "shape": (2, 3), "typestr": "<f4", "data": (0x7F0000001000, False), "version": 3, "strides": None,
    }  # fmt: skip
    capsule = a.__dlpack__(stream=1, max_version=(1, 0))
    assert type(capsule).__name__ == "PyCapsule"
    count = sys.getrefcount(a)
    del capsule  # never consumed: its destructor lets the array go
    assert sys.getrefcount(a) == count - 1
    raw = native().device_array(0x7F0000001000, (16,), None, 0, None)
    assert raw.dtype == np.dtype(np.uint8) and raw.nbytes == 16
    del a
    assert sys.getrefcount(owner) == before


@no_gpu
def test_a_device_array_cannot_reach_the_host_without_a_gpu():
    from embedtriton.backend.library import native

    a = native().device_array(0x7F0000001000, (4,), np.int32, 0, None)
    with pytest.raises(InternalError, match="the CUDA runtime is not loaded"):
        a.to_numpy()
    with pytest.raises(InvalidArgumentError, match="a CUDA IPC memory handle is 64 bytes"):
        native().cuda_ipc_open(b"short", 0)
    with pytest.raises(InvalidArgumentError, match="the CUDA runtime is not loaded"):
        native().cuda_ipc_open(bytes(64), 0)


def test_gpu_arrays_names_what_the_callable_gets():
    assert ModelConfig().gpu_arrays == "cupy"
    for kind in ("cupy", "torch", "dlpack"):
        assert ModelConfig(gpu_arrays=kind).gpu_arrays == kind
    with pytest.raises(InvalidArgumentError, match=r"gpu_arrays must be one of \['cupy', 'torch', 'dlpack'\]"):
        ModelConfig(gpu_arrays="jax")
