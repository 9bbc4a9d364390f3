"""The public server: the core server (lifecycle, models) plus the frontends it can serve,
``serve_grpc``, ``serve_http``, ``serve_vertex_ai`` and ``serve_metrics``. Frontends wrap the
server; the core knows none of them."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, TypeVar

from .config import ServerConfig
from .core import CoreServer
from .errors import InvalidArgumentError
from .frontends.grpc.options import GrpcOptions, normalize_address
from .frontends.http.options import HttpOptions

log = logging.getLogger("embedtriton")

__all__ = ["Server", "ServerConfig"]

_Options = TypeVar("_Options", GrpcOptions, HttpOptions)


def _endpoint_options(
    kind: str, options: _Options, address: str | int | None, settings: dict[str, Any], skip_none: bool = False
) -> _Options:
    """An endpoint's ``options`` with the fields that ``address`` (unless None) and the keyword
    ``settings`` of ``serve_*`` override (with ``skip_none``, a None setting overrides nothing).
    An unknown setting is an :class:`InvalidArgumentError` that lists the known ones."""
    fields = {f.name for f in dataclasses.fields(options) if f.init} - {"address"}
    unknown = sorted(set(settings) - fields)
    if unknown:
        raise InvalidArgumentError(f"unknown {kind} setting(s) {unknown}; the settings are {sorted(fields)}")
    if address is not None:
        settings = {**settings, "address": address}
    if skip_none:
        settings = {k: v for k, v in settings.items() if v is not None}
    return dataclasses.replace(options, **settings)


class Server(CoreServer):
    """NVIDIA Triton Inference Server running inside this process.

    ``bind()`` Python callables as models, ``start()`` (or use ``with server:``), then call
    them through ``server.model(name).infer(...)``; ``serve_grpc()`` and ``serve_http()`` serve
    them to other processes, ``serve_metrics()`` exposes Triton's Prometheus metrics.
    """

    def __enter__(self) -> Server:
        self.start()
        return self

    def start(self) -> Server:
        """Start Triton and load every model bound so far; returns the server (``with server:``
        calls it, and :meth:`stop` on exit)."""
        super().start()
        return self

    def serve_grpc(
        self, address: str | int | None = None, *, options: GrpcOptions | None = None, **settings: Any
    ) -> int:
        """Serve the models on a KServe-v2 gRPC endpoint (``inference.GRPCInferenceService``
        plus ``grpc.health.v1.Health``) that stock Triton clients use; stopped by :meth:`stop`.

        ``address`` (``"127.0.0.1:8001"`` by default; ``":8001"`` and ``8001`` mean 127.0.0.1 too;
        ``"host:0"`` picks a free port) and
        ``settings`` override the fields of ``options`` (:class:`GrpcOptions`):
        ``max_message_bytes``, ``tls_cert``, ``tls_key``, ``tls_client_ca``, ``transport``
        (``"native"`` or ``"grpcio"``), ``limits`` (:class:`GrpcLimits`), ``shared_memory``,
        ``infer_response_compression_level``, ``restricted_protocol`` (Triton's
        ``--grpc-restricted-protocol`` specs), ``header_forward_pattern`` and
        ``max_buffered_bytes`` (request bytes arriving, across connections).
        Returns the port. Needs ``pip install "embedtriton[grpc]"``.
        """
        options = _endpoint_options("gRPC", options or GrpcOptions(), address, settings, skip_none=True)
        from .frontends.grpc.endpoint import GrpcEndpoint

        with self._lock:
            current = self.endpoint("grpc")
            if current is not None:
                raise InvalidArgumentError(f"already serving gRPC on {current.address}")  # type: ignore[attr-defined]
            endpoint = GrpcEndpoint(self, options)
            self.attach("grpc", endpoint)
        log.info("serving gRPC on %s (port %d)", options.address, endpoint.port)
        return endpoint.port

    def serve_http(
        self, address: str | int | None = None, *, options: HttpOptions | None = None, **settings: Any
    ) -> int:
        """Serve the models over Triton's KServe-v2 HTTP/REST protocol (health, metadata,
        config, statistics, inference with JSON and binary tensors, shared memory, repository,
        logging and trace settings, the generate extension, ``/metrics``) that stock Triton
        HTTP clients and ``curl`` use; stopped by :meth:`stop`, with the same drain as gRPC.

        ``address`` (``"127.0.0.1:8000"`` by default; ``"host:0"`` picks a free port) and
        ``settings`` override the fields of ``options`` (:class:`HttpOptions`):
        ``max_body_bytes``, ``max_header_bytes``, ``max_buffered_bytes`` (request bytes held
        across connections), ``max_connections``, ``idle_timeout_s``,
        ``request_timeout_s``, ``shared_memory``, ``tls_cert``, ``tls_key``, ``tls_client_ca``,
        ``restricted_api`` (Triton's ``--http-restricted-api`` specs), ``header_forward_pattern``,
        ``openai`` (also answer OpenAI's ``/v1/`` routes for the models bound with
        :mod:`embedtriton.openai`, see ``docs/openai.md``) and ``openai_api_key``. Returns the port (HTTP/1.1 is served in C:
        nothing more to install).
        """
        from .frontends.http.endpoint import RestEndpoint

        options = _endpoint_options("HTTP", options or HttpOptions(), address, settings)
        with self._lock:
            if self.endpoint("http") is not None:
                raise InvalidArgumentError("already serving HTTP")
            endpoint = RestEndpoint(self, options)
            self.attach("http", endpoint)
        log.info("serving HTTP on %s (port %d)", options.address, endpoint.port)
        return endpoint.port

    def serve_vertex_ai(
        self,
        address: str | int | None = None,
        *,
        predict_route: str | None = None,
        health_route: str | None = None,
        default_model: str | None = None,
        options: HttpOptions | None = None,
        **settings: Any,
    ) -> int:
        """Serve Triton's Vertex AI endpoint (what ``tritonserver --allow-vertex-ai`` serves):
        the predict route infers the default model, or the KServe-v2 path that the header
        ``X-Vertex-Ai-Triton-Redirect`` names; the health route says whether the server is ready;
        every other path is answered 400. Stopped by :meth:`stop`.

        The routes are regular expressions a request's path must match whole; they default to
        the environment Vertex AI sets, ``AIP_PREDICT_ROUTE`` and ``AIP_HEALTH_ROUTE``. The
        address defaults to ``127.0.0.1:$AIP_HTTP_PORT`` (8080 when unset). ``default_model``
        must be ready; left out, exactly one model must be ready now (the server's models are
        looked at once, here, as Triton does when it starts). ``settings`` are the HTTP endpoint's
        (:class:`HttpOptions`). Returns the port.
        """
        from .frontends.http import vertex_ai

        if address is None:
            address = f"127.0.0.1:{os.environ.get('AIP_HTTP_PORT') or 8080}"
        options = _endpoint_options("HTTP", options or HttpOptions(), address, settings)
        predict = os.environ.get("AIP_PREDICT_ROUTE", "") if predict_route is None else predict_route
        health = os.environ.get("AIP_HEALTH_ROUTE", "") if health_route is None else health_route
        with self._lock:
            if self.endpoint("vertex_ai") is not None:
                raise InvalidArgumentError("already serving Vertex AI")
            model = vertex_ai.default_model(self, default_model)
            endpoint = vertex_ai.VertexAiEndpoint(self, options, predict, health, model)
            self.attach("vertex_ai", endpoint)
        log.info("serving Vertex AI on %s (port %d), default model '%s'", options.address, endpoint.port, model)
        return endpoint.port

    def serve_metrics(self, address: str | int = "127.0.0.1:8002") -> int:
        """Serve Triton's Prometheus metrics over HTTP at ``http://ADDRESS/metrics``; stopped by
        :meth:`stop`. ``":8002"`` and ``8002`` mean 127.0.0.1; ``"host:0"`` picks a free port.
        Returns the port."""
        from .frontends.http.metrics import MetricsEndpoint

        with self._lock:
            if self.endpoint("metrics") is not None:
                raise InvalidArgumentError("already serving metrics")
            endpoint = MetricsEndpoint(self, normalize_address(address, "metrics"))
            self.attach("metrics", endpoint)
        return endpoint.port
