"""The KServe-v2 service (``inference.GRPCInferenceService``) and ``grpc.health.v1.Health``
for one server: the method table, server and model information, repository control, settings,
shared-memory registration and health. Inference is in :mod:`.infer`.

Messages are parsed and built with the protobuf modules generated in ``tritonclient[grpc]``
and ``grpcio-health-checking``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

from ...core import CoreServer
from ...core.handles import release_answered
from ...errors import (
    SERVER_STOPPING,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnsupportedError,
)
from .. import kserve, kserve_extensions
from ..security import GRPC_GROUPS
from ..shared_memory import CUDA, SYSTEM, refuse_cuda_without_gpu, regions_of
from .infer import Inference, InFlight, Stream
from .options import GrpcOptions
from .repository import Repository
from .transport import INTERNAL, INVALID_ARGUMENT, OK, UNAVAILABLE, UNIMPLEMENTED, Call, code_of, response_compression

log = logging.getLogger("embedtriton")


@functools.cache
def _h2_call() -> type:
    """The native transport's Call type (the C path answers only those)."""
    from ... import _h2

    return _h2.Call


_KSERVE = "/inference.GRPCInferenceService/"
_STREAM_INFER = _KSERVE + "ModelStreamInfer"
_MODEL_INFER = _KSERVE + "ModelInfer"
_HEALTH = "/grpc.health.v1.Health/"
_REFUSED = object()  # call.user of a unary call already answered with an error
_REFUSED_WHILE_DRAINING = {
    _KSERVE + name for name in ("RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryRegister")
}  # (inference requests are refused by Inference.decode, for unary calls and streams alike)


class Service:
    """KServe-v2 inference service plus ``grpc.health.v1`` for one server (a transport :class:`Handler`)."""

    # ModelInfer's message is kept as bytes for the C path (Inference.model_infer_in_c), which takes
    # the native transport's plain requests; parsed only when it declines. (False: always parsed.)
    infer_in_c = True

    def __init__(self, server: CoreServer, options: GrpcOptions) -> None:
        self.server = server
        self.shm = regions_of(server)
        self.inference = Inference(server, self.shm, options)
        self.restrictions = options.restrictions or None  # None: every method is open
        self.repository = Repository(server)
        self.shared_memory = options.shared_memory
        infer_response_compression_level = options.infer_response_compression_level
        s = service_pb2
        self._unary: dict[str, tuple[Any, Callable[[Any, Any], Any]]] = {
            _KSERVE + "ServerLive": (s.ServerLiveRequest, self.server_live),
            _KSERVE + "ServerReady": (s.ServerReadyRequest, self.server_ready),
            _KSERVE + "ModelReady": (s.ModelReadyRequest, self.model_ready),
            _KSERVE + "ServerMetadata": (s.ServerMetadataRequest, self.server_metadata),
            _KSERVE + "ModelMetadata": (s.ModelMetadataRequest, self.model_metadata),
            _KSERVE + "ModelConfig": (s.ModelConfigRequest, self.model_config),
            _KSERVE + "ModelStatistics": (s.ModelStatisticsRequest, self.model_statistics),
            _KSERVE + "RepositoryIndex": (s.RepositoryIndexRequest, self.repository.index),
            _KSERVE + "RepositoryModelLoad": (s.RepositoryModelLoadRequest, self.repository.load),
            _KSERVE + "RepositoryModelUnload": (s.RepositoryModelUnloadRequest, self.repository.unload),
            _KSERVE + "SystemSharedMemoryStatus": (s.SystemSharedMemoryStatusRequest, self.shm_status),
            _KSERVE + "SystemSharedMemoryRegister": (s.SystemSharedMemoryRegisterRequest, self.shm_register),
            _KSERVE + "SystemSharedMemoryUnregister": (s.SystemSharedMemoryUnregisterRequest, self.shm_unregister),
            _KSERVE + "CudaSharedMemoryStatus": (s.CudaSharedMemoryStatusRequest, self.cuda_shm_status),
            _KSERVE + "CudaSharedMemoryRegister": (s.CudaSharedMemoryRegisterRequest, self.cuda_shm_register),
            _KSERVE + "CudaSharedMemoryUnregister": (s.CudaSharedMemoryUnregisterRequest, self.cuda_shm_unregister),
            _KSERVE + "TraceSetting": (s.TraceSettingRequest, self.trace_setting),
            _KSERVE + "LogSettings": (s.LogSettingsRequest, self.log_settings),
            _KSERVE + "ModelInfer": (s.ModelInferRequest, self.inference.model_infer),
            _HEALTH + "Check": (health_pb2.HealthCheckRequest, self.health_check),
            _HEALTH + "Watch": (health_pb2.HealthCheckRequest, self.health_watch),
        }
        self._stream_message = self.inference.stream_message
        self._choose_compression: Callable[[Call], None] | None = None
        if infer_response_compression_level != "none":
            self._compress_inference(infer_response_compression_level)
        self.draining = False  # stop() began: new requests are refused, those in flight finish
        self._watch_lock = threading.Lock()
        self._watchers: dict[Any, tuple[str, int]] = {}  # Watch calls -> (service, last status sent)
        self._watch_thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- transport interface ----------------------------------------------------

    def on_message(self, call: Call, data: bytes) -> None:
        """One request message of ``call``."""
        if call.user is None and self.restrictions is not None and self._restricted(call):
            return
        if call.method == _STREAM_INFER:
            if call.user is not _REFUSED:
                self._stream_message(call, data)
            return
        entry = self._unary_entry(call)
        if entry is None or call.user is _REFUSED:
            return
        if call.user is not None:
            call.finish(INVALID_ARGUMENT, f"{call.method} takes one request message")
            call.user = _REFUSED
            return
        if call.method == _MODEL_INFER and self.infer_in_c and type(call) is _h2_call():
            call.user = data  # parsed at the half-close, unless the C path takes it
            return
        self._parse(call, entry[0], data)

    @staticmethod
    def _parse(call: Call, cls: Any, data: bytes) -> Any:
        """A request message, or None when malformed (answered INVALID_ARGUMENT)."""
        try:
            call.user = cls.FromString(data)
        except DecodeError:
            call.finish(INVALID_ARGUMENT, f"malformed {cls.DESCRIPTOR.name} message")
            call.user = _REFUSED
            return None
        return call.user

    def on_half_close(self, call: Call) -> None:
        """The client sent its last message: run a unary call; end a drained stream."""
        if call.user is None and self.restrictions is not None and self._restricted(call):
            return  # no message came: refused all the same
        if call.user is _REFUSED:  # already answered with an error: never run it
            return
        if call.method == _STREAM_INFER:
            stream = call.user
            if stream is None:
                call.finish(OK)
            else:
                stream.close()
            return
        entry = self._unary_entry(call)
        if entry is None:
            return
        if self.draining and call.method in _REFUSED_WHILE_DRAINING:
            call.finish(UNAVAILABLE, SERVER_STOPPING)
            return
        request = call.user
        if type(request) is bytes:  # a ModelInfer (see on_message)
            if self._infer_in_c(call, request):
                return
            if (request := self._parse(call, entry[0], request)) is None:
                return
        if request is None:
            request = entry[0]()  # an empty message is valid protobuf
        try:
            response = entry[1](request, call)
        except TritonError as exc:
            call.finish(code_of(exc), str(exc))
            return
        except Exception as exc:  # a bug of ours: report it, keep serving
            log.exception("gRPC %s failed", call.method)
            call.finish(INTERNAL, f"{type(exc).__name__}: {exc}")
            return
        if response is not None:  # None: the call completes later (ModelInfer, Watch)
            call.send(response.SerializeToString())
            call.finish(OK)

    def _infer_in_c(self, call: Call, data: bytes) -> bool:
        """Whether the C path took a ModelInfer of the native transport (the response
        compression is chosen first, as for the Python path)."""
        if self.draining:
            return False
        if self._choose_compression is not None:
            self._choose_compression(call)
        try:
            return self.inference.model_infer_in_c(call, data)
        except Exception:  # a bug of ours: the Python path answers
            log.exception("gRPC ModelInfer in C failed")
            return False

    def _restricted(self, call: Call) -> bool:
        """Refuse a call to a restricted group whose metadata lacks the agreed header and value,
        as Triton does (UNAVAILABLE, naming the header), before its message is even decoded."""
        assert self.restrictions is not None
        restriction = self.restrictions.get(GRPC_GROUPS.get(call.method))
        if restriction is None:
            return False
        value = next((v for k, v in call.metadata if k == restriction.header), None)  # the first, as Triton
        if restriction.admits(value):
            return False
        call.finish(UNAVAILABLE, restriction.message)
        call.user = _REFUSED
        return True

    def _compress_inference(self, level: str) -> None:
        """As Triton's --grpc-infer-response-compression-level: ModelInfer and ModelStreamInfer (only)
        compress their responses with the algorithm grpc-core picks for ``level`` and the client."""

        def choose(call: Call) -> None:
            algorithm = response_compression(level, call.metadata)
            if algorithm != "identity":
                call.set_compression(algorithm)

        self._choose_compression = choose
        request, model_infer = self._unary[_KSERVE + "ModelInfer"]

        def infer(request: Any, call: Call) -> Any:
            choose(call)
            return model_infer(request, call)

        def stream_message(call: Call, data: bytes) -> None:
            if call.user is None:  # the stream's first request
                choose(call)
            self.inference.stream_message(call, data)

        self._unary[_KSERVE + "ModelInfer"] = (request, infer)
        self._stream_message = stream_message

    def _unary_entry(self, call: Call) -> tuple[Any, Callable[[Any, Any], Any]] | None:
        """(request class, handler) of a unary method; UNIMPLEMENTED for unknown ones."""
        entry = self._unary.get(call.method)
        if entry is None:
            call.finish(UNIMPLEMENTED, f"method {call.method} is not implemented by this server")
        return entry

    def on_cancel(self, call: Call) -> None:
        """The client went away (reset the call, closed the connection): stop its work."""
        user = call.user
        if type(user) is InFlight:  # a ModelInfer that Triton may not have run yet
            user.cancel()
            return
        with self._watch_lock:
            self._watchers.pop(call, None)
        if isinstance(user, Stream):
            user.cancel()

    def drain(self) -> None:
        """The server stops: refuse new requests (UNAVAILABLE; health says NOT_SERVING) while the
        requests in flight finish; streams end once theirs have answered."""
        self.draining = True
        self.inference.drain()

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
        self.shm.clear()
        release_answered()  # the calls answered in C since a request last took them

    # -- server and model information ---------------------------------------------

    def server_live(self, request: Any, call: Call) -> Any:
        return service_pb2.ServerLiveResponse(live=self.server.live)

    def server_ready(self, request: Any, call: Call) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.server.ready)

    def _model(self, name: str, version: str = "") -> Any:
        return kserve.model_of(self.server, name, version)  # Triton's wording for unknown names

    def _known(self, name: str) -> bool:
        try:
            self.server.model(name)
        except NotFoundError:
            return False
        return True

    def model_ready(self, request: Any, call: Call) -> Any:
        ready = self._known(request.name) and self._model(request.name, request.version).ready
        return service_pb2.ModelReadyResponse(ready=ready)

    def server_metadata(self, request: Any, call: Call) -> Any:
        """Triton's name and version; of its extensions, exactly those this endpoint implements."""
        meta = self.server.metadata()
        served = kserve.served_extensions(self.shared_memory, self.server.tracer is not None)
        extensions = [e for e in meta.get("extensions", []) if e in served]
        return service_pb2.ServerMetadataResponse(
            name=meta.get("name", ""), version=meta.get("version", ""), extensions=extensions
        )

    def model_metadata(self, request: Any, call: Call) -> Any:
        meta = self._model(request.name, request.version).metadata()
        return json_format.ParseDict(meta, service_pb2.ModelMetadataResponse(), ignore_unknown_fields=True)

    def model_config(self, request: Any, call: Call) -> Any:
        config = self._model(request.name, request.version).config()
        parsed = json_format.ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
        return service_pb2.ModelConfigResponse(config=parsed)

    def model_statistics(self, request: Any, call: Call) -> Any:
        names = [request.name] if request.name else [m.name for m in self.server.models()]
        stats = [self._model(n, request.version).statistics() for n in names]
        return json_format.ParseDict(
            {"model_stats": stats}, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True
        )

    # -- settings -----------------------------------------------------------------

    def log_settings(self, request: Any, call: Call) -> Any:
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

    def trace_setting(self, request: Any, call: Call) -> Any:
        settings = {key: list(value.value) for key, value in request.settings.items()}
        current = kserve_extensions.trace_settings(self.server, request.model_name, settings)
        response = service_pb2.TraceSettingResponse()
        for key, value in current.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    # -- shared memory --------------------------------------------------------------

    def shm_register(self, request: Any, call: Call) -> Any:
        if not self.shared_memory:
            raise UnsupportedError(
                "system shared memory is turned off on this endpoint (serve_grpc(shared_memory=False))"
            )
        self.shm.register(request.name, request.key, request.offset, request.byte_size)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    def shm_unregister(self, request: Any, call: Call) -> Any:
        self.shm.unregister(request.name, SYSTEM)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    def shm_status(self, request: Any, call: Call) -> Any:
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for r in self.shm.status(request.name, SYSTEM):
            response.regions[r.name].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
            )
        return response

    # CUDA shared memory: one region table with system shared memory (names are shared, as in
    # Triton). Without a GPU it answers as Triton built without GPU support: no region is ever
    # registered, so the status lists none and unregistering (clients' routine cleanup)
    # succeeds; only registering fails.

    def cuda_shm_status(self, request: Any, call: Call) -> Any:
        response = service_pb2.CudaSharedMemoryStatusResponse()
        for r in self.shm.status(request.name, CUDA):
            response.regions[r.name].CopyFrom(
                service_pb2.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, device_id=r.device_id, byte_size=r.byte_size
                )
            )
        return response

    def cuda_shm_register(self, request: Any, call: Call) -> Any:
        refuse_cuda_without_gpu(request.name)
        if self.draining:
            raise UnavailableError(SERVER_STOPPING)
        if not self.shared_memory:
            raise UnsupportedError(
                "CUDA shared memory is turned off on this endpoint (serve_grpc(shared_memory=False))"
            )
        self.shm.register_cuda(request.name, request.raw_handle, request.device_id, request.byte_size)
        return service_pb2.CudaSharedMemoryRegisterResponse()

    def cuda_shm_unregister(self, request: Any, call: Call) -> Any:
        self.shm.unregister(request.name, CUDA)
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    # -- health ---------------------------------------------------------------------

    def _health(self, service: str) -> int | None:
        H = health_pb2.HealthCheckResponse
        if self.draining:
            return H.NOT_SERVING if not service or self._known(service) else None
        if not service:
            return H.SERVING if self.server.ready else H.NOT_SERVING
        if not self._known(service):
            return None
        return H.SERVING if self.server.model(service).ready else H.NOT_SERVING

    def health_check(self, request: Any, call: Call) -> Any:
        status = self._health(request.service)
        if status is None:
            raise NotFoundError(f"unknown service '{request.service}': use '' for the server or a model name")
        return health_pb2.HealthCheckResponse(status=status)

    def health_watch(self, request: Any, call: Call) -> None:
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
