"""RepositoryModelLoad with a ``config`` override: a bound model reloaded live with another
configuration, validated like ``bind``; file uploads and unknown names refused with Triton's
status and words."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")

from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import ModelConfig, ModelWarmup, Server, ServerConfig, WarmupInput  # noqa: E402


@pytest.fixture(scope="module")
def endpoint(add_sub, add_sub_tensors):
    server = Server(ServerConfig(model_control_mode="explicit"))  # clients may load (Triton's default: none)
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    zeros = {n: WarmupInput(dtype=np.float32, shape=(1,), zero_data=True) for n in "ab"}
    warm = ModelConfig(max_batch_size=8, model_warmup=[ModelWarmup(name="zeros", batch_size=2, inputs=zeros)])
    server.bind("Warm", add_sub, *add_sub_tensors, config=warm)
    with server:
        port = server.serve_grpc("127.0.0.1:0")
        yield server, grpcclient.InferenceServerClient(f"127.0.0.1:{port}")


def infer(client, rows: int = 1) -> np.ndarray:
    a = np.arange(rows, dtype=np.float32).reshape(rows, 1)
    inputs = [grpcclient.InferInput("a", [rows, 1], "FP32"), grpcclient.InferInput("b", [rows, 1], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return client.infer("AddSub", inputs).as_numpy("add")


def test_a_fetched_config_changed_and_loaded_back_applies_live(endpoint):
    server, client = endpoint
    errors: list[BaseException] = []
    stop = threading.Event()

    def traffic() -> None:  # a caller looping through the reload
        while not stop.is_set():
            try:
                infer(client)
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        config = client.get_model_config("AddSub", as_json=True)["config"]
        config["max_batch_size"] = 16
        config["dynamic_batching"] = {"max_queue_delay_microseconds": 500, "preferred_batch_size": [4, 16]}
        client.load_model("AddSub", config=json.dumps(config))
        applied = client.get_model_config("AddSub").config
        assert applied.max_batch_size == 16
        assert list(applied.dynamic_batching.preferred_batch_size) == [4, 16]
        assert applied.dynamic_batching.max_queue_delay_microseconds == 500
        np.testing.assert_array_equal(infer(client, 16)[:, 0], 2 * np.arange(16))  # 16 rows now fit
        assert server.binding("AddSub").config.max_batch_size == 16
        assert server.model("AddSub").infer({"a": np.ones((12, 1), np.float32), "b": np.ones((12, 1), np.float32)})

        client.load_model("AddSub", config=json.dumps({"max_batch_size": 0}))  # a whole config: no batching
        assert client.get_model_config("AddSub").config.max_batch_size == 0
        with pytest.raises(InferenceServerException, match="unexpected shape"):
            infer(client)  # the batch axis went with max_batch_size 0
    finally:
        try:
            client.load_model("AddSub", config=json.dumps({"max_batch_size": 8, "dynamic_batching": {}}))
        finally:  # even when the reload fails: else the caller loops on, its errors filling memory
            stop.set()
            thread.join()
    assert infer(client, 8).shape == (8, 1)
    assert [e for e in errors if "unexpected shape" not in str(e)] == []  # nothing else failed


@pytest.mark.parametrize(
    "config, message",
    [
        ("{not json", "the config parameter is not a model config"),
        (json.dumps({"max_batch_size": 8, "bogus": 1}), "the config parameter is not a model config"),
        (json.dumps({"max_batch_size": 8, "platform": "onnxruntime_onnx"}), r"\['platform'\] cannot be set"),
        (json.dumps({"name": "Other"}), "the config names model 'Other'"),
        (json.dumps({"backend": "python"}), "runs on backend 'embedtriton', not 'python'"),
        (
            json.dumps({"max_batch_size": 8, "input": [{"name": "a", "data_type": "TYPE_INT32", "dims": [1]}]}),
            "the config's inputs must be the bound ones",
        ),
        (
            json.dumps({"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [8]}}),
            r"preferred_batch_size \[8\]: \[8\] not between 1 and max_batch_size=4",
        ),
        (json.dumps({"max_batch_size": 8, "response_cache": {"enable": True}}), "the server has no cache"),
        (json.dumps({"max_batch_size": 8, "parameters": {"x": {"string_value": "1"}}}), "takes no config parameters"),
        (json.dumps({"max_batch_size": 8, "instance_group": [{"count": 100000}]}), "100000 model instances asked"),
        (  # warm-up data runs through the callable at load: the application's choice, not a client's
            json.dumps(
                {
                    "max_batch_size": 8,
                    "model_warmup": [
                        {
                            "name": "w",
                            "batch_size": 1,
                            "inputs": {n: {"data_type": "TYPE_FP32", "dims": [1], "zero_data": True} for n in "ab"},
                        }
                    ],
                }
            ),
            "model_warmup cannot be changed over the network",
        ),
    ],
)
def test_bad_overrides_are_refused_and_the_model_keeps_serving(endpoint, config, message):
    server, client = endpoint
    with pytest.raises(InferenceServerException, match=message):
        client.load_model("AddSub", config=config)
    assert client.get_model_config("AddSub").config.max_batch_size == 8
    assert infer(client, 8).shape == (8, 1)


def test_file_parameters_and_unknown_names(endpoint):
    """A file upload fails as Triton 2.51 fails one it cannot use (INTERNAL, the poll failure that
    simple_grpc_model_control.py checks), whether or not a config comes with it."""
    _, client = endpoint
    for config in (json.dumps({"max_batch_size": 4}), None):
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("AddSub", config=config, files={"file:1/model.onnx": b"\0"})
        assert refused.value.status() == "StatusCode.INTERNAL"
        assert refused.value.message() == "failed to load 'AddSub', failed to poll from model repository"
    assert client.get_model_config("AddSub").config.max_batch_size == 8  # what served before serves on
    with pytest.raises(InferenceServerException, match="failed to load 'Nope', failed to poll from model repository"):
        client.load_model("Nope", config=json.dumps({"max_batch_size": 8}))
    assert infer(client).shape == (1, 1)


def test_a_file_parameter_that_is_not_bytes_is_invalid_as_in_triton(endpoint):
    """Triton's gRPC handler wants bytes_param for file: parameters (INVALID_ARGUMENT otherwise)."""
    import grpc
    from tritonclient.grpc import service_pb2

    server, _ = endpoint
    request = service_pb2.RepositoryModelLoadRequest(model_name="AddSub")
    request.parameters["file:1/model.py"].string_param = "not bytes"
    with grpc.insecure_channel(f"127.0.0.1:{server.endpoint('grpc').port}") as channel:
        load = channel.unary_unary(
            "/inference.GRPCInferenceService/RepositoryModelLoad",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=service_pb2.RepositoryModelLoadResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            load(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "invalid value type for load parameter 'file:1/model.py', expected bytes_param."


def test_a_model_with_warmup_round_trips(endpoint):
    """Its own warm-up, as get_model_config shows it, may come back in an override."""
    _, client = endpoint
    config = client.get_model_config("Warm", as_json=True)["config"]
    assert config["model_warmup"][0]["name"] == "zeros"
    config["max_batch_size"] = 4
    config["dynamic_batching"]["preferred_batch_size"] = [4]  # Triton filled in [8]; it must fit, as in Triton
    client.load_model("Warm", config=json.dumps(config))
    applied = client.get_model_config("Warm").config
    assert applied.max_batch_size == 4 and applied.model_warmup[0].batch_size == 2
