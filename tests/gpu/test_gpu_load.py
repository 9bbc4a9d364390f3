"""KIND_GPU instances behind the dynamic batcher under load, on a real GPU (issue 50): many
threads' cupy requests are batched on the device, each answer is its own request's, both
instances run, and ``output_device="gpu:N"`` places the results on GPU N.

Runs where a CUDA GPU and cupy are present (tests/gpu/run_on_gpu.sh on the GPU machine); skipped
elsewhere, with the reason."""

from __future__ import annotations

import concurrent.futures as futures
import threading

import numpy as np
import pytest

from embedtriton.triton.devices import cuda_devices

if cuda_devices()[0] == 0:
    pytest.skip(f"needs a CUDA GPU: {cuda_devices()[1]}", allow_module_level=True)
cupy = pytest.importorskip("cupy")

from embedtriton import (  # noqa: E402
    DynamicBatcher,
    InstanceGroup,
    ModelConfig,
    Server,
    Tensor,
    UnsupportedError,
    batch,
)

F32 = np.float32


@pytest.fixture(scope="module")
def loaded():
    seen: dict[str, list] = {"batches": [], "threads": [], "devices": []}
    lock = threading.Lock()

    @batch
    def triple(x):
        with lock:
            seen["batches"].append((type(x).__name__, len(x)))
            seen["threads"].append(threading.get_ident())
            seen["devices"].append(cupy.cuda.Device().id)
        return {"y": x * 3}

    server = Server()
    server.bind(
        "triple",
        triple,
        [Tensor(name="x", dtype=F32, shape=(8,))],
        [Tensor(name="y", dtype=F32, shape=(8,))],
        ModelConfig(
            max_batch_size=32,
            batcher=DynamicBatcher(max_queue_delay_microseconds=2000),
            instance_group=[InstanceGroup(count=2, kind="GPU", gpus=[0])],
        ),
    )
    with server:
        yield server, seen


def test_kind_gpu_instances_batch_many_threads_requests_on_the_device(loaded):
    server, seen = loaded
    model = server.model("triple")

    def call(k: int) -> bool:
        x = cupy.full((1, 8), float(k), dtype=cupy.float32)
        y = cupy.from_dlpack(model.infer({"x": x}, output_device="gpu")["y"])
        return bool(cupy.all(y == 3.0 * k))

    with futures.ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(call, range(64 * 20)))
    assert all(answers), f"{answers.count(False)} of {len(answers)} answers were another request's"
    sizes = [n for _, n in seen["batches"]]
    assert sum(sizes) == 64 * 20 and max(sizes) > 1, sizes[:50]  # every row once; Triton batched them
    assert {kind for kind, _ in seen["batches"]} == {"ndarray"}  # cupy arrays, never copied to numpy
    assert len(set(seen["threads"])) == 2  # both KIND_GPU instances ran
    assert set(seen["devices"]) == {0}


def test_output_device_gpu_n_places_the_results_on_that_gpu(loaded):
    server, _ = loaded
    model = server.model("triple")
    x = np.ones((2, 8), F32)  # host inputs: the outputs are placed on the GPU asked for
    out = model.infer({"x": x}, output_device="gpu:0")["y"]
    assert out.device == 0
    assert np.array_equal(out.to_numpy(), x * 3)
    count = cuda_devices()[0]
    with pytest.raises(UnsupportedError, match=rf"output_device='gpu:{count}' asks for GPU {count}"):
        model.infer({"x": x}, output_device=f"gpu:{count}")
