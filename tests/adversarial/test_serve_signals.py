"""`embedtriton serve` under SIGTERM/SIGINT: it drains (requests in flight over gRPC finish,
new ones are refused, health says NOT_SERVING), a second signal exits at once, and Ctrl-C
while binding stops before any port opens."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from serving import Served, wait_for

grpcclient = pytest.importorskip("tritonclient.grpc")
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

grpc = pytest.importorskip("grpc")

SLOW = """
import pathlib, time
import numpy as np
from embedtriton import ModelConfig, Tensor

def slow(requests):
    pathlib.Path("running").touch()  # (in the test's folder: the test waits for it)
    time.sleep(float(requests[0].parameters.get("seconds", 1.5)))
    return [{"y": r["x"] * 2} for r in requests]

def bind(server):
    server.bind("Slow", slow, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))], ModelConfig(max_batch_size=1))
"""


def _x() -> list:
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), 21, np.float32))
    return [x]


def _start_slow_call(served: Served, folder: Path, seconds: float) -> list:
    """A call to Slow, running in the server (served from ``folder``) once this returns."""
    done: list = []
    client = grpcclient.InferenceServerClient(served.address)
    client.async_infer(
        "Slow", _x(), callback=lambda result, error: done.append((result, error)), parameters={"seconds": seconds}
    )
    assert wait_for(lambda: (folder / "running").exists()), "Slow never ran the call"
    return done


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def _draining(address: str) -> bool:
    """Whether the server took the signal: its health says NOT_SERVING."""
    return _health(address) == health_pb2.HealthCheckResponse.NOT_SERVING


def test_sigterm_drains_requests_in_flight(tmp_path):
    served = Served(tmp_path, SLOW, "--exit-timeout", "10")
    try:
        done = _start_slow_call(served, tmp_path, 1.5)
        assert _health(served.address) == health_pb2.HealthCheckResponse.SERVING
        served.signal(signal.SIGTERM)
        assert wait_for(lambda: _draining(served.address)), "health still says SERVING after SIGTERM"
        client = grpcclient.InferenceServerClient(served.address)
        with pytest.raises(InferenceServerException, match="stopping") as info:
            client.infer("Slow", _x(), parameters={"seconds": 0})
        assert "UNAVAILABLE" in str(info.value.status())
        code, log = served.finish(timeout=20)
        assert code == 0, log
        assert done and done[0][1] is None, done  # the call in flight got its reply
        assert done[0][0].as_numpy("y")[0, 0] == 42
    finally:
        served.close()


def test_a_second_signal_exits_at_once(tmp_path):
    served = Served(tmp_path, SLOW, "--exit-timeout", "30")
    try:
        _start_slow_call(served, tmp_path, 20)
        served.signal(signal.SIGINT)  # drains: would wait up to 20 s for the call
        assert wait_for(lambda: _draining(served.address)), "health still says SERVING after SIGINT"
        assert served.alive()
        started = time.monotonic()
        served.signal(signal.SIGINT)
        code, log = served.finish(timeout=10)
        assert time.monotonic() - started < 2
        assert code == 128 + signal.SIGINT, log
        assert "exiting without waiting" in log
    finally:
        served.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_binding_stops_before_the_ports_open(tmp_path, signum):
    """SIGTERM too: handled, not left to the default action (which PID 1 in a container,
    without an init, does not have: the kernel would drop the signal and the pod load on)."""
    (tmp_path / "binding.py").write_text(
        "import sys, time\ndef bind(server):\n    print('binding', file=sys.stderr, flush=True)\n    time.sleep(30)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "embedtriton", "serve", "binding:bind", "--grpc", "127.0.0.1:0",
         "--metrics", ""],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        lines = []
        waiter = threading.Thread(target=lambda: lines.append(process.stderr.readline()))
        waiter.start()
        waiter.join(timeout=60)
        assert lines and "binding" in lines[0]
        started = time.monotonic()
        process.send_signal(signum)
        try:
            code = process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # (seen once in CI, not reproduced): where each thread is
            process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            process.wait(timeout=10)
            pytest.fail(f"still running 10 s after {signal.Signals(signum).name}:\n{process.stderr.read()[-6000:]}")
        log = process.stderr.read()
        assert time.monotonic() - started < 2
        assert code == 128 + signum, log
        assert "gRPC" not in log and "interrupted while binding" in log
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()
