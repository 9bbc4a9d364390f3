"""The in-process Triton server: lifecycle, binding callables, model handles, and the
endpoints (frontends) attached to it, which it drains and stops with itself."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from ..backend import library
from ..backend.batch import InferFunc
from ..backend.binding import Binding
from ..config import ModelConfig, ServerConfig, Tensor, name_tensors
from ..config.ensemble import Step, StepModel
from ..config.triton_json import model_config_json
from ..errors import InternalError, InvalidArgumentError, NotFoundError, TritonError, UnavailableError
from ..tracing import Tracer
from ..triton import control
from ..triton.log import log_size, logged_errors, updated_log_settings
from ..triton.options import apply_log_settings, server_options
from ..triton.runtime import load_runtime
from .declarations import check_config, check_declarations, check_name
from .ensembles import Ensemble
from .lifecycle import live_servers, new_server, retire
from .model import Model
from .repository import Repository

log = logging.getLogger("embedtriton")


class Endpoint(Protocol):
    """A frontend serving a server's models (gRPC, metrics, ...); see :meth:`CoreServer.attach`."""

    def drain(self) -> None:
        """The server stops: refuse new work; work in flight goes on."""

    def stop(self, grace: float) -> None:
        """Stop serving; calls in progress get ``grace`` seconds to finish."""


class CoreServer:
    """NVIDIA Triton Inference Server running inside this process (without endpoints; the
    public :class:`embedtriton.Server` adds ``serve_grpc`` and ``serve_metrics``)."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.config.validate()
        self._lock = threading.RLock()
        self._handle: int | None = None
        self._repository = Repository(self.config.model_repository)
        self._bound: dict[str, Binding] = {}
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
            cfg, repository = self.config, self._repository
            repository.open()
            assert repository.models is not None and repository.backends is not None
            self._log = Path(cfg.log_file) if cfg.log_file else repository.backends / "triton.log"
            try:
                with server_options(cfg, runtime, repository.models, repository.backends, self._log) as options:
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
            for name in reversed(list(self._bound)):  # ensembles before the models they use
                self._unload(handle, name, deadline)
            for binding in self._bound.values():
                left = max(deadline - time.monotonic(), 0.0)
                if not binding.wait_finalized(left, native.drain) and waited:
                    log.warning("model '%s' was not finalized within exit_timeout_secs", binding.name)
            try:
                control.stop_server(handle, int(deadline - time.monotonic()))
            except TritonError as exc:
                log.warning("stopping Triton: %s", exc)
            retire(handle)
            for binding in self._bound.values():
                library.bindings.pop(str(self._repository.model_dir(binding.name)), None)
            self._repository.close(list(self._bound))
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
            native.drain()
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
        check_declarations(model_name, infer_func, inputs, outputs)
        config = config if config is not None else ModelConfig()
        check_config(model_name, config, self.config)
        binding = Binding(
            model_name, infer_func, name_tensors(inputs, "INPUT"), name_tensors(outputs, "OUTPUT"), config
        )
        model_config_json(model_name, binding.inputs, binding.outputs, config, library.BACKEND_NAME)  # validates
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

    def bind_ensemble(
        self,
        model_name: str,
        steps: Sequence[Step],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig | None = None,
    ) -> Model:
        """Serve a pipeline of bound models as one model ``model_name``, run by Triton's
        ensemble scheduler: each :class:`Step` runs a model on ensemble tensors (the
        ensemble's ``inputs``, other steps' outputs) and names the tensors it produces; the
        steps form a DAG. Bind the step models first. ``config`` takes ``batching``,
        ``max_batch_size``, ``decoupled`` (needed when a step streams) and ``response_cache``.
        """
        check_name(model_name)
        for what, tensors in (("inputs", inputs), ("outputs", outputs)):
            if not tensors or not all(isinstance(t, Tensor) and t.name for t in tensors):
                raise InvalidArgumentError(f"{what} of ensemble '{model_name}' must be a list of named Tensors")
        config = config if config is not None else ModelConfig()
        check_config(model_name, config, self.config)
        with self._lock:
            if model_name in self._bound:
                raise InvalidArgumentError(f"model '{model_name}' is already bound; unbind() it first")
            models = {n: StepModel(b.inputs, b.outputs, b.max_batch_size, b.decoupled) for n, b in self._bound.items()}
            ensemble = Ensemble(
                model_name, steps, name_tensors(inputs, "INPUT"), name_tensors(outputs, "OUTPUT"), config, models
            )
            self._bound[model_name] = ensemble  # type: ignore[assignment]
            if self._handle is not None:
                try:
                    self._load(ensemble)  # type: ignore[arg-type]
                except BaseException:
                    del self._bound[model_name]
                    raise
        return Model(self, model_name)

    def unbind(self, model_name: str) -> None:
        """Unload a bound model and forget it (waits until Triton has let go of it)."""
        with self._lock:
            if model_name not in self._bound:
                raise NotFoundError(f"no model '{model_name}' is bound (bound: {sorted(self._bound)})")
            users = sorted(n for n, b in self._bound.items() if model_name in getattr(b, "step_models", ()))
            if users:
                raise InvalidArgumentError(
                    f"model '{model_name}' is a step of ensemble {users}: unbind the ensemble first"
                )
            binding = self._bound[model_name]
            if self._handle is not None:
                self._unload(self._handle, model_name)
            del self._bound[model_name]
            if self._handle is not None:
                binding.wait_finalized(self.config.exit_timeout_secs, library.native().drain)
            if self._repository.models is not None:
                library.bindings.pop(str(self._repository.model_dir(binding.name)), None)
                self._repository.remove(binding.name)

    def unload(self, model_name: str) -> None:
        """Unload a bound model but keep it bound (its requests fail until :meth:`load`)."""
        with self._lock:
            binding = self._running_binding(model_name)
            self._unload(self._handle, model_name)  # type: ignore[arg-type]
            binding.wait_finalized(self.config.exit_timeout_secs, library.native().drain)

    def load(self, model_name: str, config: ModelConfig | None = None) -> None:
        """Load a bound model again (after :meth:`unload`); loading a loaded model reloads it.

        With ``config``, the model is reloaded with that configuration (same callable and
        tensors; e.g. another ``max_batch_size`` or batcher), validated as :meth:`bind`
        validates it; if Triton refuses it, the model keeps its previous configuration.
        """
        with self._lock:
            binding = self._running_binding(model_name)
            if config is None:
                self._load(binding)
                return
            check_config(model_name, config, self.config)
            changed = Binding(model_name, binding.infer_func, binding.inputs, binding.outputs, config)
            model_config_json(model_name, changed.inputs, changed.outputs, config, library.BACKEND_NAME)
            self._bound[model_name] = changed
            try:
                self._load(changed)
            except BaseException:
                self._bound[model_name] = binding
                library.bindings[str(self._repository.model_dir(model_name))] = binding
                if changed.warmup_error is not None:  # it was unloaded: serve the previous config again
                    self._load(binding)
                raise

    def _running_binding(self, model_name: str) -> Binding:
        binding = self._bound.get(model_name)
        if binding is None:
            raise NotFoundError(f"no model '{model_name}' is bound (bound: {sorted(self._bound)})")
        if self._handle is None:
            raise UnavailableError("the server is not running")
        return binding

    def binding(self, name: str) -> Binding | None:
        """What ``bind`` was given for model ``name`` (callable, tensors, config), or None."""
        return self._bound.get(name)

    def model(self, name: str, version: int = -1) -> Model:
        """A handle on model ``name`` (``version`` -1: the latest ready one, as Triton picks it)."""
        if name not in self._bound:
            raise NotFoundError(f"no model '{name}' (bound: {sorted(self._bound)})")
        return Model(self, name, version)

    def models(self) -> list[Model]:
        """Handles on every bound model."""
        return [Model(self, name) for name in self._bound]

    def log_settings(self, **changes: Any) -> dict[str, Any]:
        """Triton's log settings, after applying ``changes`` (``log_info``, ``log_warning``,
        ``log_error``: bool; ``log_verbose_level``: int; ``log_format``: "default" or
        "ISO8601"). Triton's logger is process-wide: this affects every server."""
        new = updated_log_settings(self._log_state, changes)
        apply_log_settings(
            new["log_info"],
            new["log_warning"],
            new["log_error"],
            new["log_verbose_level"],
            new["log_format"] == "ISO8601",
        )
        self._log_state = new
        return {**new, "log_file": str(self._log or self.config.log_file or "")}

    def metadata(self) -> dict[str, Any]:
        """Triton's server metadata (name, version, extensions)."""
        return control.server_metadata(self._require_handle())

    def metrics(self) -> str:
        """Triton's metrics in Prometheus text format."""
        return control.metrics(self._require_handle())

    # -- internals -----------------------------------------------------------

    def _load(self, binding: Binding) -> None:
        directory = self._repository.write(binding)
        config = binding.triton_config(library.library_path())
        library.bindings[str(directory)] = binding
        started = time.perf_counter()
        log_offset = log_size(self._log)
        binding.warming, binding.warmup_error = True, None
        try:
            control.load_model(self._require_handle(), binding.name, config)
        except TritonError as exc:
            library.bindings.pop(str(directory), None)
            details = logged_errors(self._log, log_offset)
            if details:
                raise type(exc)(f"{exc}: {details}") from None
            raise
        finally:
            binding.warming = False
        binding.loaded_at = time.monotonic()
        if binding.warmup_error is not None:  # Triton saw a success (see Binding.warmup_runs): unload
            self._unload(self._require_handle(), binding.name)
            binding.wait_finalized(self.config.exit_timeout_secs, library.native().drain)
            library.bindings.pop(str(directory), None)
            raise InternalError(f"failed to load '{binding.name}': its warm-up failed: {binding.warmup_error}")
        log.info("model '%s' ready in %.3f s", binding.name, time.perf_counter() - started)

    def _unload(self, handle: int, name: str, deadline: float | None = None) -> None:
        # Triton 2.51 crashes when a model is deleted while its instance thread is still
        # finishing its last task (here: the load); give that thread a moment.
        binding = self._bound.get(name)
        settle = 0.02 - (time.monotonic() - binding.loaded_at) if binding and binding.loaded_at else 0
        if settle > 0:
            time.sleep(settle)
        if deadline is None:
            deadline = time.monotonic() + self.config.exit_timeout_secs
        try:
            control.unload_model(handle, name, deadline, library.native().drain)
        except TritonError as exc:
            log.warning("unloading model '%s': %s", name, exc)

    def _require_handle(self) -> int:
        handle = self._handle
        if handle is None:
            raise UnavailableError("the server is not running; call start() or use 'with server:'")
        return handle
