"""Where PyTriton's behaviour is easy to get subtly wrong, compared against PyTriton 0.7.0's
sources: the order a callable sees its inputs in, rebinding after ``stop()``, ``RemoteTriton``,
the decorators' errors, and the clients' details."""

from __future__ import annotations

import numpy as np
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
