"""PyTriton's clients (``pytriton.client``), on the stock ``tritonclient`` package:
``ModelClient``, ``DecoupledModelClient``, ``AsyncioModelClient``,
``AsyncioDecoupledModelClient``, ``FuturesModelClient``. They talk KServe-v2 to any Triton-like
server (``http://``, ``grpc://`` or a bare ``host:port``, which means HTTP)."""

from .aio import AsyncioDecoupledModelClient, AsyncioModelClient
from .client import DecoupledModelClient, ModelClient
from .futures import FuturesModelClient

__all__ = [
    "AsyncioDecoupledModelClient",
    "AsyncioModelClient",
    "DecoupledModelClient",
    "FuturesModelClient",
    "ModelClient",
]
