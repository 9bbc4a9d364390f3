"""THE dtype table: numpy dtype <-> Triton datatype name <-> TRITONSERVER_DataType value <->
model-config type <-> KServe-v2 protobuf contents field. Every other module asks here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class DType:
    """One Triton datatype."""

    name: str  # Triton's datatype name, as on the wire: "FP32"
    value: int  # TRITONSERVER_DataType
    numpy: np.dtype | None  # the numpy dtype of its arrays; None for BYTES (object arrays) and BF16
    contents: str | None  # field of KServe's InferTensorContents that carries it, if any

    @property
    def config_type(self) -> str:
        """The model configuration's name: ``TYPE_FP32``; ``TYPE_STRING`` for BYTES."""
        return "TYPE_STRING" if self.name == "BYTES" else f"TYPE_{self.name}"


def _row(name: str, value: int, numpy: Any, contents: str | None) -> DType:
    return DType(name, value, None if numpy is None else np.dtype(numpy), contents)


DTYPES: tuple[DType, ...] = (
    _row("BOOL", 1, np.bool_, "bool_contents"),
    _row("UINT8", 2, np.uint8, "uint_contents"),
    _row("UINT16", 3, np.uint16, "uint_contents"),
    _row("UINT32", 4, np.uint32, "uint_contents"),
    _row("UINT64", 5, np.uint64, "uint64_contents"),
    _row("INT8", 6, np.int8, "int_contents"),
    _row("INT16", 7, np.int16, "int_contents"),
    _row("INT32", 8, np.int32, "int_contents"),
    _row("INT64", 9, np.int64, "int64_contents"),
    _row("FP16", 10, np.float16, None),  # no typed contents in KServe: raw bytes only
    _row("FP32", 11, np.float32, "fp32_contents"),
    _row("FP64", 12, np.float64, "fp64_contents"),
    _row("BYTES", 13, None, "bytes_contents"),
    _row("BF16", 14, None, None),  # numpy has no bfloat16
)
BY_NAME: dict[str, DType] = {d.name: d for d in DTYPES}
_BY_NUMPY: dict[np.dtype, DType] = {d.numpy: d for d in DTYPES if d.numpy is not None}
_BY_KIND: dict[tuple[str, int], DType] = {(dt.kind, dt.itemsize): d for dt, d in _BY_NUMPY.items()}


def triton_dtype(dtype: Any, what: str = "tensor") -> str:
    """Triton's datatype name (``FP32``, ``BYTES``, ...) for a numpy dtype."""
    d = dtype if type(dtype) is np.dtype else np.dtype(dtype)
    found = _BY_NUMPY.get(d)
    if found is not None:
        return found.name
    if d.kind in "OSU":
        return "BYTES"
    found = _BY_KIND.get((d.kind, d.itemsize))  # e.g. big-endian or aliased dtypes
    if found is None:
        raise InvalidArgumentError(
            f"{what}: dtype {d} has no Triton equivalent; use bool, (u)int8-64, float16/32/64 or bytes/object for BYTES"
        )
    return found.name


def as_numpy_dtype(dtype: Any) -> np.dtype:
    """A user's dtype as numpy's: ``bytes``, ``np.bytes_``, ``str`` and ``object`` mean BYTES
    (object arrays); Triton's names (``"FP32"``, ``"TYPE_FP32"``, ``"BYTES"``, ``"TYPE_STRING"``)
    are read too."""
    if isinstance(dtype, str):
        name = "BYTES" if dtype == "TYPE_STRING" else dtype.removeprefix("TYPE_")
        found = BY_NAME.get(name)
        if found is not None:
            if found.name == "BYTES":
                return np.dtype(object)
            if found.numpy is None:
                raise InvalidArgumentError(f"dtype {dtype!r}: numpy has no {found.name}; use FP16 or FP32")
            return found.numpy
    return np.dtype(object) if dtype in (bytes, np.bytes_, object, str) else np.dtype(dtype)
