"""Tensors: the dtype table (:mod:`.dtypes`) and Triton's BYTES wire format (:mod:`.bytes`)."""

from .bytes import decode_bytes, encode_bytes
from .dtypes import BY_NAME, DTYPES, DType, as_numpy_dtype, triton_dtype

__all__ = ["BY_NAME", "DTYPES", "DType", "as_numpy_dtype", "decode_bytes", "encode_bytes", "triton_dtype"]
