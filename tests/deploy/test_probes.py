"""The Deployment's probes against the real endpoint: `embedtriton serve` runs with the container's
args from deploy/k8s/deployment.yaml (only the addresses moved to free 127.0.0.1 ports, and the
target wrapped to add a slow model), and the probes are polled as kubelet polls them: a
grpc.health.v1 Check of service "" (success: SERVING) and an HTTP GET of /v2/health/ready
(success: 200-399), each on a fresh connection.

Before the models have loaded (deploy/models.py's and one whose warm-up takes a second) every
probe fails; after, both succeed. On SIGTERM, with a request in flight: both fail (NOT_SERVING,
400) while that request still completes, and the process exits 0 within the pod's grace period.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers import wait_for

grpc = pytest.importorskip("grpc")
grpcclient = pytest.importorskip("tritonclient.grpc")
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
WARMUP_S = 1.0

# The image's working folder holds deploy/models.py as models.py; this module sits beside it.
PROBED_MODELS = f"""
import time
from pathlib import Path

import numpy as np

import models
from embedtriton import ModelConfig, ModelWarmup, Tensor, WarmupInput


def slow(requests):
    seconds = requests[0].parameters.get("seconds")
    if seconds is None:  # Triton's warm-up, while the model loads
        time.sleep({WARMUP_S})
        Path("loaded").write_text(repr(time.time()))
    else:
        Path("running").touch()  # (the test waits for it)
        time.sleep(float(seconds))
    return [{{"y": r["x"] * 2}} for r in requests]


def bind(server):
    models.bind(server)
    warmup = ModelWarmup(name="slow", batch_size=1, inputs={{"x": WarmupInput(np.float32, (1,), zero_data=True)}})
    server.bind("Slow", slow, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))],
                ModelConfig(max_batch_size=1, model_warmup=[warmup]))
"""


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _grpc_probe(port: int, timeout: float) -> str:
    """What kubelet's gRPC probe sees: SERVING / NOT_SERVING, or the connection's error."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.RpcError as exc:
        return exc.code().name
    finally:
        channel.close()


def _http_probe(port: int, path: str, timeout: float) -> int | str:
    """What kubelet's httpGet probe sees: the status code, or the connection's error."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(getattr(exc, "reason", exc)).__name__


def _succeeds(grpc_seen, http_seen) -> tuple[bool, bool]:
    return grpc_seen == "SERVING", isinstance(http_seen, int) and 200 <= http_seen < 400


def _slow_call(port: int, seconds: float) -> list:
    done: list = []
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), 21, np.float32))
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    client.async_infer("Slow", [x], callback=lambda result, error: done.append((result, error)),
                       parameters={"seconds": seconds})  # fmt: skip
    return done


def test_probes_follow_loading_and_draining(tmp_path, deployment, container):
    pod = deployment["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    grpc_port = container["startupProbe"]["grpc"]["port"]
    http_probe = container["readinessProbe"]["httpGet"]
    timeout = container["readinessProbe"]["timeoutSeconds"]
    ports = dict(zip(("--grpc", "--http", "--metrics"), _free_ports(3), strict=True))
    args = [str(a) for a in container["args"]]
    assert args[args.index("--grpc") + 1].endswith(f":{grpc_port}")
    for option, port in ports.items():  # the same options, on free loopback ports
        args[args.index(option) + 1] = f"127.0.0.1:{port}"
    assert args[0] == "models:bind"
    args[0] = "probed_models:bind"
    shutil.copy(DEPLOY / "models.py", tmp_path / "models.py")  # as the Dockerfile places it
    (tmp_path / "probed_models.py").write_text(PROBED_MODELS)

    started = time.time()
    process = subprocess.Popen(
        [sys.executable, "-m", "embedtriton", "serve", *args], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(process.stderr), daemon=True)
    reader.start()
    try:
        # 1. Starting: poll until both probes pass (the startup probe allows minutes; 20 s here).
        seen = []
        while time.time() - started < 20 and process.poll() is None:
            observed = (time.time(), _grpc_probe(ports["--grpc"], timeout))
            observed += (_http_probe(ports["--http"], http_probe["path"], timeout),)
            seen.append(observed)
            if all(_succeeds(*observed[1:])):
                break
            time.sleep(0.1)
        assert seen and all(_succeeds(*seen[-1][1:])), (seen[-3:], "".join(log))
        loaded = float((tmp_path / "loaded").read_text())  # the warm-up's end: the last model's load
        early = [s for s in seen if s[0] < loaded]
        assert len(early) >= 3, f"no window before the models loaded: {seen[:3]}"
        assert not any(any(_succeeds(*s[1:])) for s in early), early  # nothing passed before the load
        for when, grpc_seen, http_seen in seen:
            if any(_succeeds(grpc_seen, http_seen)):
                assert when >= loaded
        assert _http_probe(ports["--http"], "/v2/health/live", timeout) == 200

        # 2. Draining: kubelet ran the preStop hook (sleep) and sent SIGTERM; a request is in flight.
        assert prestop[0] == "sleep"
        done = _slow_call(ports["--grpc"], 3.0)
        assert wait_for(lambda: (tmp_path / "running").exists()), "the request never ran"
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert wait_for(lambda: _grpc_probe(ports["--grpc"], timeout) == "NOT_SERVING"), "no drain after SIGTERM"
        polled = time.monotonic()
        draining = []
        while not done and time.monotonic() - polled < 1.0:
            grpc_seen = _grpc_probe(ports["--grpc"], timeout)
            draining.append((grpc_seen, _http_probe(ports["--http"], http_probe["path"], timeout)))
            time.sleep(0.1)
        assert draining and not done, "the request in flight should still be running while the probes are polled"
        assert all(d == ("NOT_SERVING", 400) for d in draining), draining
        code = process.wait(timeout=grace - int(prestop[1]))
        exited = time.monotonic() - signalled
        reader.join(timeout=5)
        assert code == 0, "".join(log)
        assert exited < grace - int(prestop[1]), exited
        assert done and done[0][1] is None, done  # the request in flight got its answer
        assert done[0][0].as_numpy("y")[0, 0] == 42
        assert "stopped" in "".join(log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
