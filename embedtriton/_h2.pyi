"""Types of embedtriton._h2, the gRPC-over-HTTP/2 server transport on libnghttp2, and the REST
endpoint's HTTP/1.1 server (C: embedtriton/native/_h2/)."""

from collections.abc import Callable, Sequence
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
    evicted: int
    written_now: int  # answers in C written by the thread that made them, the IO thread asleep
    incoming_bytes: int  # (gauge) bytes of incomplete request messages held, across connections
    budget_refusals: int  # calls failed (RESOURCE_EXHAUSTED) for max_incoming_bytes

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
        max_buffered_bytes: int = 67108864,  # per connection: replies queued, request messages arriving
        max_incoming_bytes: int = 536870912,  # request messages arriving on all connections together
    ) -> None: ...
    def stop(self, grace: float = 0, /) -> None:
        """Stop accepting, let calls finish for up to grace seconds, cancel the rest, join the IO thread."""
    def stats(self) -> _Stats:
        """Counters: connections (open now), accepted, refused (over max_connections or out of file
        descriptors), emfile, idle_closed, handshake_timeouts, buffer_resets, budget_refusals; the
        gauge incoming_bytes."""

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

def _stop_all_http() -> None:
    """Stop every running HttpServer (registered with atexit)."""

class _HttpStats(TypedDict):
    connections: int
    accepted: int
    refused: int
    emfile: int
    evicted: int
    idle_closed: int
    requests: int
    request_timeouts: int
    paused: int
    paused_now: int
    held_bytes: int
    buffered_bytes: int
    written_now: int  # answers in C the thread that made them began to write
    incoming_bytes: int  # (gauge) what counts against max_buffered_bytes: held_bytes and grown input buffers
    budget_refusals: int  # requests refused (503) for max_buffered_bytes

# on_request(call, method, url, headers (lower-cased names: first value), body, names as sent or None)
_OnRequest: TypeAlias = Callable[
    [HttpCall, str, str, dict[bytes, bytes], bytes, list[tuple[str, bytes]] | None], object
]
# on_refused(call, status, message, url): a request refused before its route; the connection then closes
_OnRefused: TypeAlias = Callable[[HttpCall, int, str, bytes], object]

@final
class HttpServer:
    """HTTP/1.1 on one IO thread, which starts serving when the HttpServer is made; it calls
    on_request / on_refused on that thread, with the GIL, for each request."""

    @property
    def port(self) -> int:
        """The bound port."""
    def __init__(
        self,
        host: str,
        port: int,
        on_request: _OnRequest,
        on_refused: _OnRefused,
        *,
        max_connections: int = 1024,
        max_body_bytes: int = 67108864,
        max_header_bytes: int = 16384,
        idle_timeout: float = 300.0,
        request_timeout: float = 30.0,
        tls: _Tls | None = None,
        libpath: str | None = None,
        names: bool = False,
        max_buffered_bytes: int = 536870912,  # request bytes held across connections (else 503)
    ) -> None: ...
    def stop(self, grace: float = 0, /) -> None:
        """Stop accepting, let requests in progress finish for up to grace seconds, close every
        connection, join the IO thread."""
    def stats(self) -> _HttpStats:
        """Counters, and gauges: paused_now, held_bytes, buffered_bytes, incoming_bytes."""
    def set_fast(self, handler: Any, ctx: Any, /) -> None:
        """A C handler (``_native._HTTP_FAST``) tried, with ``ctx``, before on_request for each POST
        to /v2/models/ that asks for no compression; ``set_fast(None, None)`` removes it."""

@final
class HttpCall:
    """One request of an HttpServer; its answer is given from any thread, once."""

    @property
    def open(self) -> bool:
        """The request's connection is still open."""
    @property
    def on_gone(self) -> Callable[[], object] | None:
        """Called once, with no arguments, on the server's IO thread if the request's client leaves
        (closes, resets or shuts its sending side) before its answer is complete: the work for it
        should stop. Setting it on a request whose client already left calls it at once."""
    @on_gone.setter
    def on_gone(self, fn: Callable[[], object] | None) -> None: ...
    def respond(self, status: int, fields: Sequence[tuple[str, str]], parts: Sequence[Buffer], /) -> bool:
        """The whole answer (Content-Length, and Connection: close when the connection ends with it
        are added); False if the request is over."""
    def begin(self, status: int, fields: Sequence[tuple[str, str]], /) -> bool:
        """Start a chunked answer."""
    def send(self, data: Buffer, /) -> bool:
        """One chunk; False if the request is over."""
    def end(self) -> bool:
        """The last chunk."""
    def writable(self) -> bool:
        """The connection is open and its client reads its answers (under the high-water mark)."""
    def abort(self) -> None:
        """Close the request's connection now."""
