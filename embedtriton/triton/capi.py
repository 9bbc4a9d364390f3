"""The control-plane half of Triton's C API, declared by us through ctypes.

Calls that return a Triton error raise it as a :class:`TritonError`. The per-request path
lives in the native module; this module declares what :mod:`.options` and :mod:`.control`
use: server options, lifecycle, model loading, metadata, statistics and metrics.

Declarations follow ``tritonserver.h`` of Triton 2.51 (C API 1.34).
"""

from __future__ import annotations

import ctypes
import json
from ctypes import (
    POINTER,
    byref,
    c_bool,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import TYPE_CHECKING, Any

from ..errors import error_for_code
from .runtime import load_runtime

# TRITONSERVER_ModelControlMode
MODEL_CONTROL_EXPLICIT = 2
# TRITONSERVER_ParameterType
PARAMETER_STRING = 0
# TRITONSERVER_MetricFormat
METRIC_PROMETHEUS = 0

_P = c_void_p  # every opaque handle
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    # errors (the only functions that do not return an error)
    "TRITONSERVER_ErrorCode": (c_int, [_P]),
    "TRITONSERVER_ErrorMessage": (c_char_p, [_P]),
    "TRITONSERVER_ErrorDelete": (None, [_P]),
    "TRITONSERVER_ParameterNew": (_P, [c_char_p, c_int, c_void_p]),
    "TRITONSERVER_ParameterDelete": (None, [_P]),
    # everything below returns TRITONSERVER_Error* (NULL on success)
    "TRITONSERVER_ApiVersion": (_P, [POINTER(c_uint32), POINTER(c_uint32)]),
    "TRITONSERVER_MessageSerializeToJson": (_P, [_P, POINTER(c_char_p), POINTER(c_size_t)]),
    "TRITONSERVER_MessageDelete": (_P, [_P]),
    "TRITONSERVER_MetricsFormatted": (_P, [_P, c_int, POINTER(c_char_p), POINTER(c_size_t)]),
    "TRITONSERVER_MetricsDelete": (_P, [_P]),
    "TRITONSERVER_ServerOptionsNew": (_P, [POINTER(_P)]),
    "TRITONSERVER_ServerOptionsDelete": (_P, [_P]),
    "TRITONSERVER_ServerOptionsSetServerId": (_P, [_P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetModelRepositoryPath": (_P, [_P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetModelControlMode": (_P, [_P, c_int]),
    "TRITONSERVER_ServerOptionsSetStrictModelConfig": (_P, [_P, c_bool]),
    "TRITONSERVER_ServerOptionsSetModelLoadRetryCount": (_P, [_P, c_uint]),
    "TRITONSERVER_ServerOptionsSetEnablePeerAccess": (_P, [_P, c_bool]),
    "TRITONSERVER_ServerOptionsSetStrictReadiness": (_P, [_P, c_bool]),
    "TRITONSERVER_ServerOptionsSetExitTimeout": (_P, [_P, c_uint]),
    "TRITONSERVER_ServerOptionsSetBackendDirectory": (_P, [_P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetRepoAgentDirectory": (_P, [_P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetCacheDirectory": (_P, [_P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetCacheConfig": (_P, [_P, c_char_p, c_char_p]),
    "TRITONSERVER_ServerOptionsSetBackendConfig": (_P, [_P, c_char_p, c_char_p, c_char_p]),
    "TRITONSERVER_ServerOptionsSetLogInfo": (_P, [_P, c_bool]),
    "TRITONSERVER_ServerOptionsSetLogWarn": (_P, [_P, c_bool]),
    "TRITONSERVER_ServerOptionsSetLogError": (_P, [_P, c_bool]),
    "TRITONSERVER_ServerOptionsSetLogVerbose": (_P, [_P, c_int]),
    "TRITONSERVER_ServerOptionsSetLogFile": (_P, [_P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetLogFormat": (_P, [_P, c_int]),
    "TRITONSERVER_ServerOptionsSetMetrics": (_P, [_P, c_bool]),
    "TRITONSERVER_ServerOptionsSetGpuMetrics": (_P, [_P, c_bool]),
    "TRITONSERVER_ServerOptionsSetCpuMetrics": (_P, [_P, c_bool]),
    "TRITONSERVER_ServerOptionsSetMetricsInterval": (_P, [_P, c_uint64]),
    "TRITONSERVER_ServerOptionsSetPinnedMemoryPoolByteSize": (_P, [_P, c_uint64]),
    "TRITONSERVER_ServerOptionsSetCudaMemoryPoolByteSize": (_P, [_P, c_int, c_uint64]),
    "TRITONSERVER_ServerOptionsSetMinSupportedComputeCapability": (_P, [_P, c_double]),
    "TRITONSERVER_ServerNew": (_P, [POINTER(_P), _P]),
    "TRITONSERVER_ServerDelete": (_P, [_P]),
    "TRITONSERVER_ServerStop": (_P, [_P]),
    "TRITONSERVER_ServerSetExitTimeout": (_P, [_P, c_uint]),
    "TRITONSERVER_ServerIsLive": (_P, [_P, POINTER(c_bool)]),
    "TRITONSERVER_ServerIsReady": (_P, [_P, POINTER(c_bool)]),
    "TRITONSERVER_ServerModelIsReady": (_P, [_P, c_char_p, c_int64, POINTER(c_bool)]),
    "TRITONSERVER_ServerMetadata": (_P, [_P, POINTER(_P)]),
    "TRITONSERVER_ServerModelMetadata": (_P, [_P, c_char_p, c_int64, POINTER(_P)]),
    "TRITONSERVER_ServerModelStatistics": (_P, [_P, c_char_p, c_int64, POINTER(_P)]),
    "TRITONSERVER_ServerModelConfig": (_P, [_P, c_char_p, c_int64, c_uint32, POINTER(_P)]),
    "TRITONSERVER_ServerModelIndex": (_P, [_P, c_uint32, POINTER(_P)]),
    "TRITONSERVER_ServerLoadModelWithParameters": (_P, [_P, c_char_p, POINTER(_P), c_uint64]),
    "TRITONSERVER_ServerUnloadModel": (_P, [_P, c_char_p]),
    "TRITONSERVER_ServerMetrics": (_P, [_P, POINTER(_P)]),
}
_NO_ERROR_RETURN = {
    "TRITONSERVER_ErrorCode",
    "TRITONSERVER_ErrorMessage",
    "TRITONSERVER_ErrorDelete",
    "TRITONSERVER_ParameterNew",
    "TRITONSERVER_ParameterDelete",
}


class _Api:
    """The declared functions; calls that return a Triton error raise it instead."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.handle: int = library._handle
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(library, name)
            fn.restype = restype
            fn.argtypes = argtypes
            if name not in _NO_ERROR_RETURN:
                fn.errcheck = self._check
            setattr(self, name[len("TRITONSERVER_") :], fn)

    if TYPE_CHECKING:
        # the functions of _SIGNATURES, set by __init__ under their names less "TRITONSERVER_"
        def __getattr__(self, name: str) -> ctypes._CFunctionType: ...

    def _check(self, result: int | None, func: Any, args: Any) -> None:
        if result:
            code = self.ErrorCode(result)
            message = self.ErrorMessage(result).decode("utf-8", "replace")
            self.ErrorDelete(result)
            raise error_for_code(code, message)

    def message_json(self, message: int | c_void_p) -> Any:
        """Read a TRITONSERVER_Message as JSON and delete it."""
        base, size = c_char_p(), c_size_t()
        try:
            self.MessageSerializeToJson(message, byref(base), byref(size))
            return json.loads(ctypes.string_at(base, size.value))
        finally:
            self.MessageDelete(message)


_api: _Api | None = None


def api() -> _Api:
    """The C API of the process's Triton runtime (loaded on first use)."""
    global _api
    if _api is None:
        _runtime, library = load_runtime()
        _api = _Api(library)
    return _api


def out_handle() -> c_void_p:
    """A slot for a handle that a call fills in."""
    return c_void_p()


def flag() -> c_bool:
    return c_bool()
