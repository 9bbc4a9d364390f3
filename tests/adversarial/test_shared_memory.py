"""System shared memory from a hostile client: no file outside /dev/shm is reachable, and
shrinking a region under a request cannot crash the server."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from serving import Served, wait_for

grpcclient = pytest.importorskip("tritonclient.grpc")
import tritonclient.utils.shared_memory as shm  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

DOUBLE_AFTER_A_PAUSE = """
import pathlib, time
import numpy as np
from embedtriton import ModelConfig, Tensor

def slow_double(requests):
    for r in requests:
        pause = float(r.parameters.get("pause", 0))
        if pause:
            pathlib.Path("pausing").touch()  # (the test waits for it)
        time.sleep(pause)  # the client shrinks the region meanwhile
    return [{"y": r["x"] * 2} for r in requests]

def bind(server):
    server.bind("Double", slow_double, [Tensor(name="x", dtype=np.float32, shape=(-1,))],
                [Tensor(name="y", dtype=np.float32, shape=(-1,))], ModelConfig(max_batch_size=1))
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shm")
    process = Served(folder, DOUBLE_AFTER_A_PAUSE)
    process.folder = folder
    yield process
    process.close()


def _key(tag: str) -> str:
    return f"/embedtriton-adv-{tag}-{os.getpid()}-{time.monotonic_ns()}"


def _input(region: str, n: int) -> object:
    x = grpcclient.InferInput("x", [1, n], "FP32")
    x.set_shared_memory(region, 4 * n)
    return x


def test_keys_cannot_reach_files_outside_dev_shm(served, tmp_path):
    client = grpcclient.InferenceServerClient(served.address)
    secret = tmp_path / "secret"
    secret.write_bytes(b"do not read me" * 100)
    relative = os.path.relpath(secret, "/dev/shm")
    for key in (
        relative,
        "/" + relative,
        "../../" + str(secret).lstrip("/"),
        "/dev/shm/../" + relative,
        "/a/b",
        "/..",
        ".",
    ):
        with pytest.raises(InferenceServerException, match="Unable to open shared memory region") as info:
            client.register_system_shared_memory("steal", key, 16)
        assert "INVALID_ARGUMENT" in str(info.value.status())
    link = f"embedtriton-adv-link-{os.getpid()}"
    os.symlink(secret, f"/dev/shm/{link}")  # a symlink inside /dev/shm is not followed either
    try:
        with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
            client.register_system_shared_memory("steal", "/" + link, 16)
    finally:
        os.unlink(f"/dev/shm/{link}")
    fifo = f"embedtriton-adv-fifo-{os.getpid()}"
    os.mkfifo(f"/dev/shm/{fifo}")  # not a shared-memory object (and opening it must not block)
    try:
        with pytest.raises(InferenceServerException, match="is not a shared-memory object"):
            client.register_system_shared_memory("steal", "/" + fifo, 16, client_timeout=10)
    finally:
        os.unlink(f"/dev/shm/{fifo}")
    assert not client.get_system_shared_memory_status().regions
    assert secret.read_bytes() == b"do not read me" * 100


def test_a_region_shrunk_before_the_request_is_refused(served):
    client = grpcclient.InferenceServerClient(served.address)
    key = _key("before")
    handle = shm.create_shared_memory_region("early", key, 4096)
    try:
        shm.set_shared_memory_region(handle, [np.ones((1, 1024), np.float32)])
        client.register_system_shared_memory("early", key, 4096)
        os.truncate(f"/dev/shm/{key.lstrip('/')}", 0)
        with pytest.raises(InferenceServerException, match="shrank") as info:
            client.infer("Double", [_input("early", 1024)])
        assert "INVALID_ARGUMENT" in str(info.value.status())
        client.unregister_system_shared_memory("early")
    finally:
        shm.destroy_shared_memory_region(handle)
    assert served.alive()


@pytest.mark.parametrize("where", ["input", "output"])
def test_a_region_shrunk_while_the_model_runs_does_not_crash_the_server(served, where):
    client = grpcclient.InferenceServerClient(served.address)
    n = 64 * 1024  # 256 KiB: the model reads pages past the new end of the file
    key = _key(where)
    handle = shm.create_shared_memory_region(where, key, 8 * n)
    x = np.arange(n, dtype=np.float32).reshape(1, n)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory(where, key, 8 * n)
        if where == "input":
            inputs = [_input(where, n)]
        else:
            inputs = [grpcclient.InferInput("x", [1, n], "FP32")]
            inputs[0].set_data_from_numpy(x)
        out = grpcclient.InferRequestedOutput("y")
        out.set_shared_memory(where, 4 * n, offset=4 * n)
        done = []
        pausing = served.folder / "pausing"
        pausing.unlink(missing_ok=True)
        client.async_infer(
            "Double", inputs, callback=lambda result, error: done.append((result, error)), outputs=[out],
            parameters={"pause": 0.5},
        )  # fmt: skip
        assert wait_for(pausing.exists), "the model never ran"  # it pauses before it reads (or writes) the region
        os.truncate(f"/dev/shm/{key.lstrip('/')}", 0)
        replied = wait_for(lambda: done or not served.alive(), 20, every=0.05)
        assert served.alive(), "the server died (SIGBUS)"
        assert replied and done, "no reply"
        result, error = done[0]
        assert result is None and "shrunk by its owner" in str(error)
        # still serving, other requests unharmed
        plain = grpcclient.InferInput("x", [1, 4], "FP32")
        plain.set_data_from_numpy(np.ones((1, 4), np.float32))
        np.testing.assert_array_equal(client.infer("Double", [plain]).as_numpy("y"), 2 * np.ones((1, 4)))
        with pytest.raises(InferenceServerException, match="shrunk by its owner|shrank"):
            client.infer("Double", [_input(where, n)])  # the region stays poisoned until re-registered
        client.unregister_system_shared_memory(where)
    finally:
        shm.destroy_shared_memory_region(handle)
