"""``Triton`` and ``TritonConfig``: PyTriton's server object, on an embedtriton ``Server`` in this
process (no tritonserver process, no IPC hop per call).

``Triton(config=TritonConfig(...))``, then ``bind(...)`` callables (before or after starting),
``run()`` (in the background) or ``serve()`` (blocking until SIGINT/SIGTERM, then drain and
return), ``stop()``, ``is_alive()``, or ``with Triton() as triton:``. Endpoints follow
PyTriton's (tritonserver's) defaults: HTTP on 0.0.0.0:8000, gRPC on 0.0.0.0:8001, metrics on
0.0.0.0:8002 (see :mod:`.triton_config`); with ``allow_vertex_ai``, Triton's Vertex AI endpoint
too (routes from ``AIP_PREDICT_ROUTE``/``AIP_HEALTH_ROUTE``; the server then starts at ``run()``
or ``serve()``, not on ``with``, as PyTriton's Vertex AI lifecycle does). An inference callable
that raises ``PyTritonUnrecoverableError`` fails its requests and stops the server, as in
PyTriton. ``RemoteTriton`` is refused at construction (see its docstring).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidArgumentError
from ..server import Server
from . import _convert
from ._serving import Served, TritonContext, serving
from .exceptions import PyTritonInvalidOperationError, PyTritonValidationError
from .model_config.model_config import ModelConfig
from .triton_config import (
    DEFAULT_PROTECTED_ENDPOINTS,
    TRITON_ACCESS_HEADER,
    VALID_TRITON_ENDPOINTS,
    TritonConfig,
    TritonSecurityConfig,
    plan,
)

__all__ = [
    "DEFAULT_PROTECTED_ENDPOINTS",
    "TRITON_ACCESS_HEADER",
    "VALID_TRITON_ENDPOINTS",
    "DefaultTritonLifecyclePolicy",
    "RemoteTriton",
    "Triton",
    "TritonConfig",
    "TritonLifecyclePolicy",
    "TritonSecurityConfig",
    "VertextAILifecyclePolicy",
]

log = logging.getLogger("embedtriton.pytriton")

MONITORING_PERIOD_S = 10.0  # PyTriton's default for serve()
_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")  # PyTriton's model names


@dataclasses.dataclass
class TritonLifecyclePolicy:
    """PyTriton's lifecycle policy: whether ``with Triton(...)`` starts the server
    (``launch_triton_on_startup``), and ``local_model_store``, which only PyTriton's separate
    tritonserver process needs (accepted, with no effect here)."""

    launch_triton_on_startup: bool = True
    local_model_store: bool = False


DefaultTritonLifecyclePolicy = TritonLifecyclePolicy()
VertextAILifecyclePolicy = TritonLifecyclePolicy(
    launch_triton_on_startup=False, local_model_store=True
)  # (PyTriton's name)


class Triton:
    """NVIDIA Triton Inference Server serving Python callables, PyTriton's API.

    ``config`` is merged over ``PYTRITON_TRITON_CONFIG_*`` environment variables, as in
    PyTriton. ``workspace`` is accepted and not used (embedtriton writes no model store or
    sockets there). ``triton_lifecycle_policy`` says whether ``with Triton(...)`` starts the
    server (``launch_triton_on_startup``; its ``local_model_store`` has no meaning here: the
    models live in this process); left out, it is PyTriton's default, or its Vertex AI policy
    (start at ``run()``/``serve()``) when Vertex AI is on.
    ``security_config`` (:class:`TritonSecurityConfig`) is applied as PyTriton 0.7 applies it:
    left out, a token is generated and shared memory, the model repository, statistics, trace
    and logging need it on both endpoints (``get_access_token()`` returns it; clients pass it as
    ``ModelClient(..., access_token=...)``); ``TritonSecurityConfig(restricted_endpoints=[])``
    restricts nothing, and then ``TritonConfig``'s own ``http_restricted_api`` /
    ``grpc_restricted_protocol`` apply.
    """

    def __init__(
        self,
        *,
        config: TritonConfig | None = None,
        workspace: Any = None,
        triton_lifecycle_policy: Any = None,
        security_config: Any = None,
    ) -> None:
        if security_config is not None and not isinstance(security_config, TritonSecurityConfig):
            raise PyTritonValidationError(
                f"Triton(security_config=...) takes a TritonSecurityConfig, not {type(security_config).__name__}"
            )
        if triton_lifecycle_policy is not None and not isinstance(triton_lifecycle_policy, TritonLifecyclePolicy):
            raise PyTritonValidationError(
                f"triton_lifecycle_policy must be a TritonLifecyclePolicy, not {type(triton_lifecycle_policy).__name__}"
            )
        merged = {k: v for k, v in TritonConfig.from_env().to_dict().items() if v is not None}
        merged.update({k: v for k, v in (config.to_dict() if config else {}).items() if v is not None})
        self._config = TritonConfig(**merged)
        self._security_config = security_config or TritonSecurityConfig()  # PyTriton's default: a token
        self._plan = plan(self._config, self._security_config)
        if triton_lifecycle_policy is None:  # PyTriton picks its Vertex AI policy when Vertex AI is on
            vertex = self._plan.vertex_ai is not None
            triton_lifecycle_policy = VertextAILifecyclePolicy if vertex else DefaultTritonLifecyclePolicy
        self._lifecycle = triton_lifecycle_policy
        self._server = Server(self._plan.server)
        self._triton_context = TritonContext()
        self._lock = threading.RLock()
        self._wakeup = threading.Event()  # serve() waits on it: a signal, or the server stopped
        self._running = False
        self._ports: dict[str, int] = {}
        self._bound: dict[tuple[str, int], str] = {}  # (name in lower case, version) -> name, as PyTriton keys them

    # -- models ---------------------------------------------------------------

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        model_version: int = 1,
        config: ModelConfig | None = None,
        strict: bool = False,
        trace_config: list[str] | None = None,
    ) -> None:
        """Serve ``infer_func`` as ``model_name``: one callable, or a list of them (one model
        instance each). Works before and after the server starts. Outputs are always checked
        against ``outputs`` (as with ``strict=True``). A name (in any letter case) and version
        can be bound once until :meth:`stop`, which forgets every model, as in PyTriton."""
        if not model_name:
            raise PyTritonValidationError("Model name cannot be empty")
        if not isinstance(model_name, str) or not _NAME.match(model_name):
            raise PyTritonValidationError(
                "Model name can only contain alphanumeric characters, dots, underscores and dashes"
            )
        if trace_config is not None:
            raise PyTritonValidationError(
                "bind(trace_config=...) is not supported by embedtriton; for OpenTelemetry spans use "
                "embedtriton.ServerConfig(tracing=embedtriton.Tracing(...))"
            )
        key = (model_name.lower(), model_version)
        if key in self._bound:
            raise PyTritonInvalidOperationError("Cannot add model with the same name twice.")
        funcs = [infer_func] if callable(infer_func) else list(infer_func)
        if not funcs or not all(callable(f) for f in funcs):
            raise PyTritonValidationError("inference_fn has to be either callable or sequence of callables")
        if any(getattr(t, "optional", False) for t in outputs):
            raise PyTritonValidationError("Output tensors cannot be optional.")
        ins, outs = _convert.tensors(inputs, "INPUT"), _convert.tensors(outputs, "OUTPUT")
        given = config if config is not None else ModelConfig()
        ours = _convert.model_config(given, len(funcs))
        served = Served(_convert.served_config(model_name, model_version, ins, outs, given, ours), self._triton_context)
        bound = serving(funcs, served, self._unrecoverable)
        self._server.bind(model_name, bound, ins, outs, ours, strict=strict, version=model_version)
        self._bound[key] = model_name
        for func in funcs:
            self._triton_context.model_configs[func] = served.config

    # -- lifecycle ------------------------------------------------------------

    def run(self) -> None:
        """Start the server and its endpoints in the background (models bound so far load)."""
        with self._lock:
            if self._running:
                return
            self._server.start()
            try:
                p = self._plan
                self._server._repositories.load_all()  # tritonserver's --load-model=*, as PyTriton runs it
                if p.http is not None:
                    self._ports["http"] = self._server.serve_http(p.http, **p.http_settings)
                if p.grpc is not None:
                    self._ports["grpc"] = self._server.serve_grpc(**p.grpc)
                if p.metrics is not None:
                    self._ports["metrics"] = self._server.serve_metrics(p.metrics)
                if p.vertex_ai is not None:
                    self._ports["vertex_ai"] = self._serve_vertex_ai(**p.vertex_ai)
            except BaseException:
                self._server.stop()
                self._ports.clear()
                raise
            self._running = True
            self._wakeup.clear()
        for model in self._server.models():
            log.info("Infer function available as model: `/v2/models/%s`", model.name)
        log.info("Serving: %s", ", ".join(f"{k} on port {v}" for k, v in self._ports.items()))

    def _serve_vertex_ai(self, address: str, default_model: str | None) -> int:
        """The Vertex AI endpoint, routes from ``AIP_PREDICT_ROUTE``/``AIP_HEALTH_ROUTE`` (read now,
        as tritonserver reads them when it starts)."""
        try:
            return self._server.serve_vertex_ai(address, default_model=default_model)
        except InvalidArgumentError as exc:
            raise PyTritonValidationError(f"Vertex AI endpoint: {exc}") from None

    def connect(self) -> None:
        """PyTriton's connect: the server here is in process, so this starts it (as ``run``)."""
        self.run()

    def serve(self, monitoring_period_s: float = MONITORING_PERIOD_S) -> None:
        """Run and block until SIGINT or SIGTERM (in the main thread), or until the server stops
        (``stop()`` from another thread, an unrecoverable error); then stop, draining requests
        in flight (``exit_timeout_secs``), and return."""
        self.run()
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():

            def on_signal(signum: int, _frame: Any) -> None:
                log.info("signal %d received: stopping", signum)
                self._wakeup.set()

            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, on_signal)
        try:
            log.info("(Press CTRL+C or use `kill -SIGINT %d` to stop)", os.getpid())
            while not self._wakeup.is_set() and self.is_alive():
                self._wakeup.wait(monitoring_period_s)
        except KeyboardInterrupt:
            log.info("SIGINT received, exiting.")
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            self.stop()

    def stop(self) -> bool:
        """Stop the server, draining requests in flight, and forget the bound models (as
        PyTriton does: bind again, then ``run()`` again, to serve anew); False when it was not
        running."""
        with self._lock:
            if not self._running:
                return False
            self._running = False
            try:
                self._server.stop()
            finally:
                self._ports.clear()
                self._wakeup.set()
                for name in dict.fromkeys(self._bound.values()):
                    self._server.unbind(name)
                self._bound.clear()
        return True

    def is_alive(self) -> bool:
        """Whether the server runs (and serves)."""
        return self._running and self._server.live and not self._server.stopping

    def is_connected(self) -> bool:
        """Whether the server runs (PyTriton's name: its Triton was a process to connect to)."""
        return self._running

    def __enter__(self) -> Triton:
        """Start serving, unless the lifecycle policy says not to (PyTriton's Vertex AI policy,
        taken when Vertex AI is on: the server starts at ``serve()`` or ``run()``, once the
        models are bound, since the endpoint picks its default model when it starts)."""
        if self._lifecycle.launch_triton_on_startup:
            self.run()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _unrecoverable(self, exc: BaseException) -> None:
        """An inference callable raised PyTritonUnrecoverableError: stop the server (on a thread
        of its own: the calling model's requests are among those the stop drains)."""
        threading.Thread(target=self.stop, name="pytriton-unrecoverable-stop", daemon=True).start()

    # -- embedtriton extensions ---------------------------------------------------

    @property
    def http_port(self) -> int | None:
        """The HTTP endpoint's port while running (useful with ``http_port=0``)."""
        return self._ports.get("http")

    @property
    def grpc_port(self) -> int | None:
        """The gRPC endpoint's port while running."""
        return self._ports.get("grpc")

    @property
    def metrics_port(self) -> int | None:
        """The metrics endpoint's port while running."""
        return self._ports.get("metrics")

    @property
    def vertex_ai_port(self) -> int | None:
        """The Vertex AI endpoint's port while running (``allow_vertex_ai``)."""
        return self._ports.get("vertex_ai")

    @property
    def server(self) -> Server:
        """The embedtriton Server underneath (for in-process calls: ``triton.server.model(name).infer``)."""
        return self._server

    def get_access_token(self) -> str | None:
        """The access token the restricted endpoints need (given or generated; None when the
        security config restricts nothing)."""
        return self._security_config.access_token


class RemoteTriton:
    """PyTriton's ``RemoteTriton(url, workspace=None, access_token=None)`` binds callables of
    this process into a Triton server running elsewhere (PyTriton's proxy backend calls them
    over sockets in a shared workspace). embedtriton has no such proxy: a model's callable runs
    in the process that runs Triton. Constructing one raises :class:`PyTritonValidationError`
    that says what to do instead."""

    def __init__(self, url: str, workspace: Any = None, access_token: str | None = None) -> None:
        raise PyTritonValidationError(
            f"RemoteTriton(url={url!r}) is not supported by embedtriton: a model's callable runs in the process "
            "that runs Triton. Bind it there with Triton.bind(...) (one process can bind many models), or serve it "
            "from a Triton of its own in this process and call it over gRPC/HTTP with ModelClient(url, model_name)"
        )
