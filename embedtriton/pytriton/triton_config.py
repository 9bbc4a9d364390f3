"""``TritonConfig``: PyTriton's server settings (every field of PyTriton 0.7, ``None`` meaning
Triton's default), and their translation onto embedtriton's ``ServerConfig`` and endpoints.

Defaults are PyTriton's, which are ``tritonserver``'s: HTTP on 0.0.0.0:8000, gRPC on
0.0.0.0:8001, metrics on 0.0.0.0:8002 (the HTTP address unless ``metrics_address`` is set),
all three on unless ``allow_http``/``allow_grpc``/``allow_metrics`` is False. A port of 0
picks a free one (an embedtriton extension: ``Triton.http_port`` etc. say which).
``allow_vertex_ai`` serves Triton's Vertex AI endpoint on 0.0.0.0:``vertex_ai_port`` (else
``AIP_HTTP_PORT``, else 8080); ``AIP_MODE=PREDICTION`` in the environment turns it on and HTTP
and gRPC off unless set, as it does for tritonserver.
Settings embedtriton has no equivalent for are refused at ``Triton(...)`` with the reason.

``TritonSecurityConfig`` is PyTriton 0.7's token-based access restriction: by default a token
is generated and shared memory, the model repository, statistics, trace and logging need it
(header ``triton-access-token`` over HTTP, ``triton-grpc-protocol-triton-access-token`` over
gRPC), applied to both endpoints in place of ``http_restricted_api`` / ``grpc_restricted_protocol``,
as PyTriton does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import secrets
from collections.abc import Mapping
from typing import Any

from ..config import ServerConfig
from ..frontends.security import GROUPS, GRPC_HEADER_PREFIX, RestrictedApis, forward_pattern, specs
from .exceptions import PyTritonValidationError

__all__ = ["TritonConfig", "TritonSecurityConfig"]

log = logging.getLogger("embedtriton.pytriton")

# PyTriton 0.7's names (pytriton/triton.py)
VALID_TRITON_ENDPOINTS = frozenset(GROUPS)  # Triton's restricted-API groups
DEFAULT_PROTECTED_ENDPOINTS = ["shared-memory", "model-repository", "statistics", "trace", "logging"]
TRITON_ACCESS_HEADER = "triton-access-token"

ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"
DEFAULT_ADDRESS = "0.0.0.0"  # tritonserver's (and so PyTriton's) default for every endpoint
DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "vertex_ai": 8080}


@dataclasses.dataclass(kw_only=True)
class TritonConfig:
    """Triton's settings, PyTriton's field names (keyword-only; ``None``: the default)."""

    model_repository: pathlib.Path | None = None
    id: str | None = None
    log_verbose: int | None = None
    log_file: pathlib.Path | None = None
    exit_timeout_secs: int | None = None
    exit_on_error: bool | None = None
    strict_readiness: bool | None = None
    allow_http: bool | None = None
    http_address: str | None = None
    http_port: int | None = None
    http_header_forward_pattern: str | None = None
    http_thread_count: int | None = None
    http_restricted_api: str | None = None
    allow_grpc: bool | None = None
    grpc_address: str | None = None
    grpc_port: int | None = None
    grpc_header_forward_pattern: str | None = None
    grpc_infer_allocation_pool_size: int | None = None
    grpc_use_ssl: bool | None = None
    grpc_use_ssl_mutual: bool | None = None
    grpc_server_cert: pathlib.Path | None = None
    grpc_server_key: pathlib.Path | None = None
    grpc_root_cert: pathlib.Path | None = None
    grpc_infer_response_compression_level: str | None = None
    grpc_keepalive_time: int | None = None
    grpc_keepalive_timeout: int | None = None
    grpc_keepalive_permit_without_calls: bool | None = None
    grpc_http2_max_pings_without_data: int | None = None
    grpc_http2_min_recv_ping_interval_without_data: int | None = None
    grpc_http2_max_ping_strikes: int | None = None
    grpc_restricted_protocol: str | None = None
    allow_metrics: bool | None = None
    allow_gpu_metrics: bool | None = None
    allow_cpu_metrics: bool | None = None
    metrics_interval_ms: int | None = None
    metrics_port: int | None = None
    metrics_address: str | None = None
    allow_sagemaker: bool | None = None
    sagemaker_port: int | None = None
    sagemaker_safe_port_range: str | None = None
    sagemaker_thread_count: int | None = None
    allow_vertex_ai: bool | None = None
    vertex_ai_port: int | None = None
    vertex_ai_thread_count: int | None = None
    vertex_ai_default_model: str | None = None
    metrics_config: list[str] | None = None
    trace_config: list[str] | None = None
    cache_config: list[str] | None = None
    cache_directory: str | None = None
    buffer_manager_thread_count: int | None = None

    def __post_init__(self) -> None:
        if self.allow_http is False and self.allow_grpc is False:
            raise PyTritonValidationError("The `http` or `grpc` endpoint has to be allowed.")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a dict (PyTriton's; :meth:`from_dict` reads one back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TritonConfig:
        """A config from ``{field: value}``; string values are converted to the field's type
        (lists from comma-separated strings). Unknown names are ignored with a warning, as
        PyTriton does (a newer release's setting does not stop an older one)."""
        kinds = _kinds()
        for name, value in config.items():
            if name not in kinds:
                log.warning(
                    "Ignoring %s=%s as could not find matching config field. Available fields: %s",
                    name, value, ", ".join(kinds),
                )  # fmt: skip
        return cls(**{name: _convert(name, kinds[name], value) for name, value in config.items() if name in kinds})

    @classmethod
    def from_env(cls) -> TritonConfig:
        """A config from ``PYTRITON_TRITON_CONFIG_<FIELD>`` environment variables (e.g.
        ``PYTRITON_TRITON_CONFIG_GRPC_PORT=8101``); list fields take ``..._<FIELD>_<N>`` items."""
        values: dict[str, Any] = {}
        items: dict[str, dict[int, str]] = {}
        kinds = _kinds()
        for key, value in os.environ.items():
            if not key.startswith(ENV_PREFIX):
                continue
            name = key[len(ENV_PREFIX) :].lower()
            indexed = re.fullmatch(r"(.+?)_(\d+)", name)
            if indexed and kinds.get(indexed.group(1)) == "list":
                items.setdefault(indexed.group(1), {})[int(indexed.group(2))] = value
            elif name in kinds:
                values[name] = value
        for name, by_index in items.items():
            values[name] = [by_index[i] for i in sorted(by_index)]
        return cls.from_dict(values)


def _kinds() -> dict[str, str]:
    """field -> "bool", "int", "str", "path" or "list" (from the annotations)."""
    out = {}
    for f in dataclasses.fields(TritonConfig):
        annotation = str(f.type)
        out[f.name] = next(k for k in ("bool", "int", "list", "Path", "str") if k in annotation).lower()
    return out


def _convert(name: str, kind: str, value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return list(value) if kind == "list" and value is not None else value
    try:
        if kind == "bool":
            if value.strip().lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(value)
            return value.strip().lower() in ("1", "true", "yes", "on")
        if kind == "int":
            return int(value)
        if kind == "path":
            return pathlib.Path(value)
        if kind == "list":
            return value.split(",")
        return value
    except ValueError:
        raise PyTritonValidationError(f"TritonConfig.{name}: {value!r} is not a valid {kind}") from None


@dataclasses.dataclass
class TritonSecurityConfig:
    """PyTriton's token-based access restriction (``Triton(security_config=...)``).

    ``restricted_endpoints``: the groups that need the token (Triton's restricted-API groups:
    health, metadata, inference, shared-memory, model-config, model-repository, statistics,
    trace, logging); None means PyTriton's default (shared-memory, model-repository, statistics,
    trace, logging), ``[]`` none. ``access_token``: the token; None with groups to protect
    generates one (``secrets.token_urlsafe(32)``; ``Triton.get_access_token()`` returns it).
    Clients send it as ``ModelClient(url, model, access_token=...)`` does.
    """

    access_token: str | None = None
    restricted_endpoints: list[str] | None = None

    def __post_init__(self) -> None:
        if self.restricted_endpoints is None:
            self.restricted_endpoints = list(DEFAULT_PROTECTED_ENDPOINTS)
        invalid = set(self.restricted_endpoints) - VALID_TRITON_ENDPOINTS
        if invalid:
            raise PyTritonValidationError(
                f"Invalid endpoint names: {', '.join(sorted(invalid))}. "
                f"Valid endpoints are: {', '.join(sorted(VALID_TRITON_ENDPOINTS))}"
            )
        if self.access_token is None and self.restricted_endpoints:
            self.access_token = secrets.token_urlsafe(32)

    def restriction(self) -> str | None:
        """The ``--http-restricted-api`` / ``--grpc-restricted-protocol`` value PyTriton builds
        (None: nothing is restricted)."""
        if not self.access_token or not self.restricted_endpoints:
            return None
        return f"{','.join(self.restricted_endpoints)}:{TRITON_ACCESS_HEADER}={self.access_token}"


# Settings embedtriton cannot honour: field -> what to do instead.
_REFUSED = {
    "http_thread_count": "the HTTP endpoint runs on one event loop; remove it",
    "grpc_infer_allocation_pool_size": "there is no such pool in embedtriton; remove it",
    "grpc_keepalive_time": "gRPC keepalive is not configurable; remove it",
    "grpc_keepalive_timeout": "gRPC keepalive is not configurable; remove it",
    "grpc_keepalive_permit_without_calls": "gRPC keepalive is not configurable; remove it",
    "grpc_http2_max_pings_without_data": "HTTP/2 ping limits are not configurable; remove it",
    "grpc_http2_min_recv_ping_interval_without_data": "HTTP/2 ping limits are not configurable; remove it",
    "grpc_http2_max_ping_strikes": "HTTP/2 ping limits are not configurable; remove it",
    "sagemaker_port": "there is no SageMaker endpoint; remove it",
    "sagemaker_safe_port_range": "there is no SageMaker endpoint; remove it",
    "sagemaker_thread_count": "there is no SageMaker endpoint; remove it",
    "vertex_ai_thread_count": "the Vertex AI endpoint runs on one event loop; remove it",
    "metrics_config": "Triton's metrics settings are not passed on; remove it",
    "trace_config": "for OpenTelemetry spans use embedtriton.Server(ServerConfig(tracing=embedtriton.Tracing(...)))",
    "buffer_manager_thread_count": "in-process tensors need no copy threads; remove it",
}
_REFUSED_TRUE = {
    "allow_sagemaker": "there is no SageMaker endpoint",
    "allow_gpu_metrics": "GPU metrics are not collected",
}


@dataclasses.dataclass
class Plan:
    """What a TritonConfig asks of embedtriton: the server's config and the endpoints to serve
    (``None``: off)."""

    server: ServerConfig
    http: str | None
    grpc: dict[str, Any] | None  # serve_grpc keywords
    metrics: str | None
    http_settings: dict[str, Any] = dataclasses.field(default_factory=dict)  # serve_http keywords
    vertex_ai: dict[str, Any] | None = None  # serve_vertex_ai keywords (its routes come from AIP_* at run time)


def plan(
    config: TritonConfig, security: TritonSecurityConfig | None = None, environ: Mapping[str, str] | None = None
) -> Plan:
    """Translate ``config`` (and ``security``, whose restriction replaces the config's restricted
    APIs on both endpoints, as in PyTriton); refuse what embedtriton cannot honour, saying what to do.

    ``environ`` (``os.environ``) is read as tritonserver reads it for Vertex AI: with
    ``AIP_MODE=PREDICTION`` the Vertex AI endpoint is on and HTTP and gRPC are off unless the
    config says otherwise; the Vertex AI port defaults to ``AIP_HTTP_PORT``, else 8080."""
    environ = os.environ if environ is None else environ
    for name, why in _REFUSED.items():
        if getattr(config, name) is not None:
            raise PyTritonValidationError(f"TritonConfig.{name} is not supported by embedtriton: {why}")
    for name, why in _REFUSED_TRUE.items():
        if getattr(config, name):
            raise PyTritonValidationError(f"TritonConfig.{name}=True is not supported by embedtriton: {why}; remove it")
    server: dict[str, Any] = {}
    for name in (
        "id",
        "log_verbose",
        "exit_timeout_secs",
        "strict_readiness",
        "metrics_interval_ms",
        "cache_directory",
    ):
        if getattr(config, name) is not None:
            server[name] = getattr(config, name)
    if config.log_file is not None:
        server["log_file"] = str(config.log_file)
        server["log_info"] = server["log_warning"] = True  # tritonserver logs info and warnings
    if config.cache_config is not None:
        server["cache_config"] = list(config.cache_config)
    # PyTriton runs tritonserver with --model-control-mode=explicit --load-model=*: clients may load
    # and unload models (its default security config guards model-repository with its token), and
    # every model of a model_repository loads at start (Triton.run loads them)
    server["model_control_mode"] = "explicit"
    if config.model_repository is not None:
        server["model_repository"] = [str(config.model_repository)]
    metrics_on = config.allow_metrics is not False
    server["metrics"] = metrics_on
    if config.allow_cpu_metrics is not None:
        server["cpu_metrics"] = config.allow_cpu_metrics
    prediction = environ.get("AIP_MODE", "") == "PREDICTION"
    vertex_on = config.allow_vertex_ai if config.allow_vertex_ai is not None else prediction
    http_host = config.http_address or DEFAULT_ADDRESS
    http_on = config.allow_http if config.allow_http is not None else not prediction
    http = _address(http_host, config.http_port, "http") if http_on else None
    http_restricted, grpc_restricted = _restrictions(config, security)
    http_settings: dict[str, Any] = {}
    if http_restricted:
        http_settings["restricted_api"] = http_restricted
    if config.http_header_forward_pattern is not None:
        http_settings["header_forward_pattern"] = config.http_header_forward_pattern
    grpc: dict[str, Any] | None = None
    if config.allow_grpc if config.allow_grpc is not None else not prediction:
        grpc = {"address": _address(config.grpc_address or DEFAULT_ADDRESS, config.grpc_port, "grpc")}
        if grpc_restricted:
            grpc["restricted_protocol"] = grpc_restricted
        if config.grpc_header_forward_pattern is not None:
            grpc["header_forward_pattern"] = config.grpc_header_forward_pattern
        if config.grpc_infer_response_compression_level is not None:
            grpc["infer_response_compression_level"] = config.grpc_infer_response_compression_level
        if config.grpc_use_ssl or config.grpc_use_ssl_mutual:
            if config.grpc_server_cert is None or config.grpc_server_key is None:
                raise PyTritonValidationError("grpc_use_ssl needs grpc_server_cert and grpc_server_key (PEM files)")
            grpc["tls_cert"], grpc["tls_key"] = str(config.grpc_server_cert), str(config.grpc_server_key)
            if config.grpc_use_ssl_mutual:
                if config.grpc_root_cert is None:
                    raise PyTritonValidationError("grpc_use_ssl_mutual needs grpc_root_cert (the clients' CA, PEM)")
                grpc["tls_client_ca"] = str(config.grpc_root_cert)
    metrics = None
    if metrics_on:
        metrics = _address(config.metrics_address or http_host, config.metrics_port, "metrics")
    vertex_ai = None
    if vertex_on:
        port = config.vertex_ai_port
        if port is None:
            port = _convert("vertex_ai_port", "int", environ.get("AIP_HTTP_PORT") or str(DEFAULT_PORTS["vertex_ai"]))
        vertex_ai = {
            "address": _address(DEFAULT_ADDRESS, port, "vertex_ai"),
            "default_model": config.vertex_ai_default_model,
        }
    try:
        server_config = ServerConfig(**server)
        server_config.validate()
    except Exception as exc:  # InvalidArgumentError: say it in TritonConfig's terms
        raise PyTritonValidationError(f"TritonConfig: {exc}") from None
    return Plan(server_config, http, grpc, metrics, http_settings, vertex_ai)


def _restrictions(config: TritonConfig, security: TritonSecurityConfig | None) -> tuple[tuple[str, ...], ...]:
    """The HTTP and gRPC restriction specs, checked now (Triton would refuse them at start)."""
    http, grpc = config.http_restricted_api, config.grpc_restricted_protocol
    restriction = security.restriction() if security is not None else None
    if restriction is not None:  # PyTriton sets both options to it, over the config's own
        if http is not None or grpc is not None:
            log.warning(
                "TritonConfig's http_restricted_api / grpc_restricted_protocol are replaced by the security "
                "config's restriction, as in PyTriton; to keep them, pass "
                "Triton(security_config=TritonSecurityConfig(restricted_endpoints=[]))"
            )
        http = grpc = restriction
    try:
        http_specs = specs(http, "TritonConfig.http_restricted_api")
        grpc_specs = specs(grpc, "TritonConfig.grpc_restricted_protocol")
        RestrictedApis(http_specs, option="http-restricted-api", noun="api")
        RestrictedApis(grpc_specs, option="grpc-restricted-protocol", noun="protocol", header_prefix=GRPC_HEADER_PREFIX)
        forward_pattern(config.http_header_forward_pattern, "TritonConfig.http_header_forward_pattern")
        forward_pattern(config.grpc_header_forward_pattern, "TritonConfig.grpc_header_forward_pattern")
    except Exception as exc:  # InvalidArgumentError: say it in TritonConfig's terms
        raise PyTritonValidationError(f"TritonConfig: {exc}") from None
    return http_specs, grpc_specs


def _address(host: str, port: int | None, kind: str) -> str:
    port = DEFAULT_PORTS[kind] if port is None else port
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise PyTritonValidationError(
            f"TritonConfig.{kind}_port must be a port number (0 picks a free one), not {port!r}"
        )
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
