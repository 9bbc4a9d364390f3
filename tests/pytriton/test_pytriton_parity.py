"""Where PyTriton's behaviour is easy to get subtly wrong, compared against PyTriton 0.7.0's
sources: the order a callable sees its inputs in, rebinding after ``stop()``, ``RemoteTriton``,
the decorators' errors, and the clients' details."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http

from embedtriton.pytriton.decorators import batch
from embedtriton.pytriton.model_config import ModelConfig, Tensor
from embedtriton.pytriton.triton import Triton

F32 = np.float32


def test_inputs_come_in_the_declared_order_whatever_the_client_sent(local_config):
    """PyTriton builds each request from the model's declared inputs, so ``a, b =
    inputs.values()`` works whatever order a client sends them in (perf_analyzer's example
    relies on it)."""
    seen = []

    @batch
    def first_minus_second(**inputs):
        seen.append(list(inputs))
        a, b = inputs.values()
        return {"d": a - b}

    def raw(requests):
        seen.append([list(r) for r in requests])
        return [{"d": r["a"] - r["b"]} for r in requests]

    with Triton(config=local_config()) as triton:
        spec = [Tensor(name="a", dtype=F32, shape=(1,)), Tensor(name="b", dtype=F32, shape=(1,))]
        out = [Tensor(name="d", dtype=F32, shape=(1,))]
        triton.bind("Minus", first_minus_second, spec, out, config=ModelConfig(max_batch_size=4))
        triton.bind("RawMinus", raw, spec, out, config=ModelConfig(max_batch_size=4))
        client = tritonclient.http.InferenceServerClient(f"127.0.0.1:{triton.http_port}")
        try:
            for name in ("Minus", "RawMinus"):
                inputs = []
                for tensor, value in (("b", 1.0), ("a", 5.0)):  # b first
                    inputs.append(tritonclient.http.InferInput(tensor, [1, 1], "FP32"))
                    inputs[-1].set_data_from_numpy(np.array([[value]], F32))
                assert client.infer(name, inputs).as_numpy("d")[0, 0] == 4.0
        finally:
            client.close()
        in_process = triton.server.model("Minus").infer({"b": np.ones((1, 1), F32), "a": np.zeros((1, 1), F32)})
        assert in_process["d"][0, 0] == -1.0
    assert seen == [["a", "b"], [["a", "b"]], ["a", "b"]]


def test_stop_forgets_the_models_and_the_same_name_binds_again(local_config, url_of):
    """PyTriton's notebook flow: bind, run, stop, bind the same name to a new callable, run."""
    from embedtriton.pytriton.client import ModelClient
    from embedtriton.pytriton.exceptions import PyTritonInvalidOperationError

    spec = [Tensor(name="x", dtype=F32, shape=(1,))], [Tensor(name="y", dtype=F32, shape=(1,))]
    triton = Triton(config=local_config())
    triton.bind("Scale", batch(lambda x: {"y": x * 2}), *spec, config=ModelConfig(max_batch_size=4))
    with pytest.raises(PyTritonInvalidOperationError, match="^Cannot add model with the same name twice.$"):
        triton.bind("scale", batch(lambda x: {"y": x}), *spec)  # PyTriton's keys ignore the letter case
    triton.bind("Scale", batch(lambda x: {"y": x * 5}), *spec, model_version=2)  # another version: fine (served)
    for factor in (5.0, 3.0):
        triton.run()
        try:
            with ModelClient(url_of(triton, "http"), "Scale", init_timeout_s=10) as client:
                assert client.infer_sample(np.array([1.0], F32))["y"][0] == factor
        finally:
            assert triton.stop() is True
        assert triton.server.models() == []
        triton.bind("Scale", batch(lambda x: {"y": x * 3}), *spec, config=ModelConfig(max_batch_size=4))
    assert triton.stop() is False  # not running: the model bound last stays bound
    assert [m.name for m in triton.server.models()] == ["Scale"]


def test_remote_triton_is_refused_at_construction_naming_the_alternative():
    from embedtriton import InvalidArgumentError
    from embedtriton.pytriton.exceptions import PyTritonValidationError
    from embedtriton.pytriton.triton import RemoteTriton

    with pytest.raises(PyTritonValidationError, match=r"^RemoteTriton\(url='localhost'\) is not supported") as info:
        RemoteTriton(url="localhost", access_token="token")
    assert "Triton.bind" in info.value.message and "ModelClient(url, model_name)" in info.value.message
    assert isinstance(info.value, InvalidArgumentError)


def test_vertex_ai_settings_follow_tritonserver():
    from embedtriton.pytriton.exceptions import PyTritonValidationError
    from embedtriton.pytriton.triton_config import TritonConfig, plan

    p = plan(TritonConfig(allow_vertex_ai=True, vertex_ai_port=9090, vertex_ai_default_model="M"), environ={})
    assert p.vertex_ai == {"address": "0.0.0.0:9090", "default_model": "M"} and p.http and p.grpc
    assert plan(TritonConfig(allow_vertex_ai=True), environ={"AIP_HTTP_PORT": "7070"}).vertex_ai["address"] == (
        "0.0.0.0:7070"
    )
    assert plan(TritonConfig(allow_vertex_ai=True), environ={}).vertex_ai["address"] == "0.0.0.0:8080"
    assert plan(TritonConfig(), environ={}).vertex_ai is None
    # AIP_MODE=PREDICTION: Vertex AI on, HTTP and gRPC off unless asked for (tritonserver's defaults)
    p = plan(TritonConfig(), environ={"AIP_MODE": "PREDICTION"})
    assert (p.http, p.grpc, p.vertex_ai["address"], p.metrics) == (None, None, "0.0.0.0:8080", "0.0.0.0:8002")
    p = plan(TritonConfig(allow_http=True, allow_vertex_ai=False), environ={"AIP_MODE": "PREDICTION"})
    assert (p.http, p.grpc, p.vertex_ai) == ("0.0.0.0:8000", None, None)
    with pytest.raises(PyTritonValidationError, match="vertex_ai_thread_count.*one event loop"):
        plan(TritonConfig(allow_vertex_ai=True, vertex_ai_thread_count=4), environ={})
    with pytest.raises(PyTritonValidationError, match="vertex_ai_port must be a port number"):
        plan(TritonConfig(allow_vertex_ai=True), environ={"AIP_HTTP_PORT": "-1"})


def test_vertex_ai_mode_starts_at_serve_with_the_bound_model_as_default(local_config, monkeypatch):
    """As PyTriton's Vertex AI lifecycle: ``with Triton(...)`` does not start the server, so
    that the endpoint finds the model bound inside it; the predict route infers it."""
    import json
    import urllib.request

    from embedtriton.pytriton.exceptions import PyTritonValidationError

    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/predict")
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/health")
    config = local_config(allow_vertex_ai=True, vertex_ai_port=0)
    with Triton(config=config) as triton:
        assert not triton.is_alive()
        with pytest.raises(PyTritonValidationError, match="^Vertex AI endpoint: Expect the model repository contains"):
            triton.run()  # no model: tritonserver refuses to start too
        assert not triton.is_alive() and triton.vertex_ai_port is None
        triton.bind("Twice", batch(lambda x: {"y": x * 2}), [Tensor(name="x", dtype=F32, shape=(1,))],
                    [Tensor(name="y", dtype=F32, shape=(1,))], config=ModelConfig(max_batch_size=4))  # fmt: skip
        triton.run()
        base = f"http://127.0.0.1:{triton.vertex_ai_port}"
        assert urllib.request.urlopen(f"{base}/health").status == 200
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [3]}]}).encode()
        answer = json.load(urllib.request.urlopen(urllib.request.Request(f"{base}/predict", body)))
        assert answer["model_name"] == "Twice" and answer["outputs"][0]["data"] == [6.0]
    assert not triton.is_alive()
