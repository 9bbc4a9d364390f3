"""Settings of the HTTP/REST endpoint."""

from __future__ import annotations

import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import InvalidArgumentError
from ..grpc.options import normalize_address
from ..security import HTTP_GROUPS, RestrictedApis, forward_pattern, specs


@dataclass(frozen=True)
class HttpOptions:
    """Settings of the HTTP/REST endpoint (``Server.serve_http(options=...)``).

    ``max_body_bytes`` and ``max_header_bytes`` bound what a request may carry (413 / 431).
    ``max_header_bytes`` counts the URL and the header names and values (without the whitespace
    around them); the head as received (request line and header lines with their whitespace and
    line ends) may take at most ``max_header_bytes + 4 * min(max_header_bytes, 4096) + 512``
    bytes, checked as it arrives, else 431 too: room for the framing of every head within
    ``max_header_bytes`` (a method up to 498 bytes, ``" HTTP/1.1"``, ``": "`` and CRLF per field,
    at most 4096 fields), not for lines padded with spaces.
    ``max_buffered_bytes`` bounds the request bytes the endpoint holds across all its connections
    (what it received and has not handed to the route yet: bodies arriving beyond a first 64 KiB
    read buffer per connection, requests read and waiting; memory follows the bytes received,
    never a declared Content-Length). The request that would take it over gets 503
    (``{"error": "the server holds more than N bytes of incoming requests (max_buffered_bytes);
    retry later"}``) after the answers to the requests before it on its connection, which then
    closes; what it sent is freed at once, requests already handed over are answered. A body
    counts up to twice its size while it arrives (its buffer doubles as it grows): keep
    ``max_buffered_bytes`` above twice ``max_body_bytes``.
    ``max_connections``, ``idle_timeout_s`` and ``request_timeout_s`` bound what a client may
    hold (a request not whole in time gets 408; a ``/generate_stream`` or OpenAI stream whose
    client reads nothing that long is closed and its request cancelled). ``max_connections`` is
    lowered to fit the process's descriptor limit (``min(max_connections, (limit - descriptors
    open - 64) // 2)``; the soft limit is raised to the hard one first); at the cap, or out of
    descriptors, an idle connection (no request arriving, queued or being answered) is closed to
    admit the new one, one that never sent anything first, then the longest idle; the new one is
    refused only when every connection has a request in flight. ``tls_cert``/``tls_key`` (PEM
    files) serve HTTPS; ``tls_client_ca`` also requires client certificates signed by that CA.

    ``restricted_api`` (Triton's ``--http-restricted-api``): specs
    ``"<group>,<group>,...:<header>=<value>"`` (one string or a list; each group in one spec
    only). A request to a route of a restricted group must carry the header (any case) with that
    value, else it gets 403 ``{"error": "This API is restricted, expecting header '<header>'"}``
    and nothing runs. Groups: health, metadata, inference (``/infer``, ``/generate``,
    ``/generate_stream``), shared-memory, model-config, model-repository, statistics, trace,
    logging, and ours, openai (the ``/v1/`` routes); ``/metrics`` belongs to none, as in Triton. Kept out of ``repr`` (it holds secrets).
    ``header_forward_pattern`` (``--http-header-forward-pattern``): a regular expression searched,
    ignoring case, in each header name of an ``/infer`` request; the headers it finds reach the
    model as string request parameters under their names as sent (``request.parameters[name]``).

    ``openai``: also answer OpenAI's routes (``/v1/models``, ``/v1/chat/completions``,
    ``/v1/completions``, ``/v1/embeddings``) for the models bound with ``embedtriton.openai``;
    ``openai_api_key``: those routes then need the header ``Authorization: Bearer <key>`` (else
    401). Kept out of ``repr``.
    """

    address: str | int = "127.0.0.1:8000"
    max_body_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_connections: int = 1024  # at the cap, an idle connection makes room
    idle_timeout_s: float = 300.0  # a connection idle this long is closed
    request_timeout_s: float = 30.0  # a request begun must arrive whole within this (else 408)
    shared_memory: bool = True  # clients may register system and CUDA shared-memory regions
    tls_cert: str | None = None  # PEM files: serve HTTPS
    tls_key: str | None = None
    tls_client_ca: str | None = None  # also require client certificates signed by this CA
    restricted_api: str | Sequence[str] = field(default=(), repr=False)
    header_forward_pattern: str | None = None
    openai: bool = False  # also answer OpenAI's routes under /v1/ (docs/openai.md)
    openai_api_key: str | None = field(default=None, repr=False)  # those routes then need "Bearer <key>"
    max_buffered_bytes: int = 512 * 1024 * 1024  # request bytes held across connections (else 503)
    restrictions: RestrictedApis = field(init=False, repr=False, compare=False)
    forward: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", normalize_address(self.address, "HTTP"))
        restricted = specs(self.restricted_api, "restricted_api")
        object.__setattr__(self, "restricted_api", restricted)
        object.__setattr__(
            self,
            "restrictions",
            RestrictedApis(restricted, option="http-restricted-api", noun="api", extra_groups=HTTP_GROUPS),
        )
        object.__setattr__(self, "forward", forward_pattern(self.header_forward_pattern, "header_forward_pattern"))
        for name in ("max_body_bytes", "max_header_bytes", "max_buffered_bytes", "max_connections"):
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
        if not isinstance(self.openai, bool):
            raise InvalidArgumentError(f"HttpOptions.openai must be True or False, not {self.openai!r}")
        if self.openai_api_key is not None and (not isinstance(self.openai_api_key, str) or not self.openai_api_key):
            raise InvalidArgumentError("HttpOptions.openai_api_key must be a non-empty string (or None for no key)")

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
