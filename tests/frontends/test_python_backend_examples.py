"""Triton's own python_backend examples (``tests/upstream/python_backend``: r24.10, unmodified),
served from a model repository by ``embedtriton serve --model-repository`` as their READMEs
serve them with ``tritonserver --model-repository``, each driven by its own unchanged client on
the ports those clients use (HTTP 8000, gRPC 8001, metrics 8002).

The models run in Triton's python backend (stub processes of their own), on the ``stub_python``
environment (numpy<2; torch for the pytorch example and the two BLS examples, whose repository holds its
PyTorch model)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for

pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tritonclient.http")

UPSTREAM = Path(__file__).resolve().parents[1] / "upstream" / "python_backend"
PORTS = (8000, 8001, 8002)

# The repository each README builds: model folder -> (model.py, config.pbtxt or None)
LAYOUT = {
    "add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
    "nobatch_auto_complete": ("auto_complete/nobatch_model.py", None),
    "batch_auto_complete": ("auto_complete/batch_model.py", None),
    "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt"),
    "bls_async": ("bls/async_model.py", "bls/async_config.pbtxt"),
    "pytorch": ("pytorch/model.py", "pytorch/config.pbtxt"),
    "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
    "repeat_int32": ("decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
    "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
    "custom_metrics": ("custom_metrics/model.py", "custom_metrics/config.pbtxt"),
}
CLIENTS = {  # client -> what it prints when it passes
    "add_sub/client.py": "PASS: add_sub",
    "auto_complete/client.py": "PASS: auto_complete",
    "bls/sync_client.py": "PASS: BLS Sync",
    "bls/async_client.py": "PASS: BLS Async",
    "bls_decoupled/sync_client.py": "PASS: BLS Decoupled Sync",
    "bls_decoupled/async_client.py": "PASS: BLS Decoupled Async",
    "decoupled/repeat_client.py": "PASS: repeat_int32",
    "decoupled/square_client.py": "PASS: square_int32",
    "custom_metrics/client.py": "PASS: custom_metrics",
    "pytorch/client.py": "PASS: pytorch",
}
NEEDS_TORCH = {"bls/sync_client.py", "bls/async_client.py", "pytorch/client.py"}


def bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ports_free() -> None:
    """The upstream clients hard-code their ports: wait up to 10 s for them (the previous test's
    server closing), then skip, naming the port and why, when another process keeps one."""
    for port in PORTS:
        if not wait_for(lambda port=port: bindable(port), 10.0, every=0.1):
            pytest.skip(
                f"port {port} is in use by another process, and the upstream clients only talk to ports {PORTS}"
            )


def serve(repository: Path, stub_bin: str, log: Path) -> subprocess.Popen:
    """``embedtriton serve --model-repository`` on the clients' ports, the stub environment first
    on PATH; returns once it serves (or fails the test with its log)."""
    ports_free()
    command = [
        sys.executable, "-m", "embedtriton", "serve", "--model-repository", str(repository),
        "--http", "127.0.0.1:8000", "--grpc", "127.0.0.1:8001", "--metrics", "127.0.0.1:8002",
    ]  # fmt: skip
    env = {**os.environ, "PATH": f"{stub_bin}{os.pathsep}{os.environ['PATH']}"}
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=repository.parent, env=env, stdout=out, stderr=subprocess.STDOUT)
    ready = wait_for(lambda: " ready: " in log.read_text(errors="replace") or process.poll() is not None, 120, 0.2)
    if not ready or " ready: " not in log.read_text(errors="replace"):
        process.kill()
        pytest.fail(f"embedtriton serve did not start:\n{log.read_text(errors='replace')[-4000:]}")
    return process


@pytest.fixture(scope="module")
def served(tmp_path_factory, stub_python, python_backend_example):
    root = tmp_path_factory.mktemp("python_backend_examples")
    repository = root / "models"
    for name, (model, config) in LAYOUT.items():
        if name != "pytorch" or stub_python["torch"]:  # (without torch its examples skip below)
            python_backend_example(repository, name, model, config)
    log = root / "serve.log"
    process = serve(repository, stub_python["bin"], log)
    yield {"log": log, "stub": stub_python}
    process.send_signal(signal.SIGINT)
    try:
        assert process.wait(timeout=60) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        process.kill()


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_upstream_client_passes(served, client):
    if client in NEEDS_TORCH and not served["stub"]["torch"]:
        pytest.skip("its repository needs the example's PyTorch model, and torch's CPU wheel is not on this machine")
    done = subprocess.run(
        [sys.executable, str(UPSTREAM / client)], cwd=UPSTREAM, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and CLIENTS[client] in output, output[-3000:]


def test_non_streaming_calls_to_a_decoupled_repository_model_get_tritons_answer(served):
    """What Triton answers when a decoupled model is called without a stream (read from what
    Triton loaded: the repository's config.pbtxt says decoupled, nothing was bound)."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    for module, url, code in (
        (grpcclient, "127.0.0.1:8001", "StatusCode.UNIMPLEMENTED"),
        (httpclient, "127.0.0.1:8000", "501"),
    ):
        x = module.InferInput("IN", [1], "INT32")
        x.set_data_from_numpy(np.array([2], dtype=np.int32))
        with module.InferenceServerClient(url) as client, pytest.raises(InferenceServerException) as caught:
            client.infer("square_int32", [x])
        protocol = "ModelInfer RPC" if module is grpcclient else "HTTP end point"
        assert f"{protocol} doesn't support models with decoupled transaction policy" in str(caught.value)
        assert code in str(caught.value.status())


def test_generate_stream_of_a_decoupled_repository_model(served):
    """HTTP generate_stream sends every response of the python-backend model as an event, and
    an answer of the final flag alone ends the stream without an error."""
    import json
    import urllib.request

    def events(n: int) -> list[dict]:
        request = urllib.request.Request(
            "http://127.0.0.1:8000/v2/models/square_int32/generate_stream", data=json.dumps({"IN": n}).encode()
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read().decode()
        return [json.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]

    assert [e["OUT"] for e in events(3)] == [3, 3, 3]
    assert events(0) == []
