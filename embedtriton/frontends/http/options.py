"""Settings of the HTTP/REST endpoint."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InvalidArgumentError
from ..grpc.options import normalize_address


@dataclass(frozen=True)
class HttpOptions:
    """Settings of the HTTP/REST endpoint (``Server.serve_http(options=...)``)."""

    address: str | int = "127.0.0.1:8000"
    max_body_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_connections: int = 1024  # more are closed at once
    idle_timeout_s: float = 300.0  # a connection idle this long is closed
    request_timeout_s: float = 30.0  # a request begun must arrive whole within this (else 408)
    shared_memory: bool = True  # clients may register system shared-memory regions

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", normalize_address(self.address, "HTTP"))
        for name in ("max_body_bytes", "max_header_bytes", "max_connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidArgumentError(f"HttpOptions.{name} must be a positive integer, not {value!r}")
        for name in ("idle_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise InvalidArgumentError(f"HttpOptions.{name} must be a positive number of seconds, not {value!r}")
