"""ONNX models run by the onnxruntime package through our backend: bind_onnx, and model.onnx
in a repository. The graphs are built here with the onnx package."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from embedtriton import InvalidArgumentError, ModelConfig, Server, ServerConfig  # noqa: E402


def add_mul(path, batch: object = "batch", opset: int = 13) -> str:
    """y = x + b, z = x * 2 (FP32 [batch, 3] or [2, 3]); b is a second input."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [batch, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 3])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"]), helper.make_node("Mul", ["x", "two"], ["z"])],
        "add_mul",
        [x, b],
        [y, z],
        initializer=[two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # readable by older onnxruntime releases too
    onnx.save(model, str(path))
    return str(path)


def test_bind_onnx_reads_the_graph_and_batches_a_dynamic_axis(tmp_path):
    server = Server()
    model = server.bind_onnx("AddMul", add_mul(tmp_path / "m.onnx"), ModelConfig(max_batch_size=8))
    fixed = server.bind_onnx("Fixed", add_mul(tmp_path / "f.onnx", batch=2))
    with server:
        meta = model.metadata()
        assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
            ("x", "FP32", [-1, 3]),
            ("b", "FP32", [-1, 3]),
        ]
        assert model.config()["max_batch_size"] == 8
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        out = model.infer({"x": x, "b": np.ones_like(x)})
        np.testing.assert_array_equal(out["y"], x + 1)
        np.testing.assert_array_equal(out["z"], x * 2)
        assert fixed.config()["max_batch_size"] == 0  # a fixed first axis: no batching
        np.testing.assert_array_equal(fixed.infer({"x": x, "b": x})["y"], x * 2)
    with pytest.raises(InvalidArgumentError, match="no ONNX file at"):
        Server().bind_onnx("Missing", str(tmp_path / "nope.onnx"))
    (tmp_path / "bad.onnx").write_bytes(b"not a graph")
    with pytest.raises(InvalidArgumentError, match="onnxruntime cannot load it"):
        Server().bind_onnx("Bad", str(tmp_path / "bad.onnx"))


def test_model_onnx_in_a_repository(tmp_path):
    for version in (1, 2):
        (tmp_path / "Graph" / str(version)).mkdir(parents=True)
        add_mul(tmp_path / "Graph" / str(version) / "model.onnx")
    server = Server(ServerConfig(model_repository=[str(tmp_path)], model_control_mode="none"))
    with server:
        x = np.ones((1, 3), np.float32)
        assert server.model("Graph").infer({"x": x, "b": x})["y"][0, 0] == 2
        assert server.versions("Graph") == [1, 2] and server.model("Graph", 2).ready
