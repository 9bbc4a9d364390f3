"""The in-process Triton server: lifecycle (binding and loading models is
:mod:`.model_table`'s part of it), and the endpoints (frontends) attached to it, which it
drains and stops with itself."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from ..backend import library
from ..backend.binding import Binding
from ..config import ServerConfig
from ..errors import InvalidArgumentError, TritonError, UnavailableError
from ..tracing import Tracer
from ..triton import control
from ..triton.log import change_log_settings
from ..triton.options import server_options
from ..triton.runtime import load_runtime
from .generated_repository import GeneratedRepository
from .lifecycle import live_servers, new_server, retire
from .model_table import ModelsMixin
from .queues import queue_stats, with_queues_in_metrics
from .repositories import LoadedModel, Repositories

log = logging.getLogger("embedtriton")


class Endpoint(Protocol):
    """A frontend serving a server's models (gRPC, HTTP, metrics, ...); see :meth:`CoreServer.attach`."""

    def drain(self) -> None:
        """The server stops: refuse new work; work in flight goes on."""

    def stop(self, grace: float) -> None:
        """Stop serving; calls in progress get ``grace`` seconds to finish."""


class CoreServer(ModelsMixin):
    """NVIDIA Triton Inference Server running inside this process (without endpoints; the
    public :class:`embedtriton.Server` adds ``serve_grpc``, ``serve_http``, ``serve_vertex_ai``
    and ``serve_metrics``)."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.config.validate()
        self._lock = threading.RLock()
        self._handle: int | None = None
        self._generated_repository = GeneratedRepository(None)  # where bound models are written: a temporary folder
        self._bound: dict[str, Binding] = {}  # name -> the model-level binding (its highest version)
        self._versions: dict[str, dict[int, Binding]] = {}  # name -> version -> binding (bound callables)
        # Bindings replaced (a reload with another config, a changed repository model) whose old
        # copy Triton may still be finalizing: stop() waits for them too before deleting Triton.
        self._replaced: list[Binding] = []
        self._repository_models: dict[str, LoadedModel] = {}  # the user's repositories' Triton models that are loaded
        self._repositories = Repositories(self)
        self._log: Path | None = None
        self._endpoints: dict[str, Endpoint] = {}  # kind ("grpc", "metrics") -> endpoint
        self._tracer: Tracer | None = Tracer(self.config.tracing) if self.config.tracing else None
        cfg = self.config
        self._log_state: dict[str, Any] = {
            "log_info": cfg.log_info, "log_warning": cfg.log_warning, "log_error": cfg.log_error,
            "log_verbose_level": cfg.log_verbose, "log_format": "default",
        }  # fmt: skip
        self._stopping = False  # stop() is draining

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> CoreServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> CoreServer:
        """Start Triton and load every model bound so far."""
        with self._lock:
            if self._handle is not None:
                return self
            runtime, _library = load_runtime()
            native = library.native()
            cfg, repository = self.config, self._generated_repository
            repository.open()
            assert repository.models is not None and repository.backends is not None and repository.backend_dir
            self._log = Path(cfg.log_file) if cfg.log_file else repository.backends / "triton.log"
            try:
                with server_options(cfg, runtime, repository.models, repository.backend_dir, self._log) as options:
                    handle = new_server(options)
            except BaseException:
                repository.close(list(self._bound))
                raise
            self._handle = handle
            self._stopping = False
            native.open_server(handle)
            live_servers.add(self)
            try:
                for binding in list(self._bound.values()):
                    self._load(binding)
                self._repositories.start()
            except BaseException:
                self.stop()
                raise
            return self

    def stop(self) -> None:
        """Stop Triton, draining first: new requests are refused at once (in process and by
        every endpoint; gRPC health checks say NOT_SERVING), requests in flight finish and
        their replies are delivered. Only what still runs after ``exit_timeout_secs`` (in
        total) fails, with an :class:`UnavailableError`; nobody is left waiting. A callable
        still running then finishes on its own thread and its result is dropped."""
        with self._lock:
            handle = self._handle
            if handle is None:
                self._stop_endpoints(0.0)
                return
            native = library.native()
            self._stopping = True
            timeout = float(self.config.exit_timeout_secs)
            deadline = time.monotonic() + timeout
            native.close_server(handle)  # in-process submits are refused from here on
            for endpoint in list(self._endpoints.values()):
                endpoint.drain()
            # 1. What is in flight finishes (a little is kept to deliver the last replies).
            waited = self._wait_in_flight(handle, deadline - min(0.2, 0.1 * timeout))
            # 2. What is left fails now; Triton drops what it has not started.
            failed = native.fail_pending(handle)
            native.cancel_all(handle)
            if failed:
                log.warning(
                    "%d request(s) still running after exit_timeout_secs=%s failed with UnavailableError",
                    failed, self.config.exit_timeout_secs,
                )  # fmt: skip
            # 3. Replies go out; the endpoints close.
            self._stop_endpoints(max(deadline - time.monotonic(), 0.05))
            # 4. Models unload, Triton stops, within what is left.
            self._handle = None
            live_servers.discard(self)
            self._repositories.stop()
            # the repositories' models together, as Triton's own stop unloads them; then the
            # bound ones, ensembles before the models they use
            control.unload_models(handle, list(self._repository_models), deadline, native.delete_released)
            for name in reversed(list(self._bound)):
                self._unload(handle, name, deadline)
            self._repository_models.clear()
            everything = [
                b for name in self._bound for b in (self._versions.get(name) or {0: self._bound[name]}).values()
            ]
            everything += [b for b in self._replaced if b not in everything]
            self._replaced.clear()
            for binding in everything:
                left = max(deadline - time.monotonic(), 0.0)
                if not binding.wait_finalized(left, native.delete_released) and waited:
                    log.warning("model '%s' was not finalized within exit_timeout_secs", binding.name)
            try:
                control.stop_server(handle, int(deadline - time.monotonic()))
            except TritonError as exc:
                log.warning("stopping Triton: %s", exc)
            retire(handle, everything)
            for binding in everything:
                library.bindings.pop(self._generated_repository.key(binding), None)
            self._generated_repository.close(list(self._bound))
            self._stopping = False

    def _wait_in_flight(self, handle: int, until: float) -> bool:
        """Wait until every call of this server completed (or ``until``); whether they did."""
        native = library.native()
        while True:
            waiting, _holding = native.pending(handle)
            if not waiting:
                return True
            if time.monotonic() >= until:
                return False
            native.delete_released()
            time.sleep(0.002)

    def attach(self, kind: str, endpoint: Endpoint) -> None:
        """Attach a frontend's endpoint: drained and stopped by :meth:`stop`. One per kind."""
        with self._lock:
            if kind in self._endpoints:
                raise InvalidArgumentError(f"already serving {kind}")
            self._endpoints[kind] = endpoint

    def endpoint(self, kind: str) -> Endpoint | None:
        """The attached endpoint of ``kind``, if any."""
        return self._endpoints.get(kind)

    def _stop_endpoints(self, grace: float) -> None:
        endpoints, self._endpoints = list(self._endpoints.values()), {}
        for endpoint in endpoints:
            endpoint.stop(grace)

    @property
    def live(self) -> bool:
        """Whether Triton is running."""
        handle = self._handle
        return handle is not None and control.is_live(handle)

    @property
    def ready(self) -> bool:
        """Whether Triton is running and every loaded model is ready (False while stopping)."""
        handle = self._handle
        return not self._stopping and handle is not None and control.is_ready(handle)

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` is draining the server."""
        return self._stopping

    @property
    def tracer(self) -> Tracer | None:
        """The tracer when ``ServerConfig.tracing`` is set (its settings change at run time)."""
        return self._tracer

    def log_settings(self, **changes: Any) -> dict[str, Any]:
        """Triton's log settings, after applying ``changes`` (``log_info``, ``log_warning``,
        ``log_error``: bool; ``log_verbose_level``: int; ``log_format``: "default" or
        "ISO8601"). Triton's logger is process-wide: this affects every server."""
        new = self._log_state = change_log_settings(self._log_state, changes)
        return {**new, "log_file": str(self._log or self.config.log_file or "")}

    def metadata(self) -> dict[str, Any]:
        """Triton's server metadata (name, version, extensions)."""
        return control.server_metadata(self._require_handle())

    def metrics(self) -> str:
        """Triton's metrics in Prometheus text format (with the queues of bound models' queue
        policies and priorities, which Triton does not see: see :mod:`.queues`)."""
        handle = self._require_handle()
        return with_queues_in_metrics(control.metrics(handle), queue_stats(handle))

    def _require_handle(self) -> int:
        handle = self._handle
        if handle is None:
            raise UnavailableError("the server is not running; call start() or use 'with server:'")
        return handle
