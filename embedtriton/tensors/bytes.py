"""Triton's BYTES wire format: each element is a 4-byte little-endian length followed by its
bytes. (Numeric tensors travel as their numpy buffers, with no copy on the way in.)
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

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
    if any(d < 0 for d in shape):
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
