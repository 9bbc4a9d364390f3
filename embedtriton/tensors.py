"""Tensor data types and the BYTES wire format.

Numeric tensors travel as their numpy buffers (no copy on the way in; outputs
become numpy arrays that own Triton's response buffers). BYTES tensors use
Triton's serialization: each element is a 4-byte little-endian length followed by
its bytes.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

# Triton datatype name -> enum value (TRITONSERVER_DataType).
DATATYPE_VALUE = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13,
}  # fmt: skip

_NUMERIC = {
    ("b", 1): "BOOL",
    ("i", 1): "INT8", ("i", 2): "INT16", ("i", 4): "INT32", ("i", 8): "INT64",
    ("u", 1): "UINT8", ("u", 2): "UINT16", ("u", 4): "UINT32", ("u", 8): "UINT64",
    ("f", 2): "FP16", ("f", 4): "FP32", ("f", 8): "FP64",
}  # fmt: skip


def triton_dtype(dtype: Any, what: str = "tensor") -> str:
    """Triton's datatype name (``FP32``, ``BYTES``, ...) for a numpy dtype."""
    d = np.dtype(dtype)
    if d.kind in "OSU":
        return "BYTES"
    name = _NUMERIC.get((d.kind, d.itemsize))
    if name is None:
        raise InvalidArgumentError(
            f"{what}: dtype {d} has no Triton equivalent; use bool, (u)int8-64, float16/32/64 or bytes/object for BYTES"
        )
    return name


_LENGTH = struct.Struct("<I")


def encode_bytes(array: np.ndarray) -> bytes:
    """Serialize a BYTES tensor (object, ``np.bytes_`` or ``str`` array) in C order."""
    parts = []
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            if isinstance(item, np.generic) or isinstance(item, (int, float)):
                item = str(item).encode("utf-8")
            else:
                raise InvalidArgumentError(
                    f"BYTES tensors hold bytes or str; found an element of type {type(item).__name__}"
                )
        parts.append(_LENGTH.pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def decode_bytes(buffer: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Deserialize a BYTES tensor into an object array of ``bytes`` with ``shape``.

    The buffer is checked before anything is allocated: each element needs its 4-byte
    length, so a shape that declares more elements than the bytes sent could hold is
    refused at once (a 32-byte request must not allocate for 2**27 elements).
    """
    view = memoryview(buffer).cast("B")
    size = len(view)
    count = math.prod(shape)
    if count < 0:
        raise InvalidArgumentError(f"BYTES tensor: shape {list(shape)} has a negative dimension")
    if 4 * count > size:
        raise InvalidArgumentError(
            f"BYTES tensor of shape {list(shape)} holds {count} elements, each with a 4-byte length, "
            f"but only {size} bytes were sent"
        )
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > size:
            raise InvalidArgumentError(f"BYTES tensor: element {i} of {count} has no 4-byte length")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if length > size - offset:
            raise InvalidArgumentError(
                f"BYTES tensor: element {i} declares {length} bytes, but only {size - offset} remain"
            )
        out[i] = bytes(view[offset : offset + length])
        offset += length
    if offset != size:
        raise InvalidArgumentError(
            f"BYTES tensor of shape {list(shape)}: {size - offset} bytes are left after its {count} elements"
        )
    return out.reshape(shape)


_gpu_probe: tuple[int, str] | None = None


def cuda_devices() -> tuple[int, str]:
    """(number of CUDA devices this process sees, why none when 0), asked once of the CUDA
    runtime (``libcudart.so.12``: the Triton runtime's copy, else the system's)."""
    global _gpu_probe
    if _gpu_probe is not None:
        return _gpu_probe
    import ctypes

    from .runtime import find_runtime

    names = []
    try:
        names += sorted(str(p) for p in find_runtime().lib_dir.glob("libcudart*.so*"))
    except Exception:  # no runtime: try the system's CUDA runtime only
        pass
    names.append("libcudart.so.12")
    count, why = 0, "no CUDA runtime library (libcudart.so.12) could be loaded"
    for name in names:
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        n = ctypes.c_int(0)
        rc = cudart.cudaGetDeviceCount(ctypes.byref(n))
        count, why = (n.value, "") if rc == 0 else (0, f"cudaGetDeviceCount failed with CUDA error {rc}")
        if count == 0 and not why:
            why = "the CUDA runtime reports no device"
        break
    _gpu_probe = (count, why)
    return _gpu_probe


def require_gpu(what: str, device: int = 0) -> None:
    """Raise a clear UnsupportedError when ``what`` needs a CUDA GPU the process does not see."""
    from .errors import UnsupportedError

    count, why = cuda_devices()
    if count == 0:
        raise UnsupportedError(f"{what} needs a CUDA GPU, and this process sees none ({why})")
    if device >= count:
        raise UnsupportedError(f"{what} asks for GPU {device}, but this process sees {count} GPU(s)")
