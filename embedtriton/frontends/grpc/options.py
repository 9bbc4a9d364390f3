"""The gRPC endpoint's options (no grpcio import: these are public names of ``embedtriton``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidArgumentError
from ..security import GRPC_HEADER_PREFIX, RestrictedApis, forward_pattern, specs

# Triton's --grpc-infer-response-compression-level values, as grpc-core numbers them (grpc_compression_level).
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}


@dataclass(frozen=True)
class GrpcLimits:
    """What one gRPC client may cost the endpoint (native transport; see README "Security").

    ``max_connections``: open connections, lowered to fit the process's descriptor limit
    (``min(max_connections, (limit - descriptors open - 64) // 2)``; the soft limit is raised to
    the hard one first). At the cap, or out of descriptors, an idle connection (no call open) gets
    GOAWAY and is closed to admit the new one: one that has not finished its preface first, then
    the longest idle; when every connection has a call open, the new one is closed at once.
    ``idle_timeout_s``: a connection with no call and nothing received for this long is closed
    (GOAWAY).
    ``handshake_timeout_s``: the TLS handshake and HTTP/2 preface must be done within it.
    ``max_header_list_bytes``: request headers (metadata) per call, counted as HTTP/2 does;
    beyond, the call fails with RESOURCE_EXHAUSTED. ``max_buffered_bytes``, per connection: replies
    queued for a client that does not read them (beyond, its call is reset, RESOURCE_EXHAUSTED, and
    its requests cancelled) and request messages still arriving (memory follows the bytes received,
    never a declared length; beyond, the call fails with RESOURCE_EXHAUSTED); at least one message
    of ``max_message_bytes`` always fits. It bounds one connection: the bound on the request
    messages arriving on all connections together is ``GrpcOptions.max_buffered_bytes``. The
    grpcio transport takes ``max_connections`` (it refuses connections over the cap, closing
    none), ``idle_timeout_s`` and ``handshake_timeout_s``.
    """

    max_connections: int = 1024
    idle_timeout_s: float = 300.0
    handshake_timeout_s: float = 10.0
    max_header_list_bytes: int = 16 * 1024
    max_buffered_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_header_list_bytes", "max_buffered_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidArgumentError(f"GrpcLimits.{name} must be a positive integer, not {value!r}")
        for name in ("idle_timeout_s", "handshake_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise InvalidArgumentError(f"GrpcLimits.{name} must be a positive number of seconds, not {value!r}")

    def transport_options(self) -> dict[str, Any]:
        """The keyword arguments of the native transport (``embedtriton._h2.Server``)."""
        return {
            "max_connections": self.max_connections,
            "idle_timeout": float(self.idle_timeout_s),
            "handshake_timeout": float(self.handshake_timeout_s),
            "max_header_list_bytes": self.max_header_list_bytes,
            "max_buffered_bytes": self.max_buffered_bytes,
        }


@dataclass(frozen=True)
class GrpcOptions:
    """Settings of a KServe-v2 gRPC endpoint (``Server.serve_grpc(options=...)``).

    ``address``: ``"host:port"``, ``":port"`` or an int port (the host is 127.0.0.1 unless told
    otherwise; ``"0.0.0.0:port"`` serves every interface; port 0 picks a free one).
    ``max_message_bytes`` caps request and response messages. ``tls_cert``/``tls_key`` (PEM
    files) turn on TLS; ``tls_client_ca`` also requires clients to present a certificate
    signed by that CA. ``transport``: ``"native"`` (embedtriton's HTTP/2 server on libnghttp2,
    the fast one) or ``"grpcio"`` (grpcio's asyncio server). ``limits``: what one client may
    cost (:class:`GrpcLimits`; native transport). ``shared_memory=False`` refuses
    SystemSharedMemoryRegister and CudaSharedMemoryRegister: shared memory is for same-host
    clients trusted with the server's ``/dev/shm`` objects and GPU memory they share.

    ``max_buffered_bytes`` (native transport): the budget of incoming request bytes across all
    connections, the request messages still arriving on every call of every client together
    (memory follows the bytes received, never a declared length). The call whose message would
    take it over fails with RESOURCE_EXHAUSTED ("the server holds more than N bytes of incoming
    request messages (max_buffered_bytes); retry later") and the rest of its message is skipped;
    messages already received are served. Not to be confused with ``GrpcLimits.max_buffered_bytes``,
    which bounds each connection alone (replies queued for it, and its request messages arriving).

    Compressed requests (gzip, deflate: ``compression_algorithm=`` in tritonclient) are accepted
    on both transports. ``infer_response_compression_level`` (Triton's
    ``--grpc-infer-response-compression-level``): ``"none"``, ``"low"``, ``"medium"`` or
    ``"high"``; compresses ModelInfer and ModelStreamInfer responses with the algorithm
    grpc-core picks for that level among those the client accepts (its
    ``grpc-accept-encoding``): gzip for low, deflate for medium and high when it accepts both,
    none when it accepts neither. On the grpcio transport grpc-core applies the level itself, to
    the responses of every method, as it hides the client's list from the application.

    ``restricted_protocol`` (Triton's ``--grpc-restricted-protocol``): specs
    ``"<group>,<group>,...:<header>=<value>"`` (one string or a list; each group in one spec
    only). A call to a method of a restricted group must carry the metadata
    ``triton-grpc-protocol-<header>: <value>`` (Triton's prefix), else it is refused with
    UNAVAILABLE "This protocol is restricted, expecting header 'triton-grpc-protocol-<header>'"
    and nothing runs. Groups: health, metadata, inference, shared-memory, model-config,
    model-repository, statistics, trace, logging. Kept out of ``repr`` (it holds secrets).
    ``header_forward_pattern`` (``--grpc-header-forward-pattern``): a regular expression searched,
    ignoring case, in each metadata key of ModelInfer and ModelStreamInfer calls; the entries it
    finds reach the model as string request parameters (``request.parameters[key]``).
    """

    address: str | int = "127.0.0.1:8001"
    max_message_bytes: int = 64 * 1024 * 1024
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    transport: str = "native"
    limits: GrpcLimits = field(default_factory=GrpcLimits)
    shared_memory: bool = True
    infer_response_compression_level: str = "none"
    restricted_protocol: str | Sequence[str] = field(default=(), repr=False)
    header_forward_pattern: str | None = None
    max_buffered_bytes: int = 512 * 1024 * 1024  # request bytes arriving, across connections
    restrictions: RestrictedApis = field(init=False, repr=False, compare=False)
    forward: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", normalize_address(self.address, "gRPC"))
        restricted = specs(self.restricted_protocol, "restricted_protocol")
        object.__setattr__(self, "restricted_protocol", restricted)
        object.__setattr__(
            self,
            "restrictions",
            RestrictedApis(
                restricted, option="grpc-restricted-protocol", noun="protocol", header_prefix=GRPC_HEADER_PREFIX
            ),
        )
        object.__setattr__(self, "forward", forward_pattern(self.header_forward_pattern, "header_forward_pattern"))
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InvalidArgumentError("TLS needs both tls_cert and tls_key (PEM files)")
        if self.tls_client_ca and not self.tls_cert:
            raise InvalidArgumentError("tls_client_ca (client-certificate verification) needs tls_cert and tls_key")
        size = self.max_message_bytes
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise InvalidArgumentError(f"max_message_bytes must be > 0, not {self.max_message_bytes}")
        budget = self.max_buffered_bytes
        if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
            raise InvalidArgumentError(f"GrpcOptions.max_buffered_bytes must be a positive integer, not {budget!r}")
        if self.transport not in ("native", "grpcio"):
            raise InvalidArgumentError(f"transport must be 'native' or 'grpcio', not {self.transport!r}")
        level = self.infer_response_compression_level
        if not isinstance(level, str) or level not in COMPRESSION_LEVELS:
            raise InvalidArgumentError(
                f"infer_response_compression_level must be 'none', 'low', 'medium' or 'high', not {level!r}"
            )
        if not isinstance(self.limits, GrpcLimits):
            raise InvalidArgumentError(f"limits must be a GrpcLimits, not {type(self.limits).__name__}")

    @property
    def tls(self) -> tuple[str, str, str | None] | None:
        """(certificate, key, client CA) when TLS is on."""
        return (self.tls_cert, self.tls_key, self.tls_client_ca) if self.tls_cert and self.tls_key else None


def normalize_address(address: str | int, what: str) -> str:
    """``"host:port"`` from an address a user gives: an int port or ``":port"`` means 127.0.0.1,
    like every default here (serving every interface must be asked for, e.g. ``"0.0.0.0:8001"``)."""
    if isinstance(address, int) and not isinstance(address, bool):
        host, port = "127.0.0.1", str(address)
    elif isinstance(address, str):
        host, _, port = address.rpartition(":")
        host = host or "127.0.0.1"
    else:
        raise InvalidArgumentError(f"{what} address must be 'host:port' or an int port, not {address!r}")
    if not port.isdigit() or int(port) > 65535 or not host.strip("[]"):
        raise InvalidArgumentError(
            f"{what} address must look like host:port (e.g. '127.0.0.1:8001', ':8001' or 8001), not {address!r}"
        )
    return f"{host}:{int(port)}"
