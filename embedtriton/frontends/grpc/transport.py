"""The transport interface the gRPC service is written against, gRPC status codes, and the
grpcio adapter (the native transport, ``embedtriton._h2``, implements the same interface in C).

A transport calls a :class:`Handler` with ``on_message(call, bytes)``, ``on_half_close(call)``
and ``on_cancel(call)``; a :class:`Call` has ``method``, ``metadata``, ``peer``, a free
``user`` slot, ``send(bytes)``, ``finish(code, message)`` and ``set_compression(algorithm)``.
Both transports hand the handler request messages decompressed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import grpc

from ...errors import InvalidArgumentError
from ..statuses import statuses_of

log = logging.getLogger("embedtriton")

# gRPC status codes
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS = 0, 1, 2, 3, 5, 6
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14


def code_of(error: BaseException) -> int:
    """The gRPC status code of an error (frontends/statuses.py)."""
    return statuses_of(error).grpc


class Call(Protocol):
    """One RPC as a transport presents it."""

    @property
    def method(self) -> str: ...  # "/package.Service/Method"
    @property
    def metadata(self) -> list[tuple[str, str]]: ...
    @property
    def peer(self) -> str: ...

    user: Any  # the handler's own state for this call

    # (the native transport's send and finish answer whether the call was still open)
    def send(self, data: bytes, /) -> object: ...
    def finish(self, code: int, message: str = "") -> object: ...
    def set_compression(self, algorithm: str, /) -> None:
        """Compress the response messages: "identity", "deflate" or "gzip"; before the first send()."""


def response_compression(level: str, metadata: list[tuple[str, str]]) -> str:
    """The algorithm grpc-core compresses a server's responses with at a compression level
    (Triton's --grpc-infer-response-compression-level): of gzip and deflate, in that order, those
    the client lists in its grpc-accept-encoding; "low" takes the first, "medium" the middle one,
    "high" the last; "identity" for "none", or when the client accepts neither."""
    accepted: set[str] = set()
    for key, value in metadata:
        if key == "grpc-accept-encoding":
            accepted.update(name.strip() for name in value.split(","))
    algorithms = [name for name in ("gzip", "deflate") if name in accepted]
    if level == "none" or not algorithms:
        return "identity"
    return algorithms[{"low": 0, "medium": len(algorithms) // 2, "high": -1}[level]]


class Handler(Protocol):
    """What a transport calls, on its own thread, for each call."""

    def on_message(self, call: Call, data: bytes) -> None: ...
    def on_half_close(self, call: Call) -> None: ...
    def on_cancel(self, call: Call) -> None: ...


class _GrpcioCall:
    """The transport interface's call, over one grpcio asyncio RPC."""

    __slots__ = ("method", "metadata", "peer", "user", "_context", "_loop", "_queue", "_finished")

    def __init__(self, method: str, context: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.method = method
        self.metadata = [(m.key, m.value) for m in context.invocation_metadata() or ()]
        self.peer = context.peer()
        self.user: Any = None
        self._context = context
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._finished = False

    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the endpoint stopped
            pass

    def send(self, data: bytes) -> None:
        if not self._finished:
            self._put(data)

    def finish(self, code: int, message: str = "") -> None:
        if not self._finished:
            self._finished = True
            self._put((code, message))

    def set_compression(self, algorithm: str) -> None:
        compression = _COMPRESSION.get(algorithm)
        if compression is None:
            raise ValueError(f"compression must be 'identity', 'deflate' or 'gzip', not {algorithm!r}")
        try:  # on the loop, before the send()s that follow (call_soon_threadsafe keeps their order)
            self._loop.call_soon_threadsafe(self._context.set_compression, compression)
        except RuntimeError:  # the loop is closed: the endpoint stopped
            pass


_COMPRESSION = {
    "identity": grpc.Compression.NoCompression,
    "deflate": grpc.Compression.Deflate,
    "gzip": grpc.Compression.Gzip,
}

_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class GrpcioHandler(grpc.GenericRpcHandler):
    """Every method as a raw-bytes stream-stream handler (on the wire unary and streaming
    calls look the same), fed to a :class:`Handler`."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method
        svc = self._handler

        async def behaviour(requests: Any, context: Any) -> Any:
            call = _GrpcioCall(method, context, asyncio.get_running_loop())

            async def pump() -> None:
                try:
                    async for data in requests:
                        svc.on_message(call, data)
                    svc.on_half_close(call)
                except Exception as exc:  # a bug of ours: fail this call, keep serving
                    # (not when the call already ended, e.g. aborted at stop: reading it fails then)
                    if not isinstance(exc, asyncio.CancelledError) and not context.done():
                        log.exception("gRPC %s failed", method)
                        call.finish(INTERNAL, f"{type(exc).__name__}: {exc}")

            reader = asyncio.ensure_future(pump())
            done = False
            try:
                while True:
                    item = await call._queue.get()
                    if isinstance(item, tuple):
                        done = True
                        code, message = item
                        if code != OK:
                            await context.abort(_STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN), message)
                        return
                    yield item
            finally:
                if not done:
                    call._finished = True
                    svc.on_cancel(call)
                reader.cancel()

        return grpc.stream_stream_rpc_method_handler(behaviour)


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read the TLS {what} '{path}': {exc.strerror}") from None


def grpcio_credentials(tls: tuple[str, str, str | None]) -> Any:
    """Server TLS credentials; with a client CA, clients must present a certificate it signed."""
    cert, key, client_ca = tls
    return grpc.ssl_server_credentials(
        [(_read(key, "private key"), _read(cert, "certificate"))],
        root_certificates=_read(client_ca, "client CA") if client_ca else None,
        require_client_auth=bool(client_ca),
    )
