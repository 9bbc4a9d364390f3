"""CUDA shared memory over gRPC and HTTP on a real GPU (issue 26): Triton's own
``simple_grpc_cudashm_client.py`` and ``simple_http_cudashm_client.py`` (tests/upstream/client,
unchanged) run as separate processes against an embedtriton server serving their "simple" model.
Each allocates four GPU buffers, registers their CUDA IPC handles, asks for OUTPUT0 = INPUT0 +
INPUT1 and OUTPUT1 = INPUT0 - INPUT1 with every tensor in those buffers, reads the sums and
differences back from the GPU, prints the region status and unregisters them.

Also checked: the model reads its inputs straight from the client's buffers (zero copy), and
every IPC handle the server opened is closed once the client unregistered its regions.

Runs where a CUDA GPU is present and tritonclient's cuda_shared_memory imports (it needs
cuda-python); skipped elsewhere, with the reason. (A handle cannot be registered from this
process itself: CUDA refuses to open an IPC handle in the process that exported it.)"""

from __future__ import annotations

import gc
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from embedtriton.triton.devices import cuda_devices

if cuda_devices()[0] == 0:
    pytest.skip(f"needs a CUDA GPU: {cuda_devices()[1]}", allow_module_level=True)

from embedtriton import ModelConfig, Server, Tensor  # noqa: E402
from embedtriton.frontends import shared_memory  # noqa: E402

CLIENTS = Path(__file__).resolve().parents[1] / "upstream" / "client"


@pytest.fixture(scope="module", autouse=True)
def cudashm_clients_run_here():
    """The stock clients import tritonclient.utils.cuda_shared_memory (cuda-python): in a
    process of their own, as they will run."""
    done = subprocess.run(
        [sys.executable, "-c", "import tritonclient.grpc, tritonclient.http, tritonclient.utils.cuda_shared_memory"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        pytest.skip(f"tritonclient's cuda_shared_memory does not import: {done.stderr.strip()[-500:]}")


@pytest.fixture(scope="module")
def served():
    """An embedtriton server with Triton's "simple" model on free gRPC and HTTP ports; what the
    model saw of its inputs, and how many CUDA IPC handles the server closed."""
    seen: dict[str, object] = {}
    closed: list[int] = []
    original_close = shared_memory._ipc_close

    def counting_close(close, ptr, device_id):  # every region's finalizer (bound when it is registered)
        closed.append(ptr)
        original_close(close, ptr, device_id)

    server = Server()

    def simple(requests):  # works on cupy (GPU inputs, the default) and numpy arrays alike
        a = requests[0]["INPUT0"]
        seen["type"] = f"{type(a).__module__}.{type(a).__name__}"
        seen["ptr"] = _device_pointer(a)
        region = shared_memory.regions_of(server).get("input0_data")
        seen["region_ptr"] = getattr(region, "ptr", None)
        return [{"OUTPUT0": r["INPUT0"] + r["INPUT1"], "OUTPUT1": r["INPUT0"] - r["INPUT1"]} for r in requests]

    int32 = np.int32
    server.bind(
        "simple",
        simple,
        [Tensor(name="INPUT0", dtype=int32, shape=(16,)), Tensor(name="INPUT1", dtype=int32, shape=(16,))],
        [Tensor(name="OUTPUT0", dtype=int32, shape=(16,)), Tensor(name="OUTPUT1", dtype=int32, shape=(16,))],
        ModelConfig(max_batch_size=8),
    )
    shared_memory._ipc_close = counting_close
    try:
        with server:
            grpc_port = server.serve_grpc("127.0.0.1:0")
            http_port = server.serve_http("127.0.0.1:0")
            yield {"grpc": f"127.0.0.1:{grpc_port}", "http": f"127.0.0.1:{http_port}", "seen": seen,
                   "closed": closed, "server": server}  # fmt: skip
    finally:
        shared_memory._ipc_close = original_close


def _device_pointer(array):
    interface = getattr(array, "__cuda_array_interface__", None)
    return interface["data"][0] if interface else None


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_stock_cudashm_client(served, protocol):
    """Triton's simple_{grpc,http}_cudashm_client.py, unchanged, passes against embedtriton."""
    served["seen"].clear()
    closed_before = len(served["closed"])
    script = CLIENTS / f"simple_{protocol}_cudashm_client.py"
    done = subprocess.run(
        [sys.executable, str(script), "-u", served[protocol]], capture_output=True, text=True, timeout=120
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert "PASS" in done.stdout, output
    assert "0 + 1 = 1" in done.stdout and "15 - 1 = 14" in done.stdout, output

    # no region is left, and every handle the client registered (4) is closed once nothing holds it
    assert shared_memory.regions_of(served["server"]).status("", shared_memory.CUDA) == []
    deadline = time.monotonic() + 10
    while len(served["closed"]) - closed_before < 4 and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert len(served["closed"]) - closed_before == 4, served["closed"]

    # zero copy: the model read INPUT0 in the client's own GPU buffer (a one-request batch)
    seen = served["seen"]
    assert seen["ptr"] is not None, f"the model got {seen['type']}, not a GPU array"
    assert seen["ptr"] == seen["region_ptr"], seen


ALLOCATION_CHECK = r"""
import base64, sys
import cupy
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

size = 1 << 20
ptr = cupy.cuda.runtime.malloc(size)  # cudaMalloc: an allocation of its own, not the memory pool's
try:
    handle = base64.b64encode(cupy.cuda.runtime.ipcGetMemHandle(ptr))
    client = grpcclient.InferenceServerClient(sys.argv[1])
    try:
        client.register_cuda_shared_memory("too-big", handle, 0, 4 * size)  # past any rounding of the size
        print("REGISTERED beyond the allocation")
    except InferenceServerException as exc:
        print("REFUSED", exc.status(), exc.message())
    client.register_cuda_shared_memory("whole", handle, 0, size)
    region = client.get_cuda_shared_memory_status("whole").regions["whole"]
    print("STATUS", region.name, region.device_id, region.byte_size)
    client.unregister_cuda_shared_memory("whole")
finally:
    cupy.cuda.runtime.free(ptr)
"""


def test_cudashm_registration_beyond_the_allocation_is_refused(served):
    """As Triton checks it (cuMemGetAddressRange): a byte_size larger than the client's allocation
    is refused, so no request can make Triton read or write past it; the whole allocation is fine."""
    done = subprocess.run(
        [sys.executable, "-c", ALLOCATION_CHECK, served["grpc"]], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0 and "No module named 'cupy'" in done.stderr:
        pytest.skip("cupy is not installed")
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert (
        "REFUSED StatusCode.INVALID_ARGUMENT failed to register shared memory region 'too-big': invalid args "
        f"(byte_size {4 << 20} exceeds the "
    ) in done.stdout, output
    assert f"STATUS whole 0 {1 << 20}" in done.stdout, output
