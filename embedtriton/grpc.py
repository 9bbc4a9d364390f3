"""KServe-v2 gRPC endpoint (``inference.GRPCInferenceService``) and gRPC health checking.

The service is written against a small transport interface (:class:`Service`):
``on_message(call, bytes)``, ``on_half_close(call)``, ``on_cancel(call)``, and a call with
``method``, ``metadata``, ``send(bytes)`` and ``finish(code, message)``. Messages are
parsed and built with the protobuf modules generated in ``tritonclient[grpc]`` and
``grpcio-health-checking``. Inference requests go through the same native path as
``Model.infer``; their completions are encoded and sent from the thread that completes
them, with no event-loop hop. The transport is embedtriton's native HTTP/2 server, or
grpcio's asyncio server on request (see :class:`GrpcEndpoint`).

Install with ``pip install "embedtriton[grpc]"``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import GrpcLimits
from .errors import (
    AlreadyExistsError,
    CancelledError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnsupportedError,
)
from .shared_memory import SystemSharedMemory
from .tensors import decode_bytes, encode_bytes, triton_dtype

if TYPE_CHECKING:
    from .server import Server

try:
    import grpc
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from grpc_health.v1 import health_pb2
    from tritonclient.grpc import model_config_pb2, service_pb2
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'the gRPC endpoint needs grpcio, grpcio-health-checking and tritonclient[grpc]: pip install "embedtriton[grpc]"'
    ) from exc

log = logging.getLogger("embedtriton")

# gRPC status codes
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS = 0, 1, 2, 3, 5, 6
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14

_NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}  # fmt: skip
_CONTENTS = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip
_CODES = [
    (InvalidArgumentError, INVALID_ARGUMENT),
    (NotFoundError, NOT_FOUND),
    (UnavailableError, UNAVAILABLE),
    (UnsupportedError, UNIMPLEMENTED),
    (AlreadyExistsError, ALREADY_EXISTS),
    (CancelledError, CANCELLED),
]
_DATATYPES = {np.dtype(t): name for name, t in _NUMPY.items()}
_KSERVE = "/inference.GRPCInferenceService/"
_STREAM_INFER = _KSERVE + "ModelStreamInfer"
_HEALTH = "/grpc.health.v1.Health/"
_STREAM_ITEM, _STREAM_EMPTY, _STREAM_END = 0, 1, 2  # native.stream_next statuses
_REFUSED = object()  # call.user of a unary call already answered with an error
_MAX_DIMS = 32  # as the native data path
_STOPPING = "the server is stopping: it takes no new requests"
_REFUSED_WHILE_DRAINING = {
    _KSERVE + name for name in ("RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryRegister")
}  # (inference requests are refused by _decode, for unary calls and streams alike)


def _code(error: BaseException) -> int:
    for cls, code in _CODES:
        if isinstance(error, cls):
            return code
    return INTERNAL


def _parameter(value: Any) -> Any:
    which = value.WhichOneof("parameter_choice")
    return getattr(value, which) if which else None


def _shm_params(tensor: Any) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) when a tensor names a shared-memory region."""
    params = tensor.parameters
    if "shared_memory_region" not in params:
        return None
    region = _parameter(params["shared_memory_region"])
    size = _parameter(params["shared_memory_byte_size"]) if "shared_memory_byte_size" in params else None
    offset = _parameter(params["shared_memory_offset"]) if "shared_memory_offset" in params else 0
    if not isinstance(region, str) or not isinstance(size, int) or not isinstance(offset, int):
        raise InvalidArgumentError(
            f"tensor '{tensor.name}': shared memory needs string shared_memory_region and integer "
            "shared_memory_byte_size (and optional shared_memory_offset) parameters"
        )
    return region, offset, size


class _Immediate:
    """Stands in for an event loop in the native completion path: completions run at
    once, on the Triton thread that delivers them (with the GIL)."""

    @staticmethod
    def call_soon_threadsafe(fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)


_IMMEDIATE = _Immediate()


class _InFlight:
    """``call.user`` of a unary ModelInfer handed to Triton: cancelled if the client leaves."""

    __slots__ = ("handle",)

    def __init__(self, handle: Any) -> None:
        self.handle = handle


class _Reply:
    """The future-like target of one ModelInfer (or one non-decoupled request of a stream)."""

    __slots__ = ("service", "call", "request", "decoded", "stream", "handle", "finished")

    def __init__(self, service: Service, call: Any, request: Any, decoded: _Decoded, stream: _Stream | None) -> None:
        self.service, self.call, self.request, self.decoded, self.stream = service, call, request, decoded, stream
        self.handle: Any = None  # native cancel handle (requests of a stream)
        self.finished = False

    def done(self) -> bool:
        return False

    def set_result(self, outputs: dict[str, Any]) -> None:
        try:
            self.decoded.check_regions()  # a region shrunk under the request: its data is lost
            response = self.service._encode(self.request, outputs, self.decoded.in_shm)
        except Exception as exc:
            self.set_exception(exc)
            return
        if self.stream is None:
            self.call.send(response.SerializeToString())
            self.call.finish(OK)
        else:
            if self.stream.final_flag(self.request):
                response.parameters["triton_final_response"].bool_param = True
            self.stream.send(service_pb2.ModelStreamInferResponse(infer_response=response))
            self._stream_done()

    def set_exception(self, exc: BaseException) -> None:
        if self.stream is None:
            self.call.finish(_code(exc), str(exc))
        else:
            self.stream.send(service_pb2.ModelStreamInferResponse(error_message=str(exc)))
            self._stream_done()

    def _stream_done(self) -> None:
        assert self.stream is not None
        self.finished = True
        self.stream.handles.discard(self.handle)
        self.stream.done_one()


class _Stream:
    """One ModelStreamInfer call: requests run as they arrive; the call ends once the
    client has half-closed (or the server drains) and every request has finished."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.lock = threading.Lock()
        self.pending = 0
        self.half_closed = False
        self.draining = False
        self.cancelled = False
        self.handles: set[Any] = set()  # native handles of its requests in flight, to cancel them

    @staticmethod
    def final_flag(request: Any) -> bool:
        p = request.parameters.get("triton_enable_empty_final_response")
        return bool(p is not None and _parameter(p))

    def send(self, message: Any) -> None:
        if not self.cancelled:
            self.call.send(message.SerializeToString())

    def begin_one(self) -> None:
        with self.lock:
            self.pending += 1

    def done_one(self) -> None:
        with self.lock:
            self.pending -= 1
            finished = (self.half_closed or self.draining) and self.pending == 0
        if finished:
            self._end()

    def close(self) -> None:
        with self.lock:
            self.half_closed = True
            finished = self.pending == 0
        if finished:
            self._end()

    def drain(self) -> None:
        """The server stops: end the stream once its requests in flight have answered."""
        with self.lock:
            self.draining = True
            finished = self.pending == 0
        if finished:
            self._end()

    def _end(self) -> None:
        if self.half_closed:
            self.call.finish(OK)
        else:
            self.call.finish(UNAVAILABLE, _STOPPING)


class Service:
    """KServe-v2 inference service plus ``grpc.health.v1`` for one :class:`Server`."""

    def __init__(self, server: Server, shared_memory: bool = True) -> None:
        self.server = server
        self.shm = SystemSharedMemory()
        self.shared_memory = shared_memory
        s = service_pb2
        self._unary: dict[str, tuple[Any, Callable[[Any, Any], Any]]] = {
            _KSERVE + "ServerLive": (s.ServerLiveRequest, self.server_live),
            _KSERVE + "ServerReady": (s.ServerReadyRequest, self.server_ready),
            _KSERVE + "ModelReady": (s.ModelReadyRequest, self.model_ready),
            _KSERVE + "ServerMetadata": (s.ServerMetadataRequest, self.server_metadata),
            _KSERVE + "ModelMetadata": (s.ModelMetadataRequest, self.model_metadata),
            _KSERVE + "ModelConfig": (s.ModelConfigRequest, self.model_config),
            _KSERVE + "ModelStatistics": (s.ModelStatisticsRequest, self.model_statistics),
            _KSERVE + "RepositoryIndex": (s.RepositoryIndexRequest, self.repository_index),
            _KSERVE + "RepositoryModelLoad": (s.RepositoryModelLoadRequest, self.model_load),
            _KSERVE + "RepositoryModelUnload": (s.RepositoryModelUnloadRequest, self.model_unload),
            _KSERVE + "SystemSharedMemoryStatus": (s.SystemSharedMemoryStatusRequest, self.shm_status),
            _KSERVE + "SystemSharedMemoryRegister": (s.SystemSharedMemoryRegisterRequest, self.shm_register),
            _KSERVE + "SystemSharedMemoryUnregister": (s.SystemSharedMemoryUnregisterRequest, self.shm_unregister),
            _KSERVE + "CudaSharedMemoryStatus": (s.CudaSharedMemoryStatusRequest, self.cuda_shm),
            _KSERVE + "CudaSharedMemoryRegister": (s.CudaSharedMemoryRegisterRequest, self.cuda_shm),
            _KSERVE + "CudaSharedMemoryUnregister": (s.CudaSharedMemoryUnregisterRequest, self.cuda_shm),
            _KSERVE + "TraceSetting": (s.TraceSettingRequest, self.trace_setting),
            _KSERVE + "LogSettings": (s.LogSettingsRequest, self.log_settings),
            _KSERVE + "ModelInfer": (s.ModelInferRequest, self.model_infer),
            _HEALTH + "Check": (health_pb2.HealthCheckRequest, self.health_check),
            _HEALTH + "Watch": (health_pb2.HealthCheckRequest, self.health_watch),
        }
        self.draining = False  # stop() began: new requests are refused, those in flight finish
        self._streams: weakref.WeakSet[_Stream] = weakref.WeakSet()  # ModelStreamInfer calls, to drain
        self._streams_lock = threading.Lock()
        self._watch_lock = threading.Lock()
        self._watchers: dict[Any, tuple[str, int]] = {}  # Watch calls -> (service, last status sent)
        self._watch_thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- transport interface ----------------------------------------------------

    def on_message(self, call: Any, data: bytes) -> None:
        """One request message of ``call``."""
        if call.method == _STREAM_INFER:
            self._stream_message(call, data)
            return
        entry = self._unary_entry(call)
        if entry is None or call.user is _REFUSED:
            return
        if call.user is not None:
            call.finish(INVALID_ARGUMENT, f"{call.method} takes one request message")
            call.user = _REFUSED
            return
        try:
            call.user = entry[0].FromString(data)
        except DecodeError:
            call.finish(INVALID_ARGUMENT, f"malformed {entry[0].DESCRIPTOR.name} message")
            call.user = _REFUSED

    def on_half_close(self, call: Any) -> None:
        """The client sent its last message: run a unary call; end a drained stream."""
        if call.method == _STREAM_INFER:
            stream = call.user
            if stream is None:
                call.finish(OK)
            else:
                stream.close()
            return
        if call.user is _REFUSED:  # already answered with an error: never run it
            return
        entry = self._unary_entry(call)
        if entry is None:
            return
        if self.draining and call.method in _REFUSED_WHILE_DRAINING:
            call.finish(UNAVAILABLE, _STOPPING)
            return
        request = call.user
        if request is None:
            request = entry[0]()  # an empty message is valid protobuf
        try:
            response = entry[1](request, call)
        except TritonError as exc:
            call.finish(_code(exc), str(exc))
            return
        except Exception as exc:  # a bug of ours: report it, keep serving
            log.exception("gRPC %s failed", call.method)
            call.finish(INTERNAL, f"{type(exc).__name__}: {exc}")
            return
        if response is not None:  # None: the call completes later (ModelInfer, Watch)
            call.send(response.SerializeToString())
            call.finish(OK)

    def _unary_entry(self, call: Any) -> tuple[Any, Callable[[Any, Any], Any]] | None:
        """(request class, handler) of a unary method; UNIMPLEMENTED for unknown ones."""
        entry = self._unary.get(call.method)
        if entry is None:
            call.finish(UNIMPLEMENTED, f"method {call.method} is not implemented by this server")
        return entry

    def on_cancel(self, call: Any) -> None:
        """The client went away (reset the call, closed the connection): stop its work."""
        from . import _native

        user = call.user
        if type(user) is _InFlight:  # a ModelInfer that Triton may not have run yet
            _native.cancel(user.handle)
            return
        with self._watch_lock:
            self._watchers.pop(call, None)
        if isinstance(user, _Stream):
            user.cancelled = True
            for handle in list(user.handles):
                if type(handle) is _InFlight:
                    _native.cancel(handle.handle)
                else:  # a decoupled request's stream
                    _native.stream_close(handle)

    def drain(self) -> None:
        """The server stops: refuse new requests (UNAVAILABLE; health says NOT_SERVING) while the
        requests in flight finish; streams end once theirs have answered."""
        self.draining = True
        with self._streams_lock:
            streams = list(self._streams)
        for stream in streams:
            stream.drain()

    def stop(self) -> None:
        self.draining = True
        self._stopping.set()
        with self._watch_lock:
            watchers, self._watchers = list(self._watchers), {}
        for call in watchers:
            call.send(
                health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING).SerializeToString()
            )
            call.finish(UNAVAILABLE, "the server is stopping")
        self.shm.unregister()

    # -- server and model information ---------------------------------------------

    def server_live(self, request: Any, call: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=self.server.live)

    def server_ready(self, request: Any, call: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.server.ready)

    def _model(self, name: str) -> Any:
        return self.server.model(name)  # NotFoundError for unknown names

    def model_ready(self, request: Any, call: Any) -> Any:
        ready = request.name in self.server._bound and self.server.model(request.name).ready
        return service_pb2.ModelReadyResponse(ready=ready)

    def server_metadata(self, request: Any, call: Any) -> Any:
        meta = self.server.metadata()
        return service_pb2.ServerMetadataResponse(
            name=meta.get("name", ""), version=meta.get("version", ""), extensions=meta.get("extensions", [])
        )

    def model_metadata(self, request: Any, call: Any) -> Any:
        meta = self._model(request.name).metadata()
        return json_format.ParseDict(meta, service_pb2.ModelMetadataResponse(), ignore_unknown_fields=True)

    def model_config(self, request: Any, call: Any) -> Any:
        config = self._model(request.name).config()
        parsed = json_format.ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
        return service_pb2.ModelConfigResponse(config=parsed)

    def model_statistics(self, request: Any, call: Any) -> Any:
        names = [request.name] if request.name else list(self.server._bound)
        stats = [self._model(n).statistics() for n in names]
        return json_format.ParseDict(
            {"model_stats": stats}, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True
        )

    def repository_index(self, request: Any, call: Any) -> Any:
        entries = []
        for model in self.server.models():
            ready = model.ready
            if request.ready and not ready:
                continue
            entries.append(
                service_pb2.RepositoryIndexResponse.ModelIndex(
                    name=model.name, version="1", state="READY" if ready else "UNAVAILABLE"
                )
            )
        return service_pb2.RepositoryIndexResponse(models=entries)

    def model_load(self, request: Any, call: Any) -> Any:
        if request.parameters:
            raise InvalidArgumentError(
                "RepositoryModelLoad reloads a bound model as bound; config and file parameters are not supported"
            )
        self._run_blocking(call, lambda: self.server.load(request.model_name), service_pb2.RepositoryModelLoadResponse)

    def model_unload(self, request: Any, call: Any) -> Any:
        self._run_blocking(
            call, lambda: self.server.unload(request.model_name), service_pb2.RepositoryModelUnloadResponse
        )

    @staticmethod
    def _run_blocking(call: Any, work: Callable[[], Any], response: Any) -> None:
        """Run slow work (model load/unload) off the transport's thread; answer when done."""

        def run() -> None:
            try:
                work()
            except TritonError as exc:
                call.finish(_code(exc), str(exc))
                return
            except Exception as exc:
                log.exception("gRPC %s failed", call.method)
                call.finish(INTERNAL, f"{type(exc).__name__}: {exc}")
                return
            call.send(response().SerializeToString())
            call.finish(OK)

        threading.Thread(target=run, name="embedtriton-grpc-admin", daemon=True).start()

    # -- settings -----------------------------------------------------------------

    def log_settings(self, request: Any, call: Any) -> Any:
        changes = {}
        for key, value in request.settings.items():
            which = value.WhichOneof("parameter_choice")
            if which is None:
                continue
            changes["log_verbose_level" if key == "log_verbose_level" else key] = getattr(value, which)
        settings = self.server.log_settings(**changes)
        response = service_pb2.LogSettingsResponse()
        for key, value in settings.items():
            entry = response.settings[key]
            if isinstance(value, bool):
                entry.bool_param = value
            elif isinstance(value, int):
                entry.uint32_param = value
            else:
                entry.string_param = str(value)
        return response

    def trace_setting(self, request: Any, call: Any) -> Any:
        tracer = self.server._tracer
        if tracer is None:
            raise UnavailableError("tracing is off: start the server with ServerConfig(tracing=Tracing(...))")
        if request.model_name:
            raise InvalidArgumentError("trace settings are server-wide here; leave model_name empty")
        changes: dict[str, Any] = {}
        for key, value in request.settings.items():
            values = list(value.value)
            if key == "trace_level":
                changes["level"] = "OFF" if not values or "OFF" in values else "TIMESTAMPS"
                if any(v not in ("OFF", "TIMESTAMPS") for v in values):
                    raise InvalidArgumentError(f"trace_level {values}: only TIMESTAMPS and OFF are supported")
            elif key in ("trace_rate", "trace_count"):
                try:
                    changes[key[6:]] = int(values[0]) if values else {"trace_rate": 1, "trace_count": -1}[key]
                except ValueError:
                    raise InvalidArgumentError(f"{key} must be an integer, not {values[0]!r}") from None
            else:
                raise InvalidArgumentError(
                    f"trace setting '{key}' is not supported (spans go to the OpenTelemetry TracerProvider); "
                    "supported: trace_level, trace_rate, trace_count"
                )
        settings = tracer.update(**changes) if changes else tracer.settings
        response = service_pb2.TraceSettingResponse()
        response.settings["trace_level"].value.append(settings.level)
        response.settings["trace_rate"].value.append(str(settings.rate))
        response.settings["trace_count"].value.append(str(settings.count))
        return response

    # -- shared memory --------------------------------------------------------------

    def shm_register(self, request: Any, call: Any) -> Any:
        if not self.shared_memory:
            raise UnsupportedError(
                "system shared memory is turned off on this endpoint (serve_grpc(shared_memory=False))"
            )
        self.shm.register(request.name, request.key, request.offset, request.byte_size)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    def shm_unregister(self, request: Any, call: Any) -> Any:
        self.shm.unregister(request.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    def shm_status(self, request: Any, call: Any) -> Any:
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for r in self.shm.status(request.name):
            response.regions[r.name].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
            )
        return response

    def cuda_shm(self, request: Any, call: Any) -> Any:
        raise UnsupportedError(
            "CUDA shared memory is not supported by this endpoint; use system shared memory "
            "(SystemSharedMemoryRegister) or send tensors in the request"
        )

    # -- health ---------------------------------------------------------------------

    def _health(self, service: str) -> int | None:
        H = health_pb2.HealthCheckResponse
        if self.draining:
            return H.NOT_SERVING if not service or service in self.server._bound else None
        if not service:
            return H.SERVING if self.server.ready else H.NOT_SERVING
        if service not in self.server._bound:
            return None
        return H.SERVING if self.server.model(service).ready else H.NOT_SERVING

    def health_check(self, request: Any, call: Any) -> Any:
        status = self._health(request.service)
        if status is None:
            raise NotFoundError(f"unknown service '{request.service}': use '' for the server or a model name")
        return health_pb2.HealthCheckResponse(status=status)

    def health_watch(self, request: Any, call: Any) -> None:
        status = self._health(request.service)
        if status is None:
            status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        call.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
        with self._watch_lock:
            self._watchers[call] = (request.service, status)
            if self._watch_thread is None:
                self._watch_thread = threading.Thread(target=self._watch, name="embedtriton-health", daemon=True)
                self._watch_thread.start()

    def _watch(self) -> None:
        """Send each watcher its status when it changes (checked every 0.2 s)."""
        while not self._stopping.wait(0.2):
            with self._watch_lock:
                watchers = list(self._watchers.items())
            for call, (service, last) in watchers:
                status = self._health(service)
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN if status is None else status
                if status != last:
                    call.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
                    with self._watch_lock:
                        if call in self._watchers:
                            self._watchers[call] = (service, status)

    # -- inference ------------------------------------------------------------------

    def _decode(self, request: Any) -> _Decoded:
        """A ModelInferRequest, checked, as the arguments of the native submit.

        Every size is checked against the bytes actually received before anything is
        allocated; a client's mistake is an InvalidArgumentError for that request only.
        """
        if self.draining:
            raise UnavailableError(_STOPPING)
        model = self._model(request.model_name)
        raw = request.raw_input_contents
        if raw and len(raw) != len(request.inputs):
            raise InvalidArgumentError(
                f"{len(raw)} raw input contents for {len(request.inputs)} inputs: give all or none"
            )
        decoded = _Decoded(model)
        try:
            for i, tensor in enumerate(request.inputs):
                decoded.inputs[tensor.name] = self._input_array(tensor, raw[i] if raw else None, decoded)
            params = {k: _parameter(v) for k, v in request.parameters.items()}
            params.pop("triton_enable_empty_final_response", None)
            outputs: Any = None
            if request.outputs:
                buffers: dict[str, Any] = {}
                for o in request.outputs:
                    shm = _shm_params(o)
                    if shm is not None:
                        region, offset, size = shm
                        found = self.shm.get(region)
                        buffers[o.name] = found.view(offset, size, f"output '{o.name}'")
                        decoded.regions.append(found)
                        decoded.in_shm.add(o.name)
                    else:
                        buffers[o.name] = None
                outputs = buffers if decoded.in_shm else tuple(buffers)
        except TritonError:
            raise
        except (ValueError, TypeError, OverflowError, struct.error) as exc:  # malformed values: the client's
            raise InvalidArgumentError(f"malformed ModelInferRequest: {exc}") from None
        decoded.outputs = outputs
        decoded.request_id = request.id or None
        decoded.priority = params.pop("priority", None)
        decoded.timeout_us = params.pop("timeout", None)
        sequence_id = params.pop("sequence_id", None)
        start = bool(params.pop("sequence_start", False))
        end = bool(params.pop("sequence_end", False))
        if sequence_id not in (None, 0, ""):
            decoded.sequence = (sequence_id, (1 if start else 0) | (2 if end else 0))
        decoded.parameters = params or None
        return decoded

    def _input_array(self, tensor: Any, raw: bytes | None, decoded: _Decoded) -> np.ndarray:
        shape = tuple(tensor.shape)
        if len(shape) > _MAX_DIMS:
            raise InvalidArgumentError(
                f"input '{tensor.name}' has {len(shape)} dimensions; at most {_MAX_DIMS} are supported"
            )
        if any(d < 0 for d in shape):
            raise InvalidArgumentError(f"input '{tensor.name}': shape {list(shape)} has a negative dimension")
        datatype = tensor.datatype
        shm = _shm_params(tensor)
        if shm is not None:
            region, offset, size = shm
            found = self.shm.get(region)
            data: Any = found.view(offset, size, f"input '{tensor.name}'")
            decoded.regions.append(found)
        else:
            data = raw
        if data is not None:
            if datatype == "BYTES":
                try:
                    return decode_bytes(data, shape)
                except InvalidArgumentError as exc:
                    raise InvalidArgumentError(f"input '{tensor.name}': {exc}") from None
            if datatype not in _NUMPY:
                raise InvalidArgumentError(f"input '{tensor.name}': datatype {datatype} is not supported")
            dtype = np.dtype(_NUMPY[datatype])
            if len(data) != dtype.itemsize * math.prod(shape):
                raise InvalidArgumentError(
                    f"input '{tensor.name}': {len(data)} bytes do not fill shape {list(shape)} of {datatype}"
                )
            return np.frombuffer(data, dtype=dtype).reshape(shape)  # a view: no copy
        field = _CONTENTS.get(datatype)
        if field is None:
            raise InvalidArgumentError(f"input '{tensor.name}': datatype {datatype} has no typed contents")
        values = getattr(tensor.contents, field)  # as many as were sent: bounded by the message
        if len(values) != math.prod(shape):
            raise InvalidArgumentError(f"input '{tensor.name}': {len(values)} values do not fill shape {list(shape)}")
        if datatype == "BYTES":
            array = np.empty(len(values), dtype=object)
            array[:] = list(values)
        else:
            array = np.array(values, dtype=_NUMPY[datatype])
        return array.reshape(shape)

    @staticmethod
    def _encode(request: Any, outputs: dict[str, Any], in_shm: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
        response = service_pb2.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version or "1", id=request.id
        )
        for name, array in outputs.items():
            datatype = _DATATYPES.get(array.dtype) or triton_dtype(array.dtype)
            tensor = response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
            if name in in_shm:  # already written into the client's region
                tensor.parameters["shared_memory_byte_size"].int64_param = array.nbytes
                response.raw_output_contents.append(b"")
            else:
                response.raw_output_contents.append(
                    encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
                )
        return response

    def _submit(self, call: Any, decoded: _Decoded, target: Any, stream: bool) -> Any:
        """Hand a decoded request to the native path; returns its cancel (or stream) handle."""
        tracer = self.server._tracer
        parent = tracer.context_from_metadata(dict(call.metadata)) if tracer is not None else None
        return decoded.model._submit(
            decoded.inputs, decoded.outputs, decoded.request_id, decoded.priority, decoded.timeout_us,
            decoded.parameters, _IMMEDIATE, target, stream, decoded.sequence, parent, cancellable=not stream,
        )  # fmt: skip

    def model_infer(self, request: Any, call: Any) -> None:
        decoded = self._decode(request)
        handle = self._submit(call, decoded, _Reply(self, call, request, decoded, None), False)
        if handle is not None:
            call.user = _InFlight(handle)  # on_cancel cancels it in Triton

    def _stream_message(self, call: Any, data: bytes) -> None:
        stream = call.user
        if stream is None:
            stream = call.user = _Stream(call)
            with self._streams_lock:
                self._streams.add(stream)
        try:
            request = service_pb2.ModelInferRequest.FromString(data)
        except DecodeError:
            stream.send(service_pb2.ModelStreamInferResponse(error_message="malformed ModelInferRequest message"))
            return
        stream.begin_one()
        try:  # a request's mistake fails that request only; the stream goes on
            decoded = self._decode(request)
            binding = self.server._bound.get(request.model_name)
            if binding is not None and binding.decoupled:
                self._stream_decoupled(stream, call, request, decoded)
            else:
                reply = _Reply(self, call, request, decoded, stream)
                handle = self._submit(call, decoded, reply, False)
                if handle is not None and not reply.finished:
                    reply.handle = _InFlight(handle)
                    stream.handles.add(reply.handle)
        except Exception as exc:
            if not isinstance(exc, TritonError):
                log.exception("gRPC ModelStreamInfer request failed")
            stream.send(service_pb2.ModelStreamInferResponse(error_message=str(exc)))
            stream.done_one()

    def _stream_decoupled(self, stream: _Stream, call: Any, request: Any, decoded: _Decoded) -> None:
        """One request of a decoupled model: its responses go out as they arrive."""
        from . import _native

        final_flag = stream.final_flag(request)
        state: dict[str, Any] = {"handle": None, "early": False}
        lock = threading.Lock()

        def drain() -> None:
            handle = state["handle"]
            if handle is None:  # a response came before _submit returned
                state["early"] = True
                return
            with lock:
                if state.get("ended"):
                    return
                while True:
                    try:
                        status, outputs = _native.stream_next(handle, False)
                        if status == _STREAM_ITEM:
                            decoded.check_regions()
                    except TritonError as exc:
                        stream.send(service_pb2.ModelStreamInferResponse(error_message=str(exc)))
                        status = _STREAM_END
                    if status == _STREAM_EMPTY:
                        return
                    if status == _STREAM_END:
                        break
                    response = self._encode(request, outputs, decoded.in_shm)
                    if final_flag:
                        response.parameters["triton_final_response"].bool_param = False
                    stream.send(service_pb2.ModelStreamInferResponse(infer_response=response))
                state["ended"] = True
            if final_flag:
                empty = service_pb2.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version or "1", id=request.id
                )
                empty.parameters["triton_final_response"].bool_param = True
                stream.send(service_pb2.ModelStreamInferResponse(infer_response=empty))
            stream.handles.discard(handle)
            _native.stream_close(handle)
            stream.done_one()

        handle = self._submit(call, decoded, drain, True)
        state["handle"] = handle
        stream.handles.add(handle)
        if state["early"] or stream.cancelled:
            drain()


class _Decoded:
    """One ModelInferRequest as the native submit takes it, plus the shared memory it uses."""

    __slots__ = (
        "model", "inputs", "outputs", "request_id", "priority", "timeout_us", "parameters", "sequence",
        "in_shm", "regions",
    )  # fmt: skip

    def __init__(self, model: Any) -> None:
        self.model = model
        self.inputs: dict[str, Any] = {}
        self.outputs: Any = None
        self.request_id: str | None = None
        self.priority: Any = None
        self.timeout_us: Any = None
        self.parameters: dict[str, Any] | None = None
        self.sequence: tuple[Any, int] | None = None
        self.in_shm: set[str] = set()  # outputs written into shared memory
        self.regions: list[Any] = []  # shared-memory regions it reads or writes

    def check_regions(self) -> None:
        for region in self.regions:
            region.check()


class _GrpcioCall:
    """The transport interface's call, over one grpcio asyncio RPC."""

    __slots__ = ("method", "metadata", "peer", "user", "_loop", "_queue", "_finished")

    def __init__(self, method: str, metadata: Any, peer: str, loop: asyncio.AbstractEventLoop) -> None:
        self.method = method
        self.metadata = [(m.key, m.value) for m in metadata or ()]
        self.peer = peer
        self.user: Any = None
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._finished = False

    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the endpoint stopped
            pass

    def send(self, data: bytes) -> None:
        if not self._finished:
            self._put(data)

    def finish(self, code: int, message: str = "") -> None:
        if not self._finished:
            self._finished = True
            self._put((code, message))


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _Generic(grpc.GenericRpcHandler):
    """Every method as a raw-bytes stream-stream handler (on the wire unary and streaming
    calls look the same), fed to :class:`Service`."""

    def __init__(self, svc: Service) -> None:
        self._svc = svc

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method
        svc = self._svc

        async def behaviour(requests: Any, context: Any) -> Any:
            call = _GrpcioCall(method, context.invocation_metadata(), context.peer(), asyncio.get_running_loop())

            async def pump() -> None:
                try:
                    async for data in requests:
                        svc.on_message(call, data)
                    svc.on_half_close(call)
                except Exception as exc:  # a bug of ours: fail this call, keep serving
                    if not isinstance(exc, asyncio.CancelledError):
                        log.exception("gRPC %s failed", method)
                        call.finish(INTERNAL, f"{type(exc).__name__}: {exc}")

            reader = asyncio.ensure_future(pump())
            done = False
            try:
                while True:
                    item = await call._queue.get()
                    if isinstance(item, tuple):
                        done = True
                        code, message = item
                        if code != OK:
                            await context.abort(_STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN), message)
                        return
                    yield item
            finally:
                if not done:
                    call._finished = True
                    svc.on_cancel(call)
                reader.cancel()

        return grpc.stream_stream_rpc_method_handler(behaviour)


class GrpcEndpoint:
    """A gRPC server for the KServe-v2 and health services of a Server.

    ``transport="native"`` (the default) is embedtriton's own HTTP/2 transport
    (``embedtriton._h2``, on libnghttp2): one IO thread, the Python service called once per
    message with no event loop in between. ``transport="grpcio"`` serves the same service on
    grpcio's asyncio server, about 2.5x slower (see benchmarks/bench_grpc.py).
    """

    def __init__(
        self,
        server: Server,
        address: str,
        max_message_bytes: int = 64 * 1024 * 1024,
        tls: tuple[str, str, str | None] | None = None,
        transport: str = "native",
        limits: GrpcLimits | None = None,
        shared_memory: bool = True,
    ) -> None:
        if transport not in ("native", "grpcio"):
            raise InvalidArgumentError(f"transport must be 'native' or 'grpcio', not {transport!r}")
        self.address = address
        self.service = Service(server, shared_memory)
        self._native: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if transport == "native":
            self._start_native(address, max_message_bytes, tls, limits or GrpcLimits())
        else:
            self._start_grpcio(address, max_message_bytes, tls)

    def _start_native(self, address: str, max_message_bytes: int, tls: Any, limits: GrpcLimits) -> None:
        from . import _h2

        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise InvalidArgumentError(f"gRPC address must look like host:port, not {address!r}")
        host = host.strip("[]") or "0.0.0.0"
        try:
            self._native = _h2.Server(
                host, int(port), self.service, max_message_bytes, tls, _nghttp2_path(), **limits.transport_options()
            )
        except ValueError as exc:  # e.g. a TLS certificate or key file that does not load
            raise InvalidArgumentError(f"cannot serve gRPC on {address}: {exc}") from exc
        except (OSError, RuntimeError) as exc:
            raise UnavailableError(f"cannot serve gRPC on {address}: {exc}") from exc
        self.port = self._native.port
        library = _h2.library()
        missing = [name for name in ("reset_rate_limit", "max_continuations") if not library[name]]
        log.info(
            "gRPC transport: libnghttp2 %s from %s%s",
            library["version"],
            library["path"],
            f" (without {', '.join(missing)}: an old copy; set EMBEDTRITON_NGHTTP2 to a newer one)" if missing else "",
        )

    def _start_grpcio(self, address: str, max_message_bytes: int, tls: Any) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="embedtriton-grpc", daemon=True)
        self._thread.start()
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        credentials = _credentials(tls) if tls else None

        async def start() -> tuple[Any, int]:
            grpc_server = grpc.aio.server(options=options)
            grpc_server.add_generic_rpc_handlers([_Generic(self.service)])
            if credentials is not None:
                port = grpc_server.add_secure_port(address, credentials)
            else:
                port = grpc_server.add_insecure_port(address)
            await grpc_server.start()
            return grpc_server, port

        try:
            self._server, self.port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
        except Exception as exc:
            loop.call_soon_threadsafe(loop.stop)
            raise UnavailableError(f"cannot serve gRPC on {address}: {exc}") from exc
        if self.port == 0:
            self.stop()
            raise UnavailableError(f"cannot serve gRPC on {address}: the address is in use or invalid")

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving: calls in progress get ``grace`` seconds to finish."""
        self.service.stop()
        if self._native is not None:
            self._native.stop(grace)
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._server.stop(grace), loop)
        try:
            future.result(timeout=grace + 5)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=5)
            loop.close()


def _nghttp2_path() -> str | None:
    """The Triton runtime's own libnghttp2, for machines without the system's."""
    from .runtime import find_runtime

    try:
        found = sorted(find_runtime().lib_dir.glob("libnghttp2*.so*"))
    except TritonError:
        return None
    return str(found[0]) if found else None


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read the TLS {what} '{path}': {exc.strerror}") from None


def _credentials(tls: tuple[str, str, str | None]) -> Any:
    """Server TLS credentials; with a client CA, clients must present a certificate it signed."""
    cert, key, client_ca = tls
    return grpc.ssl_server_credentials(
        [(_read(key, "private key"), _read(cert, "certificate"))],
        root_certificates=_read(client_ca, "client CA") if client_ca else None,
        require_client_auth=bool(client_ca),
    )
