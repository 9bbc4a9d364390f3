"""Settings of the HTTP/REST endpoint."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from ...errors import InvalidArgumentError
from ..grpc.options import normalize_address


@dataclass(frozen=True)
class HttpOptions:
    """Settings of the HTTP/REST endpoint (``Server.serve_http(options=...)``).

    ``max_body_bytes`` and ``max_header_bytes`` bound what a request may carry (413 / 431);
    ``max_connections``, ``idle_timeout_s`` and ``request_timeout_s`` bound what a client may
    hold (a request not whole in time gets 408). ``tls_cert``/``tls_key`` (PEM files) serve
    HTTPS; ``tls_client_ca`` also requires client certificates signed by that CA.
    """

    address: str | int = "127.0.0.1:8000"
    max_body_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_connections: int = 1024  # more are closed at once
    idle_timeout_s: float = 300.0  # a connection idle this long is closed
    request_timeout_s: float = 30.0  # a request begun must arrive whole within this (else 408)
    shared_memory: bool = True  # clients may register system shared-memory regions
    tls_cert: str | None = None  # PEM files: serve HTTPS
    tls_key: str | None = None
    tls_client_ca: str | None = None  # also require client certificates signed by this CA

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", normalize_address(self.address, "HTTP"))
        for name in ("max_body_bytes", "max_header_bytes", "max_connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidArgumentError(f"HttpOptions.{name} must be a positive integer, not {value!r}")
        if bool(self.tls_cert) != bool(self.tls_key) or (self.tls_client_ca and not self.tls_cert):
            raise InvalidArgumentError(
                "HTTPS needs both tls_cert and tls_key (PEM files); tls_client_ca needs them too"
            )
        for name in ("idle_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise InvalidArgumentError(f"HttpOptions.{name} must be a positive number of seconds, not {value!r}")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context, or None for plain HTTP."""
        if not (self.tls_cert and self.tls_key):
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.tls_cert, self.tls_key)
            if self.tls_client_ca:
                context.load_verify_locations(self.tls_client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise InvalidArgumentError(f"cannot load the TLS files: {exc}") from None
        return context
