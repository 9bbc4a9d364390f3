"""What :meth:`Model.submit` hands back besides outputs, and the native memory a frontend
holds: the frontends get these core objects and functions, never the native module's
capsules or functions (they do not import :mod:`embedtriton.backend.library`).

- :class:`Stream`: a stream's responses (``stream=True``): ``next(block)`` and ``close()``;
- :class:`Cancel`: a cancellable call in flight (``cancellable=True``): ``cancel()``;
- shared-memory mappings and CUDA IPC for the shared-memory extensions;
- :func:`grpc_model_infer`: a unary gRPC ModelInfer taken by the native C path; :func:`http_fast`:
  the C handler of plain HTTP/REST inference requests.
"""

from __future__ import annotations

from typing import Any

from ..backend import library
from ..backend.library import STREAM_EMPTY, STREAM_END, STREAM_ITEM

__all__ = [
    "STREAM_EMPTY",
    "STREAM_END",
    "STREAM_ITEM",
    "Cancel",
    "Memory",
    "Stream",
    "grpc_model_infer",
    "release_answered",
    "http_fast",
    "memory",
]


def _native() -> Any:
    return library._native or library.native()


class Stream:
    """The responses of one request submitted with ``stream=True``, in order."""

    __slots__ = ("_handle",)

    def __init__(self, handle: Any) -> None:
        self._handle = handle  # the native stream (a capsule)

    def next(self, block: bool) -> tuple[int, Any]:
        """``(STREAM_ITEM, outputs)``, ``(STREAM_EMPTY, None)`` when nothing has arrived yet
        (``block=False``), or ``(STREAM_END, None)`` once every response was taken. An error
        response raises (after the responses before it)."""
        return _native().stream_next(self._handle, block)

    def close(self) -> None:
        """The consumer is done: cancels the request if Triton is still working on it."""
        _native().stream_close(self._handle)


class Cancel:
    """One cancellable call in flight: :meth:`cancel` when its client went away (the call is
    still completed: CANCELLED, or its result if Triton had run it)."""

    __slots__ = ("_handle",)

    def __init__(self, handle: Any) -> None:
        self._handle = handle  # the native call (a capsule)

    def cancel(self) -> None:
        _native().cancel(self._handle)


def grpc_model_infer(call: Any, data: bytes, table: dict[Any, Any], bound: dict[str, Any], server: Any) -> Any:
    """A unary ModelInfer of the native gRPC transport (``call``, its message ``data``) taken by
    the C path (native/_native/kserve.c): its :class:`Cancel`; None when it declines;
    ``(model_name, model_version)`` when ``table`` has no valid entry for its model (see
    ``_native.grpc_model_infer``)."""
    handle = _native().grpc_model_infer(call, data, table, bound, server)
    return handle if handle is None or type(handle) is tuple else Cancel(handle)


def http_fast() -> Any:
    """The C handler of plain HTTP/REST inference requests that ``_h2.HttpServer.set_fast`` takes
    (``_native._HTTP_FAST``): the server's IO thread hands such a request to it before Python."""
    return _native()._HTTP_FAST


def release_answered() -> int:
    """Let go of the calls the C paths (gRPC and HTTP) answered since a request last took them
    (their messages and transport calls), as an endpoint stops; returns how many."""
    if library._native is None:
        return 0
    return int(library._native.release_answered())


class Memory:
    """The native memory functions the shared-memory extensions use."""

    __slots__ = ()

    @staticmethod
    def map_shared(fd: int, length: int) -> Any:
        """A mapping of a shared-memory file's first ``length`` bytes, guarded against SIGBUS."""
        return _native().map_shared(fd, length)

    @staticmethod
    def cuda_ipc_open(raw_handle: bytes, device_id: int) -> int:
        """Open a CUDA IPC memory handle (64 bytes): the device pointer."""
        return int(_native().cuda_ipc_open(raw_handle, device_id))

    @staticmethod
    def cuda_ipc_close(ptr: int, device_id: int) -> None:
        """Close what :meth:`cuda_ipc_open` opened."""
        _native().cuda_ipc_close(ptr, device_id)

    @staticmethod
    def device_array(ptr: int, shape: Any, dtype: Any, device_id: int, owner: Any) -> Any:
        """A DeviceArray: a view of device memory that keeps ``owner`` alive."""
        return _native().device_array(ptr, shape, dtype, device_id, owner)

    @staticmethod
    def cuda_allocation_size(ptr: int, device_id: int) -> int:
        """Bytes from ``ptr`` to the end of its CUDA allocation."""
        return int(_native().cuda_allocation_size(ptr, device_id))


_MEMORY = Memory()


def memory() -> Memory:
    """The native memory functions (shared-memory mappings, CUDA IPC) for the frontends."""
    return _MEMORY
