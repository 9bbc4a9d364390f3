"""The in-process Triton server: lifecycle, binding callables, model handles."""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from ctypes import byref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _capi
from .binding import Binding, InferFunc, Request, request_done
from .config import (
    WARMUP_FOLDER,
    GrpcLimits,
    ModelConfig,
    Tensor,
    model_config_json,
    name_tensors,
    warmup_file_bytes,
    warmup_file_name,
)
from .errors import (
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnsupportedError,
    error_for_code,
)
from .runtime import load_runtime
from .tensors import decode_bytes, encode_bytes, require_gpu
from .tracing import Tracer, Tracing

log = logging.getLogger("embedtriton")

BACKEND_NAME = "embedtriton"
_bindings: dict[str, Binding] = {}  # model directory -> binding, read by the native backend
_STREAM_ITEM, _STREAM_EMPTY, _STREAM_END = 0, 1, 2  # native.stream_next statuses
_native: Any = None


def _native_module() -> Any:
    """The native data path, wired to the process's Triton runtime (once)."""
    global _native
    if _native is None:
        from . import _native as native

        native.load(_capi.api().handle)
        native.set_hooks(_bindings, Request, error_for_code, decode_bytes, encode_bytes, request_done)
        _native = native
    return _native


@dataclass
class ServerConfig:
    """Settings of the embedded Triton server.

    ``cache_config`` takes Triton's ``--cache-config`` strings, e.g. ``["local,size=1048576"]``.
    """

    id: str = "embedtriton"
    cache_config: list[str] = field(default_factory=list)
    cache_directory: str | None = None
    exit_timeout_secs: int = 30
    strict_readiness: bool = True
    metrics: bool = True
    cpu_metrics: bool = True
    # How often Triton samples CPU/memory metrics. Its thread sleeps half of this and the
    # process waits for it at exit: Triton's 2000 ms default adds ~1 s to every exit.
    metrics_interval_ms: int = 200
    log_verbose: int = 0
    log_info: bool = False
    log_warning: bool = False
    log_error: bool = True
    log_file: str | None = None  # Triton's log; a file in the server's temporary folder by default
    pinned_memory_pool_byte_size: int = 0
    cuda_memory_pool_byte_size: dict[int, int] = field(default_factory=dict)
    min_supported_compute_capability: float = 6.0
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    model_repository: str | None = None  # a folder we may write to; a temporary one by default
    tracing: Tracing | None = None  # OpenTelemetry spans from Triton's trace timestamps; off by default
    grpc_address: str | None = None  # serve gRPC from start() on, e.g. "127.0.0.1:8001"
    grpc_max_message_bytes: int = 64 * 1024 * 1024
    grpc_tls_cert: str | None = None  # PEM files; see Server.serve_grpc
    grpc_tls_key: str | None = None
    grpc_tls_client_ca: str | None = None

    def cache_settings(self) -> list[tuple[str, str]]:
        """``[(cache name, config JSON)]`` from ``cache_config``."""
        grouped: dict[str, dict[str, str]] = {}
        for entry in self.cache_config:
            name, _, rest = entry.partition(",")
            if not name or (rest and "=" not in rest):
                raise InvalidArgumentError(
                    f"cache_config entry {entry!r}: expected 'NAME,KEY=VALUE[,KEY=VALUE]', e.g. 'local,size=1048576'"
                )
            settings = grouped.setdefault(name.strip(), {})
            for pair in filter(None, rest.split(",")):
                key, _, value = pair.partition("=")
                settings[key.strip()] = value.strip()
        return [(name, json.dumps(settings)) for name, settings in grouped.items()]


def _sequence(correlation_id: int | str | None, start: bool, end: bool) -> tuple[int | str, int] | None:
    """(correlation id, Triton's request flags) for a request of a sequence, or None."""
    if correlation_id is None:
        if start or end:
            raise InvalidArgumentError("sequence_start/sequence_end need a correlation_id")
        return None
    return correlation_id, (1 if start else 0) | (2 if end else 0)


def _output_device(device: str) -> None:
    """Outputs come back as host numpy arrays ("cpu"); "gpu" needs a CUDA GPU."""
    if device == "cpu":
        return
    if device != "gpu":
        raise InvalidArgumentError(f"output_device must be 'cpu' or 'gpu', not {device!r}")
    require_gpu("output_device='gpu'")
    raise UnsupportedError(
        "output_device='gpu' (outputs allocated in GPU memory) is not in this build yet: it still "
        "needs its run on a GPU machine; use output_device='cpu'"
    )


class Model:
    """A handle on one model of a :class:`Server`.

    Every call takes, for stateful models, ``correlation_id`` (a positive int or a str)
    with ``sequence_start`` / ``sequence_end`` marking the first and last request.
    """

    def __init__(self, server: Server, name: str, version: int = -1) -> None:
        self._server = server
        self.name = name
        self.version = version

    def __repr__(self) -> str:
        return f"Model({self.name!r})"

    def infer(
        self,
        inputs: Mapping[str, Any],
        *,
        parameters: Mapping[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        timeout_us: int | None = None,
        request_id: str | None = None,
        outputs: Sequence[str] | None = None,
        correlation_id: int | str | None = None,
        sequence_start: bool = False,
        sequence_end: bool = False,
        output_device: str = "cpu",
    ) -> dict[str, Any]:
        """Run one request and return its outputs (name -> numpy array).

        ``inputs`` maps input names to arrays (with the batch axis when the model batches).
        ``outputs`` limits which outputs come back (all by default).
        """
        _output_device(output_device)
        sequence = _sequence(correlation_id, sequence_start, sequence_end)
        return self._submit(inputs, outputs, request_id, priority, timeout_us, parameters, sequence=sequence)

    def _submit(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None,
        request_id: str | None,
        priority: int | None,
        timeout_us: int | None,
        parameters: Mapping[str, Any] | None,
        loop: asyncio.AbstractEventLoop | None = None,
        target: Any = None,
        stream: bool = False,
        sequence: tuple[int | str, int] | None = None,
        trace_parent: Any = None,
        cancellable: bool = False,
    ) -> Any:
        """Hand one request to the native data path (it validates the arguments).

        Without a loop: waits and returns the outputs. With a loop: resolves ``target`` (a
        future) there. ``stream``: returns a stream handle; ``target`` wakes an asyncio consumer.
        ``trace_parent``: the OpenTelemetry context of a remote caller (gRPC), when tracing.
        ``cancellable`` (with a loop): returns a handle for ``_native.cancel``.
        """
        server = self._server
        if server._stopping:
            raise UnavailableError("the server is stopping: it takes no new requests")
        binding = server._bound.get(self.name)
        if not stream and binding is not None and binding.decoupled:
            raise InvalidArgumentError(f"model '{self.name}' is decoupled: call stream() or stream_async()")
        # With a batch rule, Triton's batcher calls Python: hand requests over without the GIL.
        release_gil = binding is not None and binding.batch_rule is not None
        native = _native or _native_module()
        tracer = self._server._tracer
        if tracer is not None:
            span, sink, traced = tracer.begin(
                self.name, self.version, inputs, request_id, parameters, trace_parent, trace_parent is not None
            )
            if span is not None:
                try:
                    return native.submit(
                        server._handle, self.name, self.version, inputs, outputs, request_id, priority,
                        timeout_us, traced, loop, target, stream, sequence, release_gil, sink, cancellable,
                    )  # fmt: skip
                except Exception as exc:
                    tracer.abandon(span, traced, exc)
                    raise
        return native.submit(
            server._handle, self.name, self.version, inputs, outputs, request_id,
            priority, timeout_us, parameters, loop, target, stream, sequence, release_gil, None, cancellable,
        )  # fmt: skip

    def infer_async(
        self,
        inputs: Mapping[str, Any],
        *,
        parameters: Mapping[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        timeout_us: int | None = None,
        request_id: str | None = None,
        outputs: Sequence[str] | None = None,
        correlation_id: int | str | None = None,
        sequence_start: bool = False,
        sequence_end: bool = False,
        output_device: str = "cpu",
    ) -> asyncio.Future[dict[str, Any]]:
        """:meth:`infer` for asyncio: ``await model.infer_async(...)``; many may be in flight.

        Must be called from a running event loop. Returns an asyncio future (no coroutine
        per request); errors, including bad inputs, are raised where it is awaited.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        try:
            _output_device(output_device)
            sequence = _sequence(correlation_id, sequence_start, sequence_end)
            self._submit(inputs, outputs, request_id, priority, timeout_us, parameters, loop, future, sequence=sequence)
        except Exception as exc:
            future.set_exception(exc)
        return future

    def stream(
        self,
        inputs: Mapping[str, Any],
        *,
        parameters: Mapping[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        timeout_us: int | None = None,
        request_id: str | None = None,
        outputs: Sequence[str] | None = None,
        correlation_id: int | str | None = None,
        sequence_start: bool = False,
        sequence_end: bool = False,
        output_device: str = "cpu",
    ) -> Iterator[dict[str, Any]]:
        """Run one request on a decoupled model and iterate over its responses as they come.

        An error (the model raised mid-stream) is raised after the responses sent before
        it. Leaving the loop early (``break``, an exception, closing the iterator) cancels
        the request and closes the model's generator.
        """
        _output_device(output_device)
        sequence = _sequence(correlation_id, sequence_start, sequence_end)
        handle = self._submit(
            inputs, outputs, request_id, priority, timeout_us, parameters, stream=True, sequence=sequence
        )
        return self._iterate(handle)

    @staticmethod
    def _iterate(handle: Any) -> Iterator[dict[str, Any]]:
        native = _native
        try:
            while True:
                status, outputs = native.stream_next(handle, True)
                if status == _STREAM_END:
                    return
                yield outputs
        finally:
            native.stream_close(handle)

    async def stream_async(
        self,
        inputs: Mapping[str, Any],
        *,
        parameters: Mapping[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        timeout_us: int | None = None,
        request_id: str | None = None,
        outputs: Sequence[str] | None = None,
        correlation_id: int | str | None = None,
        sequence_start: bool = False,
        sequence_end: bool = False,
        output_device: str = "cpu",
    ) -> AsyncIterator[dict[str, Any]]:
        """:meth:`stream` for asyncio: ``async for part in model.stream_async(...)``."""
        _output_device(output_device)
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()
        sequence = _sequence(correlation_id, sequence_start, sequence_end)
        handle = self._submit(
            inputs, outputs, request_id, priority, timeout_us, parameters, loop, arrived.set, True, sequence
        )
        native = _native
        try:
            while True:
                status, outputs = native.stream_next(handle, False)
                if status == _STREAM_END:
                    return
                if status == _STREAM_ITEM:
                    yield outputs
                    continue
                arrived.clear()
                status, outputs = native.stream_next(handle, False)  # arrived before clear()?
                if status == _STREAM_EMPTY:
                    await arrived.wait()
                elif status == _STREAM_END:
                    return
                else:
                    yield outputs
        finally:
            native.stream_close(handle)

    @property
    def ready(self) -> bool:
        """Whether Triton reports the model READY."""
        server = self._server._handle
        if server is None:
            return False
        ready = _capi.flag()
        try:
            _capi.api().ServerModelIsReady(server, self.name.encode(), self.version, byref(ready))
        except TritonError:
            return False
        return ready.value

    def metadata(self) -> dict[str, Any]:
        """Triton's model metadata (inputs, outputs, versions, platform)."""
        return self._server._message("ServerModelMetadata", self.name.encode(), self.version)

    def config(self) -> dict[str, Any]:
        """The model configuration that Triton applied."""
        return self._server._message("ServerModelConfig", self.name.encode(), self.version, 1)

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics for this model (inference/execution counts, timings, batch stats)."""
        stats = self._server._message("ServerModelStatistics", self.name.encode(), self.version)
        entries = stats.get("model_stats", [])
        if not entries:
            raise NotFoundError(f"no statistics for model '{self.name}'")
        return entries[0]


_live_servers: weakref.WeakSet[Server] = weakref.WeakSet()

# Deleting a Triton server resets process-wide memory managers (the pinned-memory
# manager above all), under any other server still running in the process. So a
# stopped server is only deleted once no other one runs: until then it waits here
# ("retired"), stopped, its models unloaded. A server whose callable was still running
# at stop()'s deadline also waits until Triton has let go of its last request.
_lifecycle = threading.Lock()  # ServerNew, ServerDelete and these two collections
_running: set[int] = set()  # handles of started, not yet stopped servers
_retired: list[int] = []  # handles of stopped servers not deleted yet
_reaper: threading.Thread | None = None


def _reap() -> bool:
    """Delete the retired servers when that is safe (call with ``_lifecycle`` held).
    Returns whether some are left."""
    if not _retired or _running:
        return bool(_retired)
    if any(_native.pending(handle)[1] for handle in _retired):
        return True  # a callable still runs: Triton holds its requests
    deadline = time.monotonic() + 0.1  # released requests go 20-40 ms late (see bury())
    while _native.drain() and time.monotonic() < deadline:
        time.sleep(0.005)
    api = _capi.api()
    for handle in _retired:
        try:
            api.ServerDelete(handle)
        except TritonError as exc:
            log.warning("deleting Triton: %s", exc)
        aborted = _native.abort_pending(handle)
        if aborted:
            log.warning("%d request(s) were still in flight when the server was deleted", aborted)
    _retired.clear()
    return False


def _retire(handle: int) -> None:
    """A stopped server: delete it now or, when unsafe, later (see ``_reap``)."""
    global _reaper
    with _lifecycle:
        _running.discard(handle)
        _retired.append(handle)
        if not _reap() or _running or (_reaper is not None and _reaper.is_alive()):
            return
        _reaper = threading.Thread(target=_reap_later, name="embedtriton-reaper", daemon=True)
        _reaper.start()


def _reap_later() -> None:
    """Wait for the callables of retired servers to return, then delete the servers."""
    while True:
        time.sleep(0.05)
        with _lifecycle:
            if _running or not _reap():
                return


@atexit.register
def _stop_all() -> None:
    for server in list(_live_servers):
        server.stop()
    with _lifecycle:
        if _reap():
            log.warning("a model's callable was still running at exit; its server was not deleted")


class Server:
    """NVIDIA Triton Inference Server running inside this process.

    ``bind()`` Python callables as models, ``start()`` (or use ``with server:``), then call
    them through ``server.model(name).infer(...)``.
    """

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.config.cache_settings()  # validate early
        for name, least in (("exit_timeout_secs", 0), ("metrics_interval_ms", 1)):
            value = getattr(self.config, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InvalidArgumentError(f"ServerConfig.{name} must be an integer >= {least}, not {value!r}")
        self._lock = threading.RLock()
        self._handle: int | None = None
        self._repository: Path | None = None
        self._own_repository = False
        self._backends: Path | None = None
        self._bound: dict[str, Binding] = {}
        self._log: Path | None = None
        self._grpc: Any = None  # GrpcEndpoint while serving gRPC
        self._tracer: Tracer | None = Tracer(self.config.tracing) if self.config.tracing else None
        cfg = self.config
        self._log_state: dict[str, Any] = {
            "log_info": cfg.log_info, "log_warning": cfg.log_warning, "log_error": cfg.log_error,
            "log_verbose_level": cfg.log_verbose, "log_format": "default",
        }  # fmt: skip
        self._metrics_http: Any = None  # ThreadingHTTPServer while serving /metrics
        self._stopping = False  # stop() is draining

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Server:
        """Start Triton and load every model bound so far."""
        with self._lock:
            if self._handle is not None:
                return self
            runtime, _library = load_runtime()
            native = _native_module()
            api = _capi.api()
            cfg = self.config
            if cfg.model_repository:
                self._repository = Path(cfg.model_repository)
                self._repository.mkdir(parents=True, exist_ok=True)
            else:
                self._repository = Path(tempfile.mkdtemp(prefix="embedtriton-models-"))
                self._own_repository = True
            self._backends = Path(tempfile.mkdtemp(prefix="embedtriton-backends-"))
            backend_dir = self._backends / BACKEND_NAME
            backend_dir.mkdir()
            (backend_dir / f"libtriton_{BACKEND_NAME}.so").symlink_to(native.__file__)

            options = _capi.out_handle()
            api.ServerOptionsNew(byref(options))
            try:
                api.ServerOptionsSetServerId(options, cfg.id.encode())
                api.ServerOptionsSetModelRepositoryPath(options, str(self._repository).encode())
                api.ServerOptionsSetModelControlMode(options, _capi.MODEL_CONTROL_EXPLICIT)
                api.ServerOptionsSetStrictModelConfig(options, True)
                api.ServerOptionsSetStrictReadiness(options, cfg.strict_readiness)
                api.ServerOptionsSetExitTimeout(options, cfg.exit_timeout_secs)
                api.ServerOptionsSetBackendDirectory(options, str(self._backends).encode())
                api.ServerOptionsSetRepoAgentDirectory(options, str(self._backends).encode())
                api.ServerOptionsSetLogVerbose(options, cfg.log_verbose)
                api.ServerOptionsSetLogInfo(options, cfg.log_info)
                api.ServerOptionsSetLogWarn(options, cfg.log_warning)
                api.ServerOptionsSetLogError(options, cfg.log_error)
                self._log = Path(cfg.log_file) if cfg.log_file else self._backends / "triton.log"
                api.ServerOptionsSetLogFile(options, str(self._log).encode())
                api.ServerOptionsSetMetrics(options, cfg.metrics)
                api.ServerOptionsSetGpuMetrics(options, False)
                api.ServerOptionsSetCpuMetrics(options, cfg.metrics and cfg.cpu_metrics)
                api.ServerOptionsSetMetricsInterval(options, cfg.metrics_interval_ms)
                api.ServerOptionsSetPinnedMemoryPoolByteSize(options, cfg.pinned_memory_pool_byte_size)
                for device, size in cfg.cuda_memory_pool_byte_size.items():
                    require_gpu("ServerConfig.cuda_memory_pool_byte_size", int(device))
                    api.ServerOptionsSetCudaMemoryPoolByteSize(options, device, size)
                api.ServerOptionsSetMinSupportedComputeCapability(options, cfg.min_supported_compute_capability)
                for backend, settings in cfg.backend_config.items():
                    for key, value in settings.items():
                        api.ServerOptionsSetBackendConfig(options, backend.encode(), key.encode(), str(value).encode())
                caches = cfg.cache_settings()
                # Always set: Triton keeps the cache folder of the first server in the process.
                directory = cfg.cache_directory or (str(runtime.caches) if runtime.caches else None)
                if directory is not None:
                    api.ServerOptionsSetCacheDirectory(options, directory.encode())
                if caches:
                    if directory is None:
                        raise NotFoundError(
                            f"cache_config is set but the Triton runtime ({runtime.origin}) has no caches/ "
                            "folder; set ServerConfig.cache_directory"
                        )
                    for name, settings in caches:
                        api.ServerOptionsSetCacheConfig(options, name.encode(), settings.encode())
                server = _capi.out_handle()
                with _lifecycle:
                    _reap()  # servers stopped earlier go before this one starts
                    api.ServerNew(byref(server), options)
                    _running.add(server.value)
            except BaseException:
                self._cleanup_folders()
                raise
            finally:
                api.ServerOptionsDelete(options)
            self._handle = server.value
            self._stopping = False
            native.open_server(self._handle)
            _live_servers.add(self)
            try:
                for binding in list(self._bound.values()):
                    self._load(binding)
                if cfg.grpc_address:
                    self.serve_grpc(cfg.grpc_address)
            except BaseException:
                self.stop()
                raise
            return self

    def stop(self) -> None:
        """Stop Triton, draining first: new requests are refused at once (in process and over
        gRPC, where health checks say NOT_SERVING), requests in flight finish and their replies
        are delivered. Only what still runs after ``exit_timeout_secs`` (in total) fails, with
        an :class:`UnavailableError`; nobody is left waiting. A callable still running then
        finishes on its own thread and its result is dropped."""
        with self._lock:
            handle = self._handle
            if handle is None:
                self._stop_endpoints(0.0)
                return
            self._stopping = True
            timeout = float(self.config.exit_timeout_secs)
            deadline = time.monotonic() + timeout
            _native.close_server(handle)  # in-process submits are refused from here on
            if self._grpc is not None:
                self._grpc.service.drain()
            # 1. What is in flight finishes (a little is kept to deliver the last replies).
            waited = self._wait_in_flight(handle, deadline - min(0.2, 0.1 * timeout))
            # 2. What is left fails now; Triton drops what it has not started.
            failed = _native.fail_pending(handle)
            _native.cancel_all(handle)
            if failed:
                log.warning(
                    "%d request(s) still running after exit_timeout_secs=%s failed with UnavailableError",
                    failed, self.config.exit_timeout_secs,
                )  # fmt: skip
            # 3. gRPC replies go out; the endpoints close.
            self._stop_endpoints(max(deadline - time.monotonic(), 0.05))
            # 4. Models unload, Triton stops, within what is left.
            self._handle = None
            _live_servers.discard(self)
            for name in list(self._bound):
                self._unload(handle, name, deadline)
            for binding in self._bound.values():
                left = max(deadline - time.monotonic(), 0.0)
                if not binding.wait_finalized(left, _native.drain) and waited:
                    log.warning("model '%s' was not finalized within exit_timeout_secs", binding.name)
            api = _capi.api()
            try:
                api.ServerSetExitTimeout(handle, max(0, int(deadline - time.monotonic())))
                api.ServerStop(handle)
            except TritonError as exc:
                log.warning("stopping Triton: %s", exc)
            _retire(handle)
            for binding in self._bound.values():
                _bindings.pop(str(self._model_dir(binding.name)), None)
            self._cleanup_folders()
            self._stopping = False

    def _wait_in_flight(self, handle: int, until: float) -> bool:
        """Wait until every call of this server completed (or ``until``); whether they did."""
        while True:
            waiting, _holding = _native.pending(handle)
            if not waiting:
                return True
            if time.monotonic() >= until:
                return False
            _native.drain()
            time.sleep(0.002)

    def _stop_endpoints(self, grace: float) -> None:
        endpoint, self._grpc = self._grpc, None
        if endpoint is not None:
            endpoint.stop(grace)
        httpd, self._metrics_http = self._metrics_http, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def _cleanup_folders(self) -> None:
        if self._backends is not None:
            shutil.rmtree(self._backends, ignore_errors=True)
            self._backends = None
        if self._repository is not None:
            if self._own_repository:
                shutil.rmtree(self._repository, ignore_errors=True)
            else:
                for name in self._bound:
                    shutil.rmtree(self._repository / name, ignore_errors=True)
            self._repository = None

    @property
    def live(self) -> bool:
        """Whether Triton is running."""
        return self._flag("ServerIsLive")

    @property
    def ready(self) -> bool:
        """Whether Triton is running and every loaded model is ready (False while stopping)."""
        return not self._stopping and self._flag("ServerIsReady")

    def _flag(self, function: str) -> bool:
        handle = self._handle
        if handle is None:
            return False
        value = _capi.flag()
        getattr(_capi.api(), function)(handle, byref(value))
        return value.value

    # -- models --------------------------------------------------------------

    def bind(
        self,
        model_name: str,
        infer_func: InferFunc,
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig | None = None,
        strict: bool = False,
    ) -> Model:
        """Serve ``infer_func`` as model ``model_name``.

        ``infer_func(requests)`` gets a list of requests (each a mapping input name ->
        array, with ``.parameters``) and returns one dict of outputs per request; decorate a
        function of batched arrays with :func:`embedtriton.batch`. Works before and after
        :meth:`start`; after start the model is loaded (and warmed up) before ``bind``
        returns. Outputs are always checked against ``outputs``; ``strict`` is accepted for
        PyTriton compatibility.
        """
        if not isinstance(model_name, str) or not model_name or "/" in model_name or model_name.startswith("."):
            raise InvalidArgumentError(f"model_name must be a plain non-empty name, not {model_name!r}")
        if not callable(infer_func):
            raise InvalidArgumentError(f"infer_func of model '{model_name}' must be callable")
        config = config if config is not None else ModelConfig()
        if not isinstance(config, ModelConfig):
            raise InvalidArgumentError(f"config must be a ModelConfig, not {type(config).__name__}")
        for what, tensors in (("inputs", inputs), ("outputs", outputs)):
            if not all(isinstance(t, Tensor) for t in tensors):
                raise InvalidArgumentError(f"{what} of model '{model_name}' must be a list of Tensor")
        if not outputs:
            raise InvalidArgumentError(f"model '{model_name}' needs at least one output")
        if config.response_cache and not self.config.cache_config:
            raise InvalidArgumentError(
                f"model '{model_name}' has response_cache=True but the server has no cache; "
                "configure one, e.g. Server(ServerConfig(cache_config=['local,size=1048576']))"
            )
        for group in config.instance_group or []:
            if group.kind == "GPU":
                for gpu in group.gpus or [0]:
                    require_gpu(f"model '{model_name}': InstanceGroup(kind='GPU')", gpu)
        for tensor in [*inputs, *outputs]:
            if tensor.device == "gpu":
                require_gpu(f"model '{model_name}': Tensor {tensor.name or '(unnamed)'} with device='gpu'")
        binding = Binding(
            model_name, infer_func, name_tensors(inputs, "INPUT"), name_tensors(outputs, "OUTPUT"), config
        )
        model_config_json(model_name, binding.inputs, binding.outputs, config, BACKEND_NAME)  # validates
        with self._lock:
            if model_name in self._bound:
                raise InvalidArgumentError(f"model '{model_name}' is already bound; unbind() it first")
            self._bound[model_name] = binding
            if self._handle is not None:
                try:
                    self._load(binding)
                except BaseException:
                    del self._bound[model_name]
                    raise
        return Model(self, model_name)

    def unbind(self, model_name: str) -> None:
        """Unload a bound model and forget it (waits until Triton has let go of it)."""
        with self._lock:
            if model_name not in self._bound:
                raise NotFoundError(f"no model '{model_name}' is bound (bound: {sorted(self._bound)})")
            binding = self._bound[model_name]
            if self._handle is not None:
                self._unload(self._handle, model_name)
            del self._bound[model_name]
            if self._handle is not None:
                binding.wait_finalized(self.config.exit_timeout_secs, _native.drain)
            if self._repository is not None:
                _bindings.pop(str(self._model_dir(binding.name)), None)
                shutil.rmtree(self._model_dir(binding.name), ignore_errors=True)

    def unload(self, model_name: str) -> None:
        """Unload a bound model but keep it bound (its requests fail until :meth:`load`)."""
        with self._lock:
            binding = self._running_binding(model_name)
            self._unload(self._handle, model_name)
            binding.wait_finalized(self.config.exit_timeout_secs, _native.drain)

    def load(self, model_name: str) -> None:
        """Load a bound model again (after :meth:`unload`); loading a loaded model reloads it."""
        with self._lock:
            self._load(self._running_binding(model_name))

    def _running_binding(self, model_name: str) -> Binding:
        binding = self._bound.get(model_name)
        if binding is None:
            raise NotFoundError(f"no model '{model_name}' is bound (bound: {sorted(self._bound)})")
        if self._handle is None:
            raise UnavailableError("the server is not running")
        return binding

    def log_settings(self, **changes: Any) -> dict[str, Any]:
        """Triton's log settings, after applying ``changes`` (``log_info``, ``log_warning``,
        ``log_error``: bool; ``log_verbose_level``: int; ``log_format``: "default" or
        "ISO8601"). Triton's logger is process-wide: this affects every server."""
        known = {"log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
        unknown = set(changes) - known
        if unknown:
            raise InvalidArgumentError(
                f"unknown log setting(s) {sorted(unknown)}; known: {sorted(known)} "
                "(log_file is fixed: the server reads its own log to report load errors)"
            )
        current = self._log_state
        fmt = changes.get("log_format", current["log_format"])
        if fmt not in ("default", "ISO8601"):
            raise InvalidArgumentError(f"log_format must be 'default' or 'ISO8601', not {fmt!r}")
        verbose = changes.get("log_verbose_level", current["log_verbose_level"])
        if not isinstance(verbose, int) or isinstance(verbose, bool) or verbose < 0:
            raise InvalidArgumentError(f"log_verbose_level must be an integer >= 0, not {verbose!r}")
        for flag in ("log_info", "log_warning", "log_error"):
            if not isinstance(changes.get(flag, False), bool):
                raise InvalidArgumentError(f"{flag} must be a bool, not {changes[flag]!r}")
        api = _capi.api()
        options = _capi.out_handle()
        api.ServerOptionsNew(byref(options))
        try:  # Triton applies these setters to its global logger at once
            new = {**current, **changes}
            api.ServerOptionsSetLogInfo(options, new["log_info"])
            api.ServerOptionsSetLogWarn(options, new["log_warning"])
            api.ServerOptionsSetLogError(options, new["log_error"])
            api.ServerOptionsSetLogVerbose(options, new["log_verbose_level"])
            api.ServerOptionsSetLogFormat(options, 1 if new["log_format"] == "ISO8601" else 0)
        finally:
            api.ServerOptionsDelete(options)
        self._log_state = new
        return {**new, "log_file": str(self._log or self.config.log_file or "")}

    def model(self, name: str) -> Model:
        """A handle on model ``name``."""
        if name not in self._bound:
            raise NotFoundError(f"no model '{name}' (bound: {sorted(self._bound)})")
        return Model(self, name)

    def models(self) -> list[Model]:
        """Handles on every bound model."""
        return [Model(self, name) for name in self._bound]

    def serve_grpc(
        self,
        address: str = "127.0.0.1:8001",
        *,
        max_message_bytes: int | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
        transport: str = "native",
        limits: GrpcLimits | None = None,
        shared_memory: bool = True,
    ) -> int:
        """Serve the models on a KServe-v2 gRPC endpoint (``inference.GRPCInferenceService``
        plus ``grpc.health.v1.Health``) that stock Triton clients use; stopped by :meth:`stop`.

        Binds 127.0.0.1 unless told otherwise; ``"host:0"`` picks a free port. Returns the
        port. ``max_message_bytes`` caps request and response messages (64 MiB by default);
        ``tls_cert``/``tls_key`` (PEM files) turn on TLS, and ``tls_client_ca`` also requires
        clients to present a certificate signed by that CA. Defaults come from
        :class:`ServerConfig`'s ``grpc_*`` fields. ``transport``: ``"native"`` (embedtriton's
        HTTP/2 server on libnghttp2, the fast one) or ``"grpcio"`` (grpcio's asyncio server).
        ``limits``: what one client may cost (:class:`GrpcLimits`: connections, idle and
        handshake timeouts, header bytes, buffered replies; native transport).
        ``shared_memory=False`` refuses SystemSharedMemoryRegister: shared memory is for
        same-host clients trusted with the server's ``/dev/shm`` objects.
        Needs ``pip install "embedtriton[grpc]"``.
        """
        from .grpc import GrpcEndpoint

        cfg = self.config
        max_message_bytes = max_message_bytes or cfg.grpc_max_message_bytes
        tls_cert, tls_key = tls_cert or cfg.grpc_tls_cert, tls_key or cfg.grpc_tls_key
        tls_client_ca = tls_client_ca or cfg.grpc_tls_client_ca
        if bool(tls_cert) != bool(tls_key):
            raise InvalidArgumentError("TLS needs both tls_cert and tls_key (PEM files)")
        if tls_client_ca and not tls_cert:
            raise InvalidArgumentError("tls_client_ca (client-certificate verification) needs tls_cert and tls_key")
        if max_message_bytes <= 0:
            raise InvalidArgumentError(f"max_message_bytes must be > 0, not {max_message_bytes}")
        tls = (tls_cert, tls_key, tls_client_ca) if tls_cert and tls_key else None
        if limits is not None and not isinstance(limits, GrpcLimits):
            raise InvalidArgumentError(f"limits must be a GrpcLimits, not {type(limits).__name__}")
        with self._lock:
            if self._grpc is not None:
                raise InvalidArgumentError(f"already serving gRPC on {self._grpc.address}")
            self._grpc = GrpcEndpoint(
                self, address, max_message_bytes, tls, transport, limits or GrpcLimits(), shared_memory
            )
            log.info("serving gRPC on %s (port %d)", address, self._grpc.port)
            return self._grpc.port

    def serve_metrics(self, address: str = "127.0.0.1:8002") -> int:
        """Serve Triton's Prometheus metrics over HTTP at ``http://ADDRESS/metrics``; stopped by
        :meth:`stop`. ``"host:0"`` picks a free port. Returns the port."""
        import http.server

        host, _, port = address.rpartition(":")
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                try:
                    body = server.metrics().encode()
                except TritonError as exc:
                    self.send_error(503, str(exc))
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        with self._lock:
            if self._metrics_http is not None:
                raise InvalidArgumentError("already serving metrics")
            try:
                httpd = http.server.ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
            except (OSError, ValueError) as exc:
                raise UnavailableError(f"cannot serve metrics on {address}: {exc}") from None
            threading.Thread(target=httpd.serve_forever, name="embedtriton-metrics", daemon=True).start()
            self._metrics_http = httpd
            return httpd.server_address[1]

    def metadata(self) -> dict[str, Any]:
        """Triton's server metadata (name, version, extensions)."""
        return self._message("ServerMetadata")

    def metrics(self) -> str:
        """Triton's metrics in Prometheus text format."""
        api = _capi.api()
        metrics = _capi.out_handle()
        api.ServerMetrics(self._require_handle(), byref(metrics))
        try:
            from ctypes import c_char_p, c_size_t, string_at

            base, size = c_char_p(), c_size_t()
            api.MetricsFormatted(metrics, _capi.METRIC_PROMETHEUS, byref(base), byref(size))
            return string_at(base, size.value).decode()
        finally:
            api.MetricsDelete(metrics)

    # -- internals -----------------------------------------------------------

    def _model_dir(self, name: str) -> Path:
        assert self._repository is not None
        return self._repository / name

    def _load(self, binding: Binding) -> None:
        directory = self._model_dir(binding.name)
        (directory / "1").mkdir(parents=True, exist_ok=True)
        config = model_config_json(
            binding.name, binding.inputs, binding.outputs, binding.config, BACKEND_NAME, _native.__file__
        )
        for stage in binding.config.model_warmup or []:  # file-based warm-up data goes beside the model
            for input_name, spec in stage.inputs.items():
                if spec.input_data_file is not None:
                    folder = directory / WARMUP_FOLDER
                    folder.mkdir(exist_ok=True)
                    (folder / warmup_file_name(stage, input_name)).write_bytes(warmup_file_bytes(spec))
        _bindings[str(directory)] = binding
        started = time.perf_counter()
        log_offset = self._log_size()
        try:
            _capi.load_model_with_config(self._require_handle(), binding.name, json.dumps(config))
        except TritonError as exc:
            _bindings.pop(str(directory), None)
            details = self._logged_errors(log_offset)
            if details:
                raise type(exc)(f"{exc}: {details}") from None
            raise
        binding.loaded_at = time.monotonic()
        log.info("model '%s' ready in %.3f s", binding.name, time.perf_counter() - started)

    def _log_size(self) -> int:
        try:
            return self._log.stat().st_size if self._log else 0
        except OSError:
            return 0

    def _logged_errors(self, offset: int) -> str:
        """The error lines Triton logged since ``offset`` (its load errors say more than its return codes)."""
        try:
            with open(self._log, "rb") as f:  # type: ignore[arg-type]
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""
        found = []
        for line in text.splitlines():
            if line.startswith("E") and "CudaDriverHelper" not in line and "modification time" not in line:
                message = line.split("] ", 1)[-1].strip().strip('"')
                found.append(message)
        return "; ".join(found)

    def _unload(self, handle: int, name: str, deadline: float | None = None) -> None:
        api = _capi.api()
        # Triton 2.51 crashes when a model is deleted while its instance thread is still
        # finishing its last task (here: the load); give that thread a moment.
        binding = self._bound.get(name)
        settle = 0.02 - (time.monotonic() - binding.loaded_at) if binding and binding.loaded_at else 0
        if settle > 0:
            time.sleep(settle)
        try:
            api.ServerUnloadModel(handle, name.encode())
        except TritonError as exc:
            log.warning("unloading model '%s': %s", name, exc)
            return
        # Unload returns before it is done; Triton's stop() waits in 1 s steps for models
        # still unloading, so wait here until this one is fully gone (or the deadline).
        # Released requests hold the model until they are deleted: drain them meanwhile.
        if deadline is None:
            deadline = time.monotonic() + self.config.exit_timeout_secs
        while time.monotonic() < deadline:
            _native.drain()
            message = _capi.out_handle()
            try:
                api.ServerModelIndex(handle, 0, byref(message))
                index = api.message_json(message)
            except TritonError:
                break
            if all(
                entry.get("state") not in ("READY", "LOADING", "UNLOADING") for entry in index if entry["name"] == name
            ):
                break
            time.sleep(0.0005)

    def _require_handle(self) -> int:
        handle = self._handle
        if handle is None:
            raise UnavailableError("the server is not running; call start() or use 'with server:'")
        return handle

    def _message(self, function: str, *args: Any) -> Any:
        api = _capi.api()
        message = _capi.out_handle()
        getattr(api, function)(self._require_handle(), *args, byref(message))
        return api.message_json(message)
