"""Triton's life (run/serve/stop, signals, PyTritonUnrecoverableError), TritonConfig's defaults,
translation and refusals, and the errors PyTriton's clients raise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import InvalidArgumentError, TritonError, UnavailableError
from embedtriton.pytriton.client import ModelClient
from embedtriton.pytriton.decorators import batch
from embedtriton.pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
    PyTritonUnrecoverableError,
    PyTritonValidationError,
)
from embedtriton.pytriton.model_config import ModelConfig, Tensor
from embedtriton.pytriton.triton import Triton, TritonConfig
from embedtriton.pytriton.triton_config import plan

F32 = np.float32
X = [Tensor(name="x", dtype=F32, shape=(1,))]
Y = [Tensor(name="y", dtype=F32, shape=(1,))]


@batch
def double(x):
    return {"y": x * 2}


def test_defaults_are_pytritons():
    p = plan(TritonConfig())
    assert (p.http, p.grpc["address"], p.metrics) == ("0.0.0.0:8000", "0.0.0.0:8001", "0.0.0.0:8002")
    assert "restricted_protocol" not in p.grpc and p.http_settings == {}  # the security config restricts (below)
    p = plan(TritonConfig(http_address="127.0.0.1", allow_grpc=False, metrics_port=9102, exit_timeout_secs=5))
    assert (p.http, p.grpc, p.metrics, p.server.exit_timeout_secs) == ("127.0.0.1:8000", None, "127.0.0.1:9102", 5)
    p = plan(TritonConfig(allow_metrics=False, cache_config=["local,size=1024"], log_verbose=1))
    assert p.metrics is None and not p.server.metrics and p.server.cache_config == ["local,size=1024"]


def test_unsupported_settings_are_refused_with_what_to_do():
    with pytest.raises(InvalidArgumentError, match="http_thread_count.*one event loop"):
        Triton(config=TritonConfig(http_thread_count=4))
    with pytest.raises(PyTritonValidationError, match="allow_sagemaker"):
        Triton(config=TritonConfig(allow_sagemaker=True))
    with pytest.raises(PyTritonValidationError, match="security_config"):
        Triton(security_config=object())
    with pytest.raises(PyTritonValidationError, match="has to be allowed"):
        TritonConfig(allow_http=False, allow_grpc=False)
    with pytest.raises(PyTritonValidationError, match="grpc_server_cert"):
        Triton(config=TritonConfig(grpc_use_ssl=True))


def test_config_from_the_environment(monkeypatch):
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "9301")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_ALLOW_METRICS", "false")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_CACHE_CONFIG_0", "local,size=2048")
    config = TritonConfig.from_env()
    assert (config.grpc_port, config.allow_metrics, config.cache_config) == (9301, False, ["local,size=2048"])
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=9302))  # explicit settings win over the environment
    assert triton._config.grpc_port == 9302 and triton._config.allow_metrics is False


def test_bind_checks_like_pytriton():
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0))
    with pytest.raises(PyTritonValidationError, match="alphanumeric"):
        triton.bind("bad name", double, X, Y)
    with pytest.raises(PyTritonValidationError, match="cannot be optional"):
        triton.bind("M", double, X, [Tensor(name="y", dtype=F32, shape=(1,), optional=True)])
    with pytest.raises(InvalidArgumentError, match="max_batch_size"):
        triton.bind("M", double, X, Y, config=ModelConfig(max_batch_size=0))
    with pytest.raises(InvalidArgumentError, match="cache"):  # response_cache needs TritonConfig(cache_config=...)
        triton.bind("M", double, X, Y, config=ModelConfig(response_cache=True))
    triton.bind("Positional", double, [Tensor((1,), np.float32, "x")], Y)  # PyTriton's field order: shape, dtype, name
    assert triton._triton_context.model_configs[double].inputs[0].shape == (1,)


def test_run_bind_after_start_stop_and_is_alive(local_config, url_of):
    triton = Triton(config=local_config())
    assert not triton.is_alive() and triton.stop() is False
    triton.run()
    try:
        assert triton.is_alive() and triton.http_port and triton.grpc_port and triton.metrics_port
        triton.bind("Double", double, X, Y)  # loaded at once on a running server
        client = ModelClient(url_of(triton, "http"), "Double", init_timeout_s=10)
        assert client.infer_sample(x=np.array([4.0], F32))["y"][0] == 8.0
        started = time.monotonic()  # the client keeps its connection open across the stop
    finally:
        assert triton.stop() is True
    assert time.monotonic() - started < 5
    assert not triton.is_alive() and triton.stop() is False
    client.close()


def test_response_cache_example(local_config, url_of, own_process):
    if not own_process:  # (it ran in a process of its own)
        return
    calls = []

    @batch
    def add_sub(**inputs):
        calls.append(1)
        a, b = inputs.values()
        return {"add": a + b, "sub": a - b}

    with Triton(config=local_config(cache_config=[f"local,size={1024 * 1024}"])) as triton:
        triton.bind(
            model_name="AddSub",
            infer_func=add_sub,
            inputs=[Tensor(shape=(1,), dtype=F32), Tensor(shape=(1,), dtype=F32)],
            outputs=[Tensor(name="add", shape=(1,), dtype=F32), Tensor(name="sub", shape=(1,), dtype=F32)],
            config=ModelConfig(max_batch_size=8, response_cache=True),
        )
        with ModelClient(url_of(triton, "grpc"), "AddSub") as client:
            for _ in range(3):
                assert client.infer_sample(np.array([1.0], F32), np.array([2.0], F32))["add"][0] == 3.0
    assert len(calls) == 1  # the repeats came from Triton's cache


def test_unrecoverable_error_stops_the_server(local_config, url_of):
    def fragile(requests):
        if any((r["x"] < 0).any() for r in requests):
            raise PyTritonUnrecoverableError("the device is gone")
        return [{"y": r["x"] * 2} for r in requests]

    triton = Triton(config=local_config())
    triton.bind("Fragile", fragile, X, Y)
    triton.run()  # (serve() runs it too; started here so that its port is known)
    served = threading.Thread(target=triton.serve, kwargs={"monitoring_period_s": 0.1})
    served.start()
    try:
        with ModelClient(url_of(triton, "http"), "Fragile", init_timeout_s=10) as client:
            assert client.infer_sample(x=np.array([1.0], F32))["y"][0] == 2.0
            with pytest.raises(PyTritonClientInferenceServerError, match="the device is gone"):
                client.infer_sample(x=np.array([-1.0], F32))
        served.join(timeout=20)
        assert not served.is_alive()  # serve() returned
        assert not triton.is_alive()
    finally:
        triton.stop()
        served.join(timeout=20)


SERVE_SCRIPT = textwrap.dedent(
    """
    import pathlib, sys, time
    import numpy as np
    from embedtriton.pytriton.model_config import ModelConfig, Tensor
    from embedtriton.pytriton.triton import Triton, TritonConfig

    def slow(requests):
        pathlib.Path(__file__).with_name("running").touch()  # (the test waits for it)
        time.sleep(1.0)
        return [{"y": r["x"] + 1} for r in requests]

    triton = Triton(config=TritonConfig(http_address="127.0.0.1", grpc_address="127.0.0.1",
                                        http_port=0, grpc_port=0, metrics_port=0))
    triton.bind("Slow", slow, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))], config=ModelConfig(max_batch_size=4))
    triton.run()
    print("PORT", triton.http_port, flush=True)
    triton.serve()
    print("SERVE RETURNED", triton.is_alive(), flush=True)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_drains_and_returns_on_a_signal(tmp_path, signum):
    script = tmp_path / "serve.py"
    script.write_text(SERVE_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT"), line
        port = int(line.split()[1])
        answer = {}

        def call():
            with ModelClient(f"127.0.0.1:{port}", "Slow", init_timeout_s=10) as client:
                answer["y"] = client.infer_sample(x=np.array([41.0], F32))["y"][0]

        caller = threading.Thread(target=call)
        caller.start()
        assert wait_for(lambda: (tmp_path / "running").exists()), "the request never reached the model"  # (1 s)
        proc.send_signal(signum)
        caller.join(timeout=30)
        out, _ = proc.communicate(timeout=30)
        assert answer.get("y") == 42.0  # the request in flight finished
        assert "SERVE RETURNED False" in out and proc.returncode == 0
    finally:
        proc.kill()


def test_client_errors(local_config, url_of, protocol):
    with Triton(config=local_config()) as triton:
        triton.bind("Single", double, X, Y, config=ModelConfig(batching=False))
        url = url_of(triton, protocol)
        client = ModelClient(url, "Single", init_timeout_s=10)
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            client.infer_batch(x=np.ones((1, 1), F32))
        with pytest.raises(PyTritonClientValueError, match="either positional either keyword"):
            client.infer_sample(np.ones(1, F32), x=np.ones(1, F32))
        with pytest.raises(PyTritonClientValueError, match="Provide input data"):
            client.infer_sample()
        with pytest.raises(PyTritonClientValueError, match="Parameter/header value"):
            client.infer_sample(x=np.ones(1, F32), parameters={"k": 1.5})
        client.close()
        with pytest.raises(PyTritonClientClosedError):
            client.infer_sample(x=np.ones(1, F32))
        with pytest.raises(PyTritonClientTimeoutError, match="timed out"):
            ModelClient(url, "NoSuchModel", init_timeout_s=0.3, lazy_init=False)
    with pytest.raises(PyTritonClientTimeoutError):  # the server is gone
        ModelClient(url, "Single", init_timeout_s=0.3, lazy_init=False)


def test_exceptions_are_also_embedtriton_errors():
    assert issubclass(PyTritonValidationError, InvalidArgumentError)
    assert issubclass(PyTritonBadParameterError, ValueError)
    assert issubclass(PyTritonClientTimeoutError, UnavailableError)
    error = PyTritonClientInferenceServerError("boom")
    assert isinstance(error, TritonError) and error.message == "boom" and str(error) == "boom"


def test_model_warmup_runs_before_the_model_serves(local_config):
    from embedtriton.pytriton.model_config.common import ModelWarmup, WarmupInput

    seen = []

    def record(requests):
        seen.append([r["x"].shape for r in requests])
        return [{"y": r["x"] * 2} for r in requests]

    warmup = ModelWarmup(
        name="first", batch_size=2, inputs={"x": WarmupInput(dtype=F32, shape=(1,), zero_data=True)}, count=1
    )
    with Triton(config=local_config()) as triton:
        triton.bind("Warm", record, X, Y, config=ModelConfig(max_batch_size=4, model_warmup=[warmup]))
        assert seen  # Triton ran the warm-up while bind() loaded the model
        assert triton.server.model("Warm").infer({"x": np.ones((1, 1), F32)})["y"][0, 0] == 2.0
