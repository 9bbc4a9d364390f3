"""An ensemble over gRPC: one network call runs every step, with the stock client."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import wait_for

grpcclient = pytest.importorskip("tritonclient.grpc")

from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import ModelConfig, Server, ServerConfig, Step, Tensor, batch  # noqa: E402


@batch
def tokenize(text):
    return {"ids": np.array([[len(s)] for s in text[:, 0]], np.int64)}


@batch
def embed(ids):
    return {"vec": np.repeat(ids.astype(np.float32), 4, axis=1)}


def test_a_pipeline_in_one_grpc_call(add_sub, add_sub_tensors):
    server = Server(ServerConfig(model_control_mode="explicit"))  # the client unloads a step below
    server.bind(
        "Tokenize",
        tokenize,
        [Tensor(name="text", dtype=np.bytes_, shape=(1,))],
        [Tensor(name="ids", dtype=np.int64, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    server.bind(
        "Embed",
        embed,
        [Tensor(name="ids", dtype=np.int64, shape=(1,))],
        [Tensor(name="vec", dtype=np.float32, shape=(4,))],
        ModelConfig(max_batch_size=8),
    )
    server.bind_ensemble(
        "Pipeline",
        steps=[
            Step("Tokenize", inputs={"text": "TEXT"}, outputs={"ids": "ids"}),
            Step("Embed", inputs={"ids": "ids"}, outputs={"vec": "VEC"}),
        ],
        inputs=[Tensor(name="TEXT", dtype=np.bytes_, shape=(1,))],
        outputs=[Tensor(name="VEC", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    with server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.serve_grpc('127.0.0.1:0')}")
        text = grpcclient.InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"hello"], [b"hi"]], dtype=np.object_))
        result = client.infer("Pipeline", [text])
        np.testing.assert_array_equal(result.as_numpy("VEC"), [[5.0] * 4, [2.0] * 4])
        assert client.get_model_config("Pipeline").config.platform == "ensemble"
        # (Triton reports a request's statistics after its answer is sent, which may reach us first)
        count = lambda: client.get_inference_statistics("Embed").model_stats[0].inference_count  # noqa: E731
        assert wait_for(lambda: count() >= 2), count()
        assert count() == 2
        assert {m.name for m in client.get_model_repository_index().models} == {"Tokenize", "Embed", "Pipeline"}
        client.unload_model("Embed")  # the ensemble is unavailable, and says why
        with pytest.raises(InferenceServerException, match=r"its step model \['Embed'\] is not loaded"):
            client.infer("Pipeline", [text])
        client.load_model("Embed")
        assert client.infer("Pipeline", [text]).as_numpy("VEC").shape == (2, 4)


def test_a_model_calling_models_over_grpc():
    """BLS behind the endpoint: one network call; the async callable awaits the two models."""
    server = Server()
    server.bind(
        "Tokenize",
        tokenize,
        [Tensor(name="text", dtype=np.bytes_, shape=(1,))],
        [Tensor(name="ids", dtype=np.int64, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    server.bind(
        "Embed",
        embed,
        [Tensor(name="ids", dtype=np.int64, shape=(1,))],
        [Tensor(name="vec", dtype=np.float32, shape=(4,))],
        ModelConfig(max_batch_size=8),
    )

    @batch
    async def pipeline(TEXT):
        ids = (await server.model("Tokenize").infer_async({"text": TEXT}))["ids"]
        return {"VEC": (await server.model("Embed").infer_async({"ids": ids}))["vec"]}

    server.bind(
        "PipelineBLS",
        pipeline,
        [Tensor(name="TEXT", dtype=np.bytes_, shape=(1,))],
        [Tensor(name="VEC", dtype=np.float32, shape=(4,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.serve_grpc('127.0.0.1:0')}")
        text = grpcclient.InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"hello"], [b"hi"]], dtype=np.object_))
        np.testing.assert_array_equal(client.infer("PipelineBLS", [text]).as_numpy("VEC"), [[5.0] * 4, [2.0] * 4])
