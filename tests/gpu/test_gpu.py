"""GPU tensors end to end on a real GPU (issue 26): GPU inputs reach the callable without a copy
(cupy, torch or DLPack), GPU outputs land in Triton's buffers device to device, output_device="gpu"
hands back DeviceArrays that own Triton's output memory, KIND_GPU instances, memory pools, and
pipelines (ensemble, BLS) whose intermediate tensors stay on the device.

Runs where a CUDA GPU, cupy and torch are present (tests/gpu/run_on_gpu.sh on the GPU machine);
skipped elsewhere, with the reason."""

from __future__ import annotations

import concurrent.futures as futures
import gc
import threading
import time

import numpy as np
import pytest

from embedtriton.triton.devices import cuda_devices

if cuda_devices()[0] == 0:
    pytest.skip(f"needs a CUDA GPU: {cuda_devices()[1]}", allow_module_level=True)
cupy = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

import embedtriton  # noqa: E402
from embedtriton import (  # noqa: E402
    DynamicBatcher,
    InstanceGroup,
    ModelConfig,
    Server,
    ServerConfig,
    Step,
    Tensor,
    batch,
)

F32 = np.float32


def t(name, shape=(-1,), dtype=F32, device="cpu"):
    return Tensor(name=name, dtype=dtype, shape=shape, device=device)


def identity(requests):
    return [{"y": r["x"]} for r in requests]


@pytest.fixture(scope="module")
def seen():
    return {}


@pytest.fixture(scope="module")
def server(seen):
    server = Server()

    def record(requests):  # what the callable got: types and device addresses
        x = requests[0]["x"]
        seen["type"] = type(x)
        seen["ptr"] = x.data.ptr if isinstance(x, cupy.ndarray) else x.data_ptr() if torch.is_tensor(x) else None
        return [{"y": r["x"]} for r in requests]

    unbatched = ModelConfig(batching=False)
    server.bind("identity", identity, [t("x")], [t("y")], unbatched)
    server.bind("record", record, [t("x")], [t("y")], unbatched)
    server.bind("record_torch", record, [t("x")], [t("y")], ModelConfig(batching=False, gpu_arrays="torch"))
    server.bind("record_dlpack", record, [t("x")], [t("y")], ModelConfig(batching=False, gpu_arrays="dlpack"))

    def torch_double(requests):
        return [{"y": r["x"] * 2} for r in requests]

    server.bind("torch_double", torch_double, [t("x")], [t("y")], ModelConfig(batching=False, gpu_arrays="torch"))

    def mixed(requests):
        r = requests[0]
        seen["mixed"] = (type(r["host"]), type(r["gpu"]), type(r["forced"]))
        return [{"y": cupy.asarray(r["host"]) + r["gpu"] + r["forced"]}]

    server.bind("mixed", mixed, [t("host"), t("gpu"), t("forced", device="gpu")], [t("y")], unbatched)

    def to_host(requests):
        return [{"y": cupy.asnumpy(r["x"]) if isinstance(r["x"], cupy.ndarray) else r["x"]} for r in requests]

    server.bind("to_host", to_host, [t("x")], [t("y")], unbatched)

    @batch
    def batched(x):
        seen.setdefault("batches", []).append((type(x), len(x)))
        return {"y": x * 3}

    server.bind(
        "batched", batched, [t("x", (4,))], [t("y", (4,))],
        ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=20000)),
    )  # fmt: skip

    def slow(requests):
        seen.setdefault("threads", set()).add(threading.get_ident())
        time.sleep(0.3)
        return [{"y": r["x"]} for r in requests]

    server.bind(
        "two_instances", slow, [t("x")], [t("y")],
        ModelConfig(batching=False, instance_group=[InstanceGroup(count=2, kind="GPU", gpus=[0])]),
    )  # fmt: skip

    kept = []

    def keeper(requests):
        kept.append(requests[0]["x"])  # a view of the request's GPU input, kept past the call
        return [{"y": r["x"]} for r in requests]

    server.bind("keeper", keeper, [t("x")], [t("y")], unbatched)
    seen["kept"] = kept

    # a pipeline: an ensemble of two callables, and a callable calling another (BLS)
    def double(requests):
        seen["double_in"] = type(requests[0]["x"])
        return [{"y": r["x"] * 2} for r in requests]

    def add_one(requests):
        seen["add_one_in"] = type(requests[0]["y"])
        return [{"z": r["y"] + 1} for r in requests]

    server.bind("double", double, [t("x")], [t("y")], unbatched)
    server.bind("add_one", add_one, [t("y")], [t("z")], unbatched)
    server.bind_ensemble(
        "pipeline", [Step("double", {"x": "IN"}, {"y": "mid"}), Step("add_one", {"y": "mid"}, {"z": "OUT"})],
        [t("IN")], [t("OUT")], ModelConfig(batching=False),
    )  # fmt: skip

    def outer(requests):
        x = requests[0]["x"]
        seen["outer_ptr"] = x.data.ptr
        inner = server.model("record").infer({"x": x}, output_device="gpu")["y"]
        seen["inner_result"] = type(inner)
        return [{"y": cupy.from_dlpack(inner) + 1}]

    server.bind("outer", outer, [t("x")], [t("y")], unbatched)

    def counting(requests):
        x = requests[0]["x"]
        for i in range(3):
            yield [{"y": x + i}]

    server.bind("counting", counting, [t("x")], [t("y")], ModelConfig(batching=False, decoupled=True))
    with server:
        yield server


def test_identity_returns_the_same_device_data_as_device_arrays(server):
    x = cupy.arange(1 << 20, dtype=cupy.float32)
    out = server.model("identity").infer({"x": x}, output_device="gpu")["y"]
    assert isinstance(out, embedtriton.DeviceArray)
    assert out.device == 0 and out.shape == (1 << 20,) and out.dtype == np.float32 and out.nbytes == 4 << 20
    y = cupy.from_dlpack(out)
    assert y.data.ptr == out.data_ptr  # the caller's array is Triton's output buffer: no copy out
    assert y.data.ptr != x.data.ptr
    assert bool(cupy.array_equal(x, y))
    assert cupy.asarray(out).data.ptr == out.data_ptr  # __cuda_array_interface__ too
    np.testing.assert_array_equal(out.to_numpy(), cupy.asnumpy(x))


def test_the_callable_sees_the_callers_device_pointer(server, seen):
    x = cupy.arange(1000, dtype=cupy.float32)
    out = server.model("record").infer({"x": x}, output_device="gpu")
    assert seen["type"] is cupy.ndarray
    assert seen["ptr"] == x.data.ptr  # one request: Triton's input buffer is the caller's memory
    assert bool(cupy.array_equal(cupy.from_dlpack(out["y"]), x))


def test_torch_in_cupy_model_and_cupy_in_torch_model(server, seen):
    x = torch.arange(64, dtype=torch.float32, device="cuda")
    out = server.model("record").infer({"x": x}, output_device="gpu")
    assert seen["type"] is cupy.ndarray and seen["ptr"] == x.data_ptr()
    assert torch.equal(torch.from_dlpack(out["y"]), x)

    c = cupy.arange(64, dtype=cupy.float32)
    out = server.model("record_torch").infer({"x": c}, output_device="gpu")
    assert seen["type"] is torch.Tensor
    assert seen["ptr"] == c.data.ptr
    assert bool(cupy.array_equal(cupy.from_dlpack(out["y"]), c))

    y = server.model("torch_double").infer({"x": x}, output_device="gpu")["y"]  # torch out, device to device
    assert torch.equal(torch.from_dlpack(y), x * 2)

    server.model("record_dlpack").infer({"x": c})
    assert seen["type"] is embedtriton.DeviceArray and seen["ptr"] is None


def test_mixed_host_and_gpu_inputs_and_a_host_input_placed_on_the_gpu(server, seen):
    host = np.full(8, 1, F32)
    gpu = cupy.full(8, 10, cupy.float32)
    forced = np.full(8, 100, F32)  # declared device="gpu": Triton's host data goes to the GPU for it
    out = server.model("mixed").infer({"host": host, "gpu": gpu, "forced": forced})
    assert seen["mixed"] == (np.ndarray, cupy.ndarray, cupy.ndarray)
    assert isinstance(out["y"], np.ndarray)  # a GPU output, copied once to the host caller
    np.testing.assert_array_equal(out["y"], np.full(8, 111, F32))


def test_host_outputs_reach_a_gpu_caller_and_gpu_outputs_a_host_caller(server):
    x = cupy.arange(100, dtype=cupy.float32)
    out = server.model("to_host").infer({"x": x}, output_device="gpu")["y"]  # the model returns numpy
    assert isinstance(out, embedtriton.DeviceArray)
    assert bool(cupy.array_equal(cupy.from_dlpack(out), x))
    host = server.model("identity").infer({"x": x})["y"]  # the model returns cupy, the caller wants numpy
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, cupy.asnumpy(x))
    out = server.model("identity").infer({"x": np.arange(5, dtype=F32)}, output_device="gpu")["y"]
    np.testing.assert_array_equal(out.to_numpy(), np.arange(5, dtype=F32))


def test_batched_gpu_requests_stay_on_the_gpu(server, seen):
    seen.pop("batches", None)
    xs = [cupy.full((1, 4), i, cupy.float32) for i in range(12)]
    with futures.ThreadPoolExecutor(12) as pool:
        outs = list(pool.map(lambda x: server.model("batched").infer({"x": x}, output_device="gpu")["y"], xs))
    for i, out in enumerate(outs):
        assert bool(cupy.array_equal(cupy.from_dlpack(out), cupy.full((1, 4), 3 * i, cupy.float32)))
    assert all(kind is cupy.ndarray for kind, _ in seen["batches"])
    assert max(n for _, n in seen["batches"]) > 1  # requests were batched, on the device


def test_infer_async_infer_many_and_stream_return_device_arrays(server):
    import asyncio

    x = cupy.arange(10, dtype=cupy.float32)

    async def call():
        return await server.model("identity").infer_async({"x": x}, output_device="gpu")

    out = asyncio.run(call())["y"]
    assert bool(cupy.array_equal(cupy.from_dlpack(out), x))
    many = server.model("identity").infer_many([{"x": x + i} for i in range(20)], output_device="gpu")
    for i, out in enumerate(many):
        assert isinstance(out["y"], embedtriton.DeviceArray)
        assert bool(cupy.array_equal(cupy.from_dlpack(out["y"]), x + i))
    steps = [cupy.from_dlpack(o["y"]) for o in server.model("counting").stream({"x": x}, output_device="gpu")]
    assert [bool(cupy.array_equal(s, x + i)) for i, s in enumerate(steps)] == [True, True, True]


def test_a_kind_gpu_model_runs_two_instances_at_once(server, seen):
    config = server.model("two_instances").config()
    assert config["instance_group"][0]["kind"] == "KIND_GPU" and config["instance_group"][0]["count"] == 2
    assert config["instance_group"][0]["gpus"] == [0]
    seen.pop("threads", None)
    x = cupy.ones(4, cupy.float32)
    start = time.perf_counter()
    with futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: server.model("two_instances").infer({"x": x}), range(2)))
    elapsed = time.perf_counter() - start
    assert len(seen["threads"]) == 2
    assert elapsed < 0.55, f"two 0.3 s requests took {elapsed:.2f} s: the instances did not run at once"


def test_an_ensemble_keeps_its_intermediate_tensor_on_the_device(server, seen):
    x = cupy.arange(16, dtype=cupy.float32)
    out = server.model("pipeline").infer({"IN": x}, output_device="gpu")["OUT"]
    assert seen["double_in"] is cupy.ndarray
    assert seen["add_one_in"] is cupy.ndarray  # the step between got GPU memory from Triton
    assert bool(cupy.array_equal(cupy.from_dlpack(out), x * 2 + 1))


def test_a_callable_calling_another_model_keeps_tensors_on_the_device(server, seen):
    x = cupy.arange(16, dtype=cupy.float32)
    out = server.model("outer").infer({"x": x}, output_device="gpu")["y"]
    assert seen["outer_ptr"] == x.data.ptr and seen["ptr"] == x.data.ptr  # both saw the caller's memory
    assert seen["inner_result"] is embedtriton.DeviceArray
    assert bool(cupy.array_equal(cupy.from_dlpack(out), x + 1))


def test_a_gpu_input_the_callable_keeps_stays_valid_until_it_lets_go(server, seen):
    kept = seen["kept"]
    kept.clear()
    x = cupy.arange(1 << 16, dtype=cupy.float32)
    expected = float(x.sum())
    server.model("keeper").infer({"x": x})
    del x
    gc.collect()
    scratch = [cupy.full(1 << 16, -1, cupy.float32) for _ in range(8)]  # would reuse freed memory
    assert float(kept[0].sum()) == expected
    del scratch
    kept.clear()  # the request is released now; the server stops without waiting for it
    gc.collect()


def test_memory_pools_are_set_up_on_the_device(tmp_path, own_process):
    if not own_process:  # Triton sets its pools up once per process: this runs in a fresh one
        return
    log = tmp_path / "triton.log"
    server = Server(
        ServerConfig(
            cuda_memory_pool_byte_size={0: 64 << 20}, pinned_memory_pool_byte_size=32 << 20,
            log_info=True, log_file=str(log),
        )
    )  # fmt: skip
    server.bind("identity", identity, [t("x")], [t("y")], ModelConfig(batching=False))
    with server:
        x = cupy.arange(256, dtype=cupy.float32)
        out = server.model("identity").infer({"x": x}, output_device="gpu")["y"]
        assert bool(cupy.array_equal(cupy.from_dlpack(out), x))
        metrics = server.metrics()
    text = log.read_text()
    assert "CUDA memory pool is created on device 0 with size 67108864" in text
    assert "Pinned memory pool is created at" in text and "with size 33554432" in text
    assert "nv_pinned_memory_pool_total_bytes 33554432" in metrics


def test_a_non_contiguous_gpu_output_is_a_clear_error(server):
    s = Server()

    def transposed(requests):
        return [{"y": cupy.ones((4, 3), cupy.float32).T} for _ in requests]

    s.bind("transposed", transposed, [t("x")], [t("y", (3, 4))], ModelConfig(batching=False))
    with s:
        with pytest.raises(embedtriton.InternalError, match="not C-contiguous"):
            s.model("transposed").infer({"x": cupy.ones(2, cupy.float32)})
        assert s.model("transposed").ready  # the server keeps serving


def test_the_gpu_example_runs(tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "gpu_zero_copy.py"
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the callable read the caller's memory: True" in done.stdout
    assert re.search(
        r"output: DeviceArray\(shape=\(1048576,\), dtype=FP32, device=0\), mean [-+]0\.000, std 1\.000", done.stdout
    )
    assert "torch in, torch out: [0.0, 2.5, 5.0, 7.5]" in done.stdout
