"""``Tensor(..., optional=True)``: an input a request may leave out (Triton's ``optional: true``),
through the real runtime in process, over gRPC and over HTTP; optional outputs are refused."""

from __future__ import annotations

import numpy as np
import pytest

from embedtriton import InvalidArgumentError, ModelConfig, Server, Tensor, batch

F32 = np.float32


def _scaled(requests):
    """y = x * w, w = 10 when the request leaves "w" out; "seen" says which inputs came."""
    out = []
    for r in requests:
        w = r["w"] if "w" in r else np.full_like(r["x"], 10)
        seen = np.array([[",".join(sorted(r.keys())).encode()]] * len(r["x"]), dtype=object)
        out.append({"y": r["x"] * w, "seen": seen})
    return out


@pytest.fixture(scope="module")
def served():
    server = Server()
    server.bind(
        "Scaled",
        _scaled,
        [Tensor(name="x", dtype=F32, shape=(1,)), Tensor(name="w", dtype=F32, shape=(1,), optional=True)],
        [Tensor(name="y", dtype=F32, shape=(1,)), Tensor(name="seen", dtype=bytes, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        yield server


def test_the_config_marks_the_input_optional(served):
    inputs = {t["name"]: t for t in served.model("Scaled").config()["input"]}
    assert inputs["w"].get("optional") is True
    assert not inputs["x"].get("optional", False)


def test_in_process_with_and_without_the_optional_input(served):
    model = served.model("Scaled")
    x = np.array([[2.0], [3.0]], F32)
    out = model.infer({"x": x})
    np.testing.assert_array_equal(out["y"], x * 10)
    assert out["seen"][0, 0] == b"x"
    out = model.infer({"x": x, "w": np.full_like(x, 2)})
    np.testing.assert_array_equal(out["y"], x * 2)
    assert out["seen"][0, 0] == b"w,x"


def test_a_required_input_is_still_required(served):
    with pytest.raises(InvalidArgumentError, match="x"):
        served.model("Scaled").infer({"w": np.ones((1, 1), F32)})


def test_over_grpc_and_http_without_the_optional_input(served):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    httpclient = pytest.importorskip("tritonclient.http")
    x = np.array([[4.0]], F32)
    grpc_port = served.serve_grpc("127.0.0.1:0")
    http_port = served.serve_http("127.0.0.1:0")
    for lib, port in ((grpcclient, grpc_port), (httpclient, http_port)):
        client = lib.InferenceServerClient(f"127.0.0.1:{port}")
        tensor = lib.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("Scaled", [tensor])
        np.testing.assert_array_equal(result.as_numpy("y"), x * 10)
        assert result.as_numpy("seen")[0, 0] == b"x"
        client.close()


def test_batch_refuses_requests_with_different_inputs_clearly():
    @batch
    def f(x, w=None):
        return {"y": x}

    from embedtriton import Request

    a, b = Request(x=np.ones((1, 1), F32)), Request(x=np.ones((1, 1), F32), w=np.ones((1, 1), F32))
    with pytest.raises(ValueError, match="optional inputs were left out"):
        f([a, b])


def test_optional_outputs_are_refused():
    server = Server()
    with pytest.raises(InvalidArgumentError, match="only inputs can be optional"):
        server.bind(
            "Bad",
            _scaled,
            [Tensor(name="x", dtype=F32, shape=(1,))],
            [Tensor(name="y", dtype=F32, shape=(1,), optional=True)],
        )
