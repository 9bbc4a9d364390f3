"""KServe-v2 semantics, once, for every network frontend: request parameters (priority,
timeout, sequences), shared-memory references, tensor data checked against the bytes actually
received, and outputs as wire bytes. Frontends parse their wire format (protobuf, JSON) and
hand the values here; the result is the core's :class:`~embedtriton.core.InferRequest`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..config import MAX_DIMS
from ..core import CoreServer, InferRequest, Model
from ..core.request import SEQUENCE_END, SEQUENCE_START
from ..errors import InvalidArgumentError, NotFoundError
from ..tensors import BY_NAME, decode_bytes, encode_bytes
from .shared_memory import Region, SystemSharedMemory

EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"  # a stream's extra final response


# Triton's extensions (as its server metadata names them) that our endpoints implement. Not
# listed: model_repository(unload_dependents) (no dependents here) and cuda_shared_memory
# (registering needs a GPU build); binary_tensor_data is added by the HTTP endpoint.
EXTENSIONS = (
    "classification", "sequence", "model_repository", "schedule_policy", "model_configuration",
    "system_shared_memory", "parameters", "statistics", "trace", "logging",
)  # fmt: skip


class Decoded:
    """A network request, decoded: the request object for ``model``, plus the shared-memory
    regions it reads or writes and the outputs it wants written into them."""

    __slots__ = ("model", "request", "in_shm", "classify", "regions")

    def __init__(self, model: Model) -> None:
        self.model = model
        self.request = InferRequest({})
        self.in_shm: set[str] = set()  # outputs written into shared memory
        self.classify: dict[str, int] = {}  # outputs asked for as their top-k classes
        self.regions: list[Region] = []  # shared-memory regions it reads or writes

    def check_regions(self) -> None:
        """Raise when a region shrank under the request (its data is lost)."""
        for region in self.regions:
            region.check()


def model_of(server: CoreServer, name: str, version: str = "") -> Model:
    """The model (and version) a network request names. An unknown name and a malformed version
    are refused as Triton words them (INVALID_ARGUMENT), since clients compare that text; a
    version that is not loaded is Triton's own NOT_FOUND when the request reaches it."""
    try:
        model = server.model(name, model_version(version))
    except NotFoundError:
        raise InvalidArgumentError(f"Request for unknown model: '{name}' is not found") from None
    return model


_LEADING_INT = re.compile(r"\s*([+-]?\d+)")


def model_version(version: str) -> int:
    """A KServe ``model_version`` string as Triton reads it: empty is -1 (the latest ready
    version); like C's ``stol`` it reads a leading integer; negative values are refused."""
    if not version:
        return -1
    found = _LEADING_INT.match(version)
    if found is None or len(found.group(1).lstrip("+-")) > 18:
        raise InvalidArgumentError(
            f"failed to get model version from specified version string '{version}' (details: stol), "
            "version should be an integral value > 0"
        )
    number = int(found.group(1))
    if number < 0:
        raise InvalidArgumentError(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )
    return number


def apply_parameters(decoded: Decoded, params: dict[str, Any], request_id: str) -> None:
    """Set the request's options from its KServe parameters; the rest reach the model."""
    request = decoded.request
    params.pop(EMPTY_FINAL_RESPONSE, None)
    request.request_id = request_id or None
    request.priority = params.pop("priority", None)
    request.timeout_us = params.pop("timeout", None)
    sequence_id = params.pop("sequence_id", None)
    start = bool(params.pop("sequence_start", False))
    end = bool(params.pop("sequence_end", False))
    if sequence_id not in (None, 0, ""):
        request.sequence = (sequence_id, (SEQUENCE_START if start else 0) | (SEQUENCE_END if end else 0))
    request.parameters = params or None


def shm_reference(name: str, params: Mapping[str, Any]) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) when a tensor's parameters name a shared-memory region."""
    if "shared_memory_region" not in params:
        return None
    region = params["shared_memory_region"]
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    if not isinstance(region, str) or not isinstance(size, int) or not isinstance(offset, int):
        raise InvalidArgumentError(
            f"tensor '{name}': shared memory needs string shared_memory_region and integer "
            "shared_memory_byte_size (and optional shared_memory_offset) parameters"
        )
    return region, offset, size


def shm_view(decoded: Decoded, shm: SystemSharedMemory, ref: tuple[str, int, int], what: str) -> memoryview:
    """The bytes a shared-memory reference names (checked against the region)."""
    region_name, offset, size = ref
    region = shm.get(region_name)
    view = region.view(offset, size, what)
    decoded.regions.append(region)
    return view


def requested_outputs(decoded: Decoded, shm: SystemSharedMemory, outputs: Sequence[tuple[str, Any]]) -> None:
    """The outputs to return, ``[(name, parameters)]``: names, or names -> shared-memory buffers,
    and those asked for as classifications. An output named twice is returned once, as Triton
    does; named twice with different parameters (two regions, say) it is refused, where Triton
    would silently write only one of them."""
    if not outputs:
        return
    buffers: dict[str, Any] = {}
    seen: dict[str, Any] = {}
    for name, params in outputs:
        if name in seen:
            if params != seen[name]:
                raise InvalidArgumentError(f"output '{name}' is requested twice with different parameters")
            continue
        seen[name] = params
        ref = shm_reference(name, params)
        count = classification_count(params)
        if ref is not None and count is not None:
            raise InvalidArgumentError("output can't set both 'shared_memory_region' and 'classification'")
        if ref is not None:
            buffers[name] = shm_view(decoded, shm, ref, f"output '{name}'")
            decoded.in_shm.add(name)
        else:
            buffers[name] = None
            if count is not None:
                decoded.classify[name] = count
    decoded.request.outputs = buffers if decoded.in_shm else tuple(buffers)


def classification_count(params: Mapping[str, Any]) -> int | None:
    """The ``classification`` parameter of a requested output (how many top classes), if any."""
    if "classification" not in params:
        return None
    count = params["classification"]
    if not isinstance(count, int) or isinstance(count, bool):
        raise InvalidArgumentError("invalid value type for 'classification' parameter, expected int64_param")
    if count <= 0:
        raise InvalidArgumentError("invalid value for 'classification' parameter, expected >= 0")
    return count


_CLASSIFIABLE = frozenset("UINT8 UINT16 UINT32 UINT64 INT8 INT16 INT32 INT64 FP32 FP64".split())


def classify(array: np.ndarray, datatype: str, count: int, batched: bool, labels: Sequence[str] | None) -> np.ndarray:
    """Triton's classification of an output: per batch entry, its ``count`` largest elements
    as ``b"value:index[:label]"`` (values as C++'s ``std::to_string`` writes them), largest first."""
    if datatype not in _CLASSIFIABLE:
        raise InvalidArgumentError(f"class result not available for output due to unsupported type '{datatype}'")
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim > 0 else array.reshape(1, -1)
    n = rows.shape[1]
    k = min(count, n)
    floating = datatype in ("FP32", "FP64")
    out = np.empty((rows.shape[0], k), dtype=object)
    for b, row in enumerate(rows):
        order = (n - 1) - np.argsort(row[::-1], kind="stable")[::-1]  # largest first; ties by lower index
        for j, index in enumerate(order[:k].tolist()):
            value = f"{float(row[index]):f}" if floating else str(int(row[index]))
            label = labels[index] if labels is not None and index < len(labels) and labels[index] else None
            out[b, j] = f"{value}:{index}:{label}".encode() if label else f"{value}:{index}".encode()
    return out if batched and array.ndim > 0 else out.reshape(k)


def check_shape(name: str, shape: tuple[int, ...]) -> None:
    if len(shape) > MAX_DIMS:
        raise InvalidArgumentError(f"input '{name}' has {len(shape)} dimensions; at most {MAX_DIMS} are supported")
    if shape and min(shape) < 0:
        raise InvalidArgumentError(f"input '{name}': shape {list(shape)} has a negative dimension")


def array_from_bytes(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """An input from its raw bytes (a view, no copy, for numeric types)."""
    if datatype == "BYTES":
        try:
            return decode_bytes(data, shape)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"input '{name}': {exc}") from None
    dtype = _numeric(name, datatype)
    if len(data) != dtype.itemsize * math.prod(shape):
        raise InvalidArgumentError(f"input '{name}': {len(data)} bytes do not fill shape {list(shape)} of {datatype}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def contents_field(name: str, datatype: str) -> str:
    """The typed-contents field that carries ``datatype`` (KServe's InferTensorContents)."""
    found = BY_NAME.get(datatype)
    if found is None or found.contents is None:
        raise InvalidArgumentError(f"input '{name}': datatype {datatype} has no typed contents")
    return found.contents


def array_from_values(name: str, datatype: str, shape: tuple[int, ...], values: Sequence[Any]) -> np.ndarray:
    """An input from typed values (as many as were sent: bounded by the message)."""
    if len(values) != math.prod(shape):
        raise InvalidArgumentError(f"input '{name}': {len(values)} values do not fill shape {list(shape)}")
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
    else:
        dtype = _numeric(name, datatype)
        if dtype.kind in "iu" and len(values):  # int_contents (int32) also carries INT8: 300 is no INT8
            info, low, high = np.iinfo(dtype), min(values), max(values)
            if low < info.min or high > info.max:
                bad = low if low < info.min else high
                raise InvalidArgumentError(f"input '{name}': {bad} is out of range for {datatype}")
        array = np.array(values, dtype=dtype)
    return array.reshape(shape)


def _numeric(name: str, datatype: str) -> np.dtype:
    found = BY_NAME.get(datatype)
    if found is None or found.numpy is None:
        raise InvalidArgumentError(f"input '{name}': datatype {datatype} is not supported")
    return found.numpy


def output_bytes(array: np.ndarray, datatype: str) -> bytes:
    """An output's bytes on the wire (Triton's BYTES serialization for BYTES)."""
    return encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
