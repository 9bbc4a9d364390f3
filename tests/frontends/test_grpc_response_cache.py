"""Response-cache hits over gRPC: Triton completes a cached request inside ServerInferAsync,
and the gRPC frontend's immediate completion let the call go before submit took the handle's
reference (a double free that killed the process at the second identical request)."""

from __future__ import annotations

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")

from embedtriton import ModelConfig, Server, ServerConfig, Tensor, batch  # noqa: E402

F32 = np.float32


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_cached_answers_over_grpc(transport, own_process):
    if not own_process:  # (it ran in a process of its own)
        return
    calls = []

    @batch
    def add(a, b):
        calls.append(len(a))
        return {"sum": a + b}

    server = Server(ServerConfig(cache_config=["local,size=1048576"]))
    server.bind(
        "Cached",
        add,
        [Tensor(name="a", dtype=F32, shape=(1,)), Tensor(name="b", dtype=F32, shape=(1,))],
        [Tensor(name="sum", dtype=F32, shape=(1,))],
        ModelConfig(max_batch_size=8, response_cache=True),
    )
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport=transport)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        for value in (1.0, 1.0, 1.0, 2.0, 2.0):
            tensors = [grpcclient.InferInput("a", [1, 1], "FP32"), grpcclient.InferInput("b", [1, 1], "FP32")]
            for t in tensors:
                t.set_data_from_numpy(np.full((1, 1), value, F32))
            assert client.infer("Cached", tensors).as_numpy("sum")[0, 0] == 2 * value
        client.close()
    assert len(calls) == 2  # one call per distinct request; the repeats were cache hits
