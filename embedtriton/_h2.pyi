"""Types of embedtriton._h2, the gRPC-over-HTTP/2 server transport on libnghttp2 (C:
embedtriton/native/_h2/)."""

from typing import Any, Protocol, TypeAlias, TypedDict, final

from _typeshed import StrOrBytesPath
from typing_extensions import Buffer, CapsuleType

class _Handler(Protocol):
    """What Server calls on its IO thread, with the GIL, for each event of a call."""

    def on_message(self, call: Call, data: bytes, /) -> object: ...
    def on_half_close(self, call: Call, /) -> object: ...
    def on_cancel(self, call: Call, /) -> object: ...

# (certificate chain file, private key file[, client CA file: clients must present a certificate])
_Tls: TypeAlias = tuple[StrOrBytesPath, StrOrBytesPath] | tuple[StrOrBytesPath, StrOrBytesPath, StrOrBytesPath | None]

class _LibraryInfo(TypedDict):
    path: str
    version: str
    reset_rate_limit: bool
    max_continuations: bool

class _Stats(TypedDict):
    connections: int
    accepted: int
    refused: int
    emfile: int
    idle_closed: int
    handshake_timeouts: int
    buffer_resets: int

@final
class Server:
    """gRPC over HTTP/2 on one IO thread, which starts serving when the Server is made."""

    @property
    def port(self) -> int:
        """The bound port."""
    def __init__(
        self,
        host: str,
        port: int,
        handler: _Handler,
        max_message_bytes: int,
        tls: _Tls | None = None,
        libpath: str | None = None,
        *,
        max_connections: int = 1024,
        idle_timeout: float = 300.0,
        handshake_timeout: float = 10.0,
        max_header_list_bytes: int = 16384,
        max_buffered_bytes: int = 67108864,
    ) -> None: ...
    def stop(self, grace: float = 0, /) -> None:
        """Stop accepting, let calls finish for up to grace seconds, cancel the rest, join the IO thread."""
    def stats(self) -> _Stats:
        """Counters: connections (open now), accepted, refused (over max_connections or out of file
        descriptors), emfile, idle_closed, handshake_timeouts, buffer_resets."""

@final
class Call:
    """One gRPC call (an HTTP/2 stream); made by the Server, handed to its handler."""

    @property
    def method(self) -> str:
        """The :path, e.g. "/inference.GRPCInferenceService/ModelInfer"."""
    @property
    def metadata(self) -> list[tuple[str, str]]:
        """Request headers other than pseudo-headers, in order."""
    @property
    def peer(self) -> str:
        """The client's address ("ipv4:1.2.3.4:5678", "ipv6:[::1]:5678")."""
    user: Any  # free slot for the handler's per-call state (None to start with; del sets None)
    def send(self, data: Buffer, /) -> bool:
        """Queue one response message (thread-safe); False if the call is over."""
    def finish(self, code: int, message: str | Buffer = "") -> bool:
        """End the call with a gRPC status (thread-safe); False if it is already over."""
    def set_compression(self, algorithm: str, /) -> None:
        """Compress the response messages ("identity", "deflate" or "gzip"; each is sent compressed when
        that makes it smaller): before the first send(), else RuntimeError."""

_REPLY: CapsuleType  # "embedtriton._h2._REPLY": the C interface _native answers calls through (h2_reply.h)

def library(libpath: str | None = None) -> _LibraryInfo:
    """The libnghttp2 in use (loaded now if no Server loaded it yet)."""

def _stop_all() -> None:
    """Stop every running server (registered with atexit)."""
