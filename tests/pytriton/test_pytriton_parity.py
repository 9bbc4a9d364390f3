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


ENSEMBLE_WITH_PARAMETERS = """
name: "Twice"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "temperature" value { string_value: "0.7" } }
parameters { key: "top_k" value { string_value: "5" } }
ensemble_scheduling {
  step [
    { model_name: "Adder" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "mid" } },
    { model_name: "Adder" model_version: -1 input_map { key: "x" value: "mid" } output_map { key: "y" value: "OUT" } }
  ]
}
"""

ADDER = """
import numpy as np
from embedtriton import ModelConfig, Tensor, batch

@batch
def infer_func(x):
    return {"y": x + 1}

inputs = [Tensor(name="x", dtype=np.float32, shape=(1,))]
outputs = [Tensor(name="y", dtype=np.float32, shape=(1,))]
config = ModelConfig(max_batch_size=8)
"""


@pytest.fixture(scope="module")
def configured(local_config, tmp_path_factory):
    """A Triton serving models whose configs use every field PyTriton's client reads: a
    repository ensemble with parameters, queue policies, warm-up, the response cache, a decoupled
    model, two instances."""
    from embedtriton.pytriton.model_config import DynamicBatcher, ModelWarmup, QueuePolicy, WarmupInput
    from embedtriton.pytriton.model_config.common import TimeoutAction

    repository = tmp_path_factory.mktemp("repository")
    (repository / "Adder" / "1").mkdir(parents=True)
    (repository / "Adder" / "1" / "model.py").write_text(ADDER)
    (repository / "Twice" / "1").mkdir(parents=True)
    (repository / "Twice" / "config.pbtxt").write_text(ENSEMBLE_WITH_PARAMETERS)
    x, y = [Tensor(name="x", dtype=F32, shape=(1,))], [Tensor(name="y", dtype=F32, shape=(1,))]
    same = batch(lambda x: {"y": x})
    policy = QueuePolicy(timeout_action=TimeoutAction.DELAY, default_timeout_microseconds=5000, max_queue_size=3)
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=100,
        preferred_batch_size=[2, 4],
        priority_levels=2,
        default_priority_level=1,
        default_queue_policy=policy,
        priority_queue_policy={2: QueuePolicy(allow_timeout_override=True, max_queue_size=7)},
    )
    warmup = ModelWarmup(
        name="w", batch_size=2, inputs={"x": WarmupInput(dtype=F32, shape=(1,), zero_data=True)}, count=3
    )
    config = local_config(model_repository=repository, cache_config=[f"local,size={1024 * 1024}"])
    with Triton(config=config) as triton:
        triton.bind("Queued", same, x, y, config=ModelConfig(max_batch_size=4, batcher=batcher))
        triton.bind("Warm", [same, same], x, y, config=ModelConfig(max_batch_size=4, model_warmup=[warmup]))
        triton.bind("Cached", same, x, y, config=ModelConfig(max_batch_size=4, response_cache=True))
        triton.bind("Stream", same, x, y, config=ModelConfig(max_batch_size=4, decoupled=True))
        triton.bind(
            "Plain", lambda requests: [{"y": r["x"]} for r in requests], x, y, config=ModelConfig(batching=False)
        )
        yield triton


def _plain(value):
    """A TritonModelConfig (ours or PyTriton's) as plain data, to compare across the two packages."""
    import dataclasses
    import enum

    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (type, np.dtype)):
        return np.dtype(value).str
    return value


MODELS = ("Twice", "Adder", "Queued", "Warm", "Cached", "Stream", "Plain")


def test_client_model_config_reads_what_pytritons_reads(configured, url_of, protocol, stock_pytriton):
    from embedtriton.pytriton.client import ModelClient
    from embedtriton.pytriton.model_config.common import DeviceKind, QueuePolicy, TimeoutAction

    url = url_of(configured, protocol)
    ours = {}
    for name in MODELS:
        with ModelClient(url, name, init_timeout_s=10) as client:
            ours[name] = client.model_config
    assert ours["Twice"].backend_parameters == {"temperature": "0.7", "top_k": "5"}
    batcher = ours["Queued"].batcher
    assert batcher.default_queue_policy == QueuePolicy(TimeoutAction.DELAY, 5000, False, 3)
    assert batcher.priority_queue_policy == {2: QueuePolicy(TimeoutAction.REJECT, 0, True, 7)}
    assert batcher.preferred_batch_size == [2, 4] and batcher.priority_levels == 2
    (stage,) = ours["Warm"].model_warmup
    assert (stage.name, stage.batch_size, stage.count, stage.inputs["x"].shape) == ("w", 2, 3, (1,))
    assert stage.inputs["x"].zero_data and ours["Warm"].instance_group == {DeviceKind.KIND_CPU: 2}
    assert ours["Cached"].response_cache.enable is True and ours["Queued"].response_cache is None
    assert ours["Stream"].decoupled and not ours["Plain"].batching and ours["Plain"].max_batch_size == 0
    stock = stock_pytriton("client")
    if stock is None:
        return  # PyTriton's client is not installed: the checks above stand alone
    for name in MODELS:
        with stock.ModelClient(url, name, init_timeout_s=10) as theirs:
            assert _plain(ours[name]) == _plain(theirs.model_config), name


@pytest.fixture(scope="module")
def streaming(local_config):
    """A decoupled model (its stream's length from a request parameter), a coupled one, and one
    whose callable fails."""

    def count(requests):
        (request,) = requests
        for i in range(int(request.parameters.get("n", 2))):
            yield [{"i": np.array([[i]], np.int32)}]

    def fails(requests):
        raise ValueError("no luck")

    n = [Tensor(name="x", dtype=F32, shape=(1,))], [Tensor(name="i", dtype=np.int32, shape=(1,))]
    with Triton(config=local_config()) as triton:
        triton.bind("Count", count, *n, config=ModelConfig(max_batch_size=1, decoupled=True))
        triton.bind("Coupled", batch(lambda x: {"i": x.astype(np.int32)}), *n, config=ModelConfig(max_batch_size=4))
        triton.bind("Fails", fails, *n, config=ModelConfig(max_batch_size=4))
        yield triton


async def _first_error(client, model: str | None = None, **options) -> BaseException:
    try:
        async for _ in client.infer_sample(np.array([1.0], F32), **options):
            pass
    except Exception as exc:
        return exc
    raise AssertionError("no error")


@pytest.mark.parametrize("which", ["embedtriton", "pytriton"])
def test_asyncio_decoupled_client_over_http_fails_at_the_first_inference(streaming, url_of, which, stock_pytriton):
    """As PyTriton's: the client is made and reads the config over HTTP; an inference raises
    PyTritonClientValueError (a coupled model: PyTritonClientInferenceServerError first)."""
    import asyncio

    from embedtriton.pytriton.client import AsyncioDecoupledModelClient

    client_class = AsyncioDecoupledModelClient
    if which == "pytriton":
        stock = stock_pytriton("client")
        if stock is None:
            pytest.skip("PyTriton's client (nvidia-pytriton wheel and its dependencies) is not installed")
        client_class = stock.AsyncioDecoupledModelClient

    async def main():
        url = url_of(streaming, "http")
        async with client_class(url, "Count", init_timeout_s=10) as client:
            assert (await client.model_config).decoupled
            streamed = await _first_error(client)
        async with client_class(url, "Coupled", init_timeout_s=10) as client:
            coupled = await _first_error(client)
        return streamed, coupled

    streamed, coupled = asyncio.run(main())
    assert type(streamed).__name__ == "PyTritonClientValueError"
    assert str(streamed) == "AsyncioDecoupledModelClient is only supported for grpc protocol"
    assert type(coupled).__name__ == "PyTritonClientInferenceServerError"
    assert str(coupled) == "Model config is coupled. Use AsyncioModelClient instead."


def test_asyncio_clients_from_existing_client_and_server_errors_in_pytritons_words(streaming, url_of, protocol):
    import asyncio

    from embedtriton.pytriton.client import AsyncioDecoupledModelClient, AsyncioModelClient
    from embedtriton.pytriton.exceptions import PyTritonClientInferenceServerError

    async def main():
        url = url_of(streaming, protocol)
        async with AsyncioModelClient(url, "Coupled", init_timeout_s=10, inference_timeout_s=20) as first:
            await first.model_config
            async with AsyncioModelClient.from_existing_client(first) as second:
                assert type(second) is AsyncioModelClient and second._inference_timeout_s == 20
                assert second._model_config is first._model_config
                assert (await second.infer_sample(np.array([3.0], F32)))["i"][0] == 3
        async with AsyncioModelClient(url, "Fails", init_timeout_s=10) as client:
            with pytest.raises(PyTritonClientInferenceServerError) as info:
                await client.infer_sample(np.array([3.0], F32))
        failed = str(info.value)
        if protocol == "grpc":
            async with AsyncioDecoupledModelClient(url, "Count", init_timeout_s=10) as first:
                async with AsyncioDecoupledModelClient.from_existing_client(first) as client:
                    assert type(client) is AsyncioDecoupledModelClient
                    # parameters reach the model (PyTriton's stream drops them) and headers are sent
                    got = [int(r["i"][0]) async for r in client.infer_sample(np.ones(1, F32), parameters={"n": 3})]
                    assert got == [0, 1, 2]
                    got = [int(r["i"][0]) async for r in client.infer_sample(np.ones(1, F32), headers={"x-a": "b"})]
                    assert got == [0, 1]
        return failed

    failed = asyncio.run(main())
    assert failed.startswith("Error occurred on Triton Inference Server side:\n ") and "no luck" in failed


def test_bind_refuses_names_and_callables_in_pytritons_words(local_config):
    from embedtriton.pytriton.exceptions import PyTritonValidationError

    triton = Triton(config=local_config())
    spec = [Tensor(name="x", dtype=F32, shape=(1,))], [Tensor(name="y", dtype=F32, shape=(1,))]
    with pytest.raises(PyTritonValidationError, match="^Model name cannot be empty$"):
        triton.bind("", batch(lambda x: {"y": x}), *spec)
    with pytest.raises(
        PyTritonValidationError,
        match="^Model name can only contain alphanumeric characters, dots, underscores and dashes$",
    ):
        triton.bind("a/b", batch(lambda x: {"y": x}), *spec)
    with pytest.raises(
        PyTritonValidationError, match="^inference_fn has to be either callable or sequence of callables$"
    ):
        triton.bind("M", [], *spec)


def test_lifecycle_policy_says_whether_with_starts_the_server(local_config, url_of, caplog):
    from embedtriton.pytriton.client import ModelClient
    from embedtriton.pytriton.exceptions import PyTritonValidationError
    from embedtriton.pytriton.triton import (
        DefaultTritonLifecyclePolicy,
        TritonLifecyclePolicy,
        VertextAILifecyclePolicy,
    )

    assert DefaultTritonLifecyclePolicy == TritonLifecyclePolicy(True, False)
    assert VertextAILifecyclePolicy == TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True)
    with pytest.raises(PyTritonValidationError, match="must be a TritonLifecyclePolicy"):
        Triton(config=local_config(), triton_lifecycle_policy="later")
    with Triton(config=local_config(), triton_lifecycle_policy=VertextAILifecyclePolicy) as triton:
        assert not triton.is_alive()
        triton.bind("Twice", batch(lambda x: {"y": x * 2}), [Tensor(name="x", dtype=F32, shape=(1,))],
                    [Tensor(name="y", dtype=F32, shape=(1,))], config=ModelConfig(max_batch_size=4))  # fmt: skip
        with caplog.at_level("INFO", logger="embedtriton.pytriton"):
            triton.run()
        assert "Infer function available as model: `/v2/models/Twice`" in caplog.text
        with ModelClient(url_of(triton, "http"), "Twice", init_timeout_s=10) as client:
            assert client.infer_sample(np.array([2.0], F32))["y"][0] == 4.0
    assert not triton.is_alive()
    with Triton(config=local_config(), triton_lifecycle_policy=TritonLifecyclePolicy(local_model_store=True)) as t:
        assert t.is_alive()


PUBLIC = {
    "triton": ["Triton", "TritonConfig", "RemoteTriton", "TritonLifecyclePolicy", "DefaultTritonLifecyclePolicy",
               "VertextAILifecyclePolicy"],  # (TritonSecurityConfig comes with restricted APIs)
    "decorators": ["batch", "sample", "group_by_keys", "group_by_values", "fill_optionals", "first_value",
                   "triton_context", "pad_batch", "ConstantPadder", "TritonContext", "ModelConfigDict",
                   "get_model_config", "get_triton_context", "get_inference_request_batch_size", "convert_output",
                   "TRITON_CONTEXT_FIELD_NAME", "InputNames", "InferenceRequest", "InferenceRequests",
                   "InferenceResult", "InferenceResults"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_pytritons_public_names_import_from_ours(module, stock_pytriton):
    import importlib

    ours = importlib.import_module(f"embedtriton.pytriton.{module}")
    assert [n for n in PUBLIC[module] if not hasattr(ours, n)] == []
    theirs = stock_pytriton(module)
    if theirs is None:
        return
    assert [n for n in PUBLIC[module] if not hasattr(theirs, n)] == []  # (the list names PyTriton's own)
    assert ours.TRITON_CONTEXT_FIELD_NAME == theirs.TRITON_CONTEXT_FIELD_NAME if module == "decorators" else True


def test_triton_config_from_dict_ignores_unknown_names_with_a_warning(caplog):
    from embedtriton.pytriton.triton_config import TritonConfig

    with caplog.at_level("WARNING", logger="embedtriton.pytriton"):
        config = TritonConfig.from_dict({"http_port": "9000", "allow_grpc": "false", "newer_setting": 1})
    assert (config.http_port, config.allow_grpc) == (9000, False)
    assert (
        "Ignoring newer_setting=1 as could not find matching config field. Available fields: model_repository, id,"
        in (caplog.text)
    )
