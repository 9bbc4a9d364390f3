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
from ..core.request import sequence_flags
from ..errors import InvalidArgumentError, NotFoundError
from ..tensors import BY_NAME, decode_bytes, encode_bytes, triton_dtype
from ..triton.devices import cuda_devices
from .shared_memory import CudaRegion, Region, SharedMemory

EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"  # a stream's extra final response


# Triton's extensions (as its server metadata names them) that our endpoints implement. Not
# listed: model_repository(unload_dependents) (no dependents here); cuda_shared_memory is added
# where the server sees a GPU and binary_tensor_data by the HTTP endpoint (served_extensions).
EXTENSIONS = (
    "classification", "sequence", "model_repository", "schedule_policy", "model_configuration",
    "system_shared_memory", "parameters", "statistics", "trace", "logging",
)  # fmt: skip


def served_extensions(shared_memory: bool, tracing: bool) -> set[str]:
    """The extensions an endpoint serves: without ``shared_memory`` (its option) neither kind of
    shared memory; CUDA shared memory only where the server sees a GPU; trace only with a tracer."""
    served = set(EXTENSIONS)
    if shared_memory and cuda_devices()[0] > 0:
        served.add("cuda_shared_memory")
    if not shared_memory:
        served.discard("system_shared_memory")
    if not tracing:
        served.discard("trace")  # TraceSetting answers UNAVAILABLE without ServerConfig(tracing=...)
    return served


class Decoded:
    """A network request, decoded: the request object for ``model``, plus the shared-memory
    regions it reads or writes and the outputs it wants written into them."""

    __slots__ = ("model", "request", "in_shm", "classify", "regions")

    def __init__(self, model: Model) -> None:
        self.model = model
        self.request = InferRequest({})
        self.in_shm: set[str] = set()  # outputs written into shared memory
        self.classify: dict[str, int] = {}  # outputs asked for as their top-k classes
        self.regions: list[Region | CudaRegion] = []  # shared-memory regions it reads or writes

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
        request.sequence = (sequence_id, sequence_flags(start, end))
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


def shm_input(
    decoded: Decoded, shm: SharedMemory, ref: tuple[str, int, int], name: str, datatype: str, shape: tuple[int, ...]
) -> Any:
    """An input read from the shared memory a reference names, without a copy: a numpy view of a
    system region, a :class:`~embedtriton.DeviceArray` of a CUDA region (Triton gets the GPU
    pointer). Checked against the region, and its byte size against the shape."""
    region_name, offset, size = ref
    region = shm.get(region_name)
    if isinstance(region, CudaRegion):
        region.bounds(offset, size)
        if datatype == "BYTES":
            raise InvalidArgumentError(
                f"input '{name}': BYTES tensors cannot be read from CUDA shared memory (region "
                f"'{region_name}'); send them in the request or in system shared memory"
            )
        dtype = _numeric(name, datatype)
        if size != dtype.itemsize * math.prod(shape):
            raise InvalidArgumentError(f"input '{name}': {size} bytes do not fill shape {list(shape)} of {datatype}")
        array = region.array(offset, shape, dtype)
    else:
        array = array_from_bytes(name, datatype, shape, region.view(offset, size, f"input '{name}'"))
    decoded.regions.append(region)
    return array


def shm_output(decoded: Decoded, shm: SharedMemory, ref: tuple[str, int, int], name: str) -> Any:
    """The buffer an output is written into: a memoryview of a system region, the raw bytes of a
    CUDA region as a :class:`~embedtriton.DeviceArray` (Triton writes it in GPU memory)."""
    region_name, offset, size = ref
    region = shm.get(region_name)
    if isinstance(region, CudaRegion):
        region.bounds(offset, size)
        buffer = region.array(offset, (size,), None)
    else:
        buffer = region.view(offset, size, f"output '{name}'")
    decoded.regions.append(region)
    return buffer


def requested_outputs(decoded: Decoded, shm: SharedMemory, outputs: Sequence[tuple[str, Any]]) -> None:
    """The outputs to return, ``[(name, parameters)]``: names, or names -> shared-memory buffers,
    and those asked for as classifications. An output named twice is returned once, as Triton
    does; named twice with different parameters (two regions, say) it is refused, where Triton
    would silently write only one of them."""
    if not outputs:
        return
    buffers: dict[str, Any] = {}
    seen: dict[str, Any] = {}
    in_cuda: list[str] = []
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
            buffers[name] = shm_output(decoded, shm, ref, name)
            decoded.in_shm.add(name)
            if isinstance(decoded.regions[-1], CudaRegion):
                in_cuda.append(name)
        else:
            buffers[name] = None
            if count is not None:
                decoded.classify[name] = count
    if in_cuda:
        _refuse_bytes_in_cuda(decoded.model, in_cuda)
    decoded.request.outputs = buffers if decoded.in_shm else tuple(buffers)


def _refuse_bytes_in_cuda(model: Model, in_cuda: list[str]) -> None:
    """BYTES outputs are not written into CUDA shared memory (their size is known only once
    serialized on the host): refused before the request runs, from the model's metadata."""
    for output in model.metadata().get("outputs", []):
        if output.get("name") in in_cuda and output.get("datatype") == "BYTES":
            raise InvalidArgumentError(
                f"output '{output['name']}': BYTES tensors cannot be written into CUDA shared memory; "
                "ask for it in the response or in system shared memory"
            )


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


def output_datatype(array: Any) -> str:
    """An output's Triton datatype (a DeviceArray in CUDA shared memory names bfloat16 "BF16")."""
    dtype = array.dtype
    return dtype if isinstance(dtype, str) else triton_dtype(dtype)


def output_bytes(array: np.ndarray, datatype: str) -> bytes:
    """An output's bytes on the wire (Triton's BYTES serialization for BYTES)."""
    return encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
