"""ONNX models without an NGC container: a ``model.onnx`` run by the ``onnxruntime`` package
through our backend, as a bound callable whose tensors are read from the graph (a dynamic
first axis means batching). ``pip install "embedtriton[onnx]"``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.batch import batch
from ..config import ModelConfig, Tensor
from ..errors import InvalidArgumentError, UnsupportedError

# ONNX Runtime's tensor type names -> numpy dtypes
_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_, "tensor(string)": np.bytes_,
}  # fmt: skip


def onnx_model(path: str | Path, config: ModelConfig | None) -> tuple[Any, list[Tensor], list[Tensor], ModelConfig]:
    """``(infer_func, inputs, outputs, config)`` for an ONNX file: tensors from the graph; a
    dynamic first axis on every input and output means the model batches."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise UnsupportedError(
            'ONNX models need the onnxruntime package: pip install "embedtriton[onnx]" (or serve the model '
            "from an NGC Triton install, whose onnxruntime backend Triton runs itself)"
        ) from exc
    if not Path(path).is_file():
        raise InvalidArgumentError(f"no ONNX file at {str(path)!r}")
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own exception types
        raise InvalidArgumentError(f"{path}: onnxruntime cannot load it: {exc}") from None
    graph_inputs, graph_outputs = session.get_inputs(), session.get_outputs()
    batched = all(g.shape and not isinstance(g.shape[0], int) for g in [*graph_inputs, *graph_outputs])
    config = config if config is not None else ModelConfig()
    if not batched and config.batching:
        config = replace(config, batching=False)

    def tensors(nodes: Any) -> list[Tensor]:
        out = []
        for node in nodes:
            if node.type not in _TYPES:
                raise UnsupportedError(f"{path}: tensor '{node.name}' has type {node.type}, which Triton cannot carry")
            dims = [d if isinstance(d, int) and d > 0 else -1 for d in node.shape]
            out.append(Tensor(name=node.name, dtype=_TYPES[node.type], shape=dims[1:] if batched else dims))
        return out

    names = [g.name for g in graph_outputs]
    kinds = {g.name: _TYPES[g.type] for g in graph_inputs if g.type in _TYPES}

    def run(**feeds: np.ndarray) -> dict[str, np.ndarray]:
        fed = {k: (v.astype(object) if kinds.get(k) is np.bytes_ else v) for k, v in feeds.items()}
        return dict(zip(names, session.run(names, fed), strict=True))

    if batched:
        infer_func: Any = batch(run)
    else:

        def infer_func(requests: list[Any]) -> list[dict[str, np.ndarray]]:
            return [run(**dict(r)) for r in requests]

    return infer_func, tensors(graph_inputs), tensors(graph_outputs), config
