"""One HTTP/1.1 connection of the REST endpoint: ``httptools`` (llhttp) feeds the request
parts; complete requests are queued and answered in order (keep-alive and pipelining). Limits on
the client (body and header sizes, request and idle timeouts) are enforced as bytes arrive."""

from __future__ import annotations

import asyncio
import json
import math
import re
import zlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidArgumentError, NotFoundError, TritonError, UnavailableError, UnsupportedError


def httptools_module() -> Any:
    """The ``httptools`` module the endpoint parses requests with, or :class:`UnsupportedError`
    naming the extra that installs it (checked when the endpoint starts, before any port opens)."""
    try:
        import httptools
    except ImportError as exc:
        raise UnsupportedError(f'the HTTP endpoint needs httptools ({exc}): pip install "embedtriton[http]"') from None
    return httptools


# Triton's HTTP status for each error (http_server.cc HttpCodeFromError)
_STATUS = [(NotFoundError, 404), (UnavailableError, 503), (UnsupportedError, 501), (InvalidArgumentError, 400)]
_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
            413: "Payload Too Large", 415: "Unsupported Media Type", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable"}  # fmt: skip


def status_of(error: BaseException) -> int:
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    return 500 if isinstance(error, TritonError) and error.code == "INTERNAL" else 400


@dataclass
class Binary:
    """An answer with the binary tensor data extension: a JSON header, then raw tensor bytes."""

    header: dict[str, Any]
    blobs: list[bytes]


@dataclass
class EventStream:
    """An answer sent as Server-Sent Events (chunked): one ``data: {json}`` event per item.
    ``stall_timeout_s``: a client that reads nothing for this long (our buffer stays full) is
    disconnected, which closes the events (cancelling the request); None waits for it."""

    events: AsyncIterator[Any]
    stall_timeout_s: float | None = None


@dataclass
class Text:
    """An answer that is not JSON (Prometheus metrics)."""

    content_type: str
    body: bytes


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _accepted(header: bytes | None) -> str | None:
    """The compression an Accept-Encoding header asks for (gzip, then deflate), if any."""
    if not header:
        return None
    offered = {part.split(b";")[0].strip().lower() for part in header.split(b",")}
    return "gzip" if b"gzip" in offered else "deflate" if b"deflate" in offered else None


def encode(status: int, payload: Any, accept_encoding: bytes | None) -> tuple[list[tuple[str, str]], list[bytes]]:
    """An answer's header fields (but its length) and body parts: JSON; the binary tensor data
    extension's JSON header then the tensors' bytes; or text. As Triton: an inference answer is
    compressed when the client accepts gzip or deflate, errors and other answers are not."""
    if isinstance(payload, Text):
        return [("Content-Type", payload.content_type)], [payload.body]
    infer = status == 200 and (isinstance(payload, Binary) or (type(payload) is dict and "outputs" in payload))
    fields, blobs = [("Content-Type", "application/json")], []
    if isinstance(payload, Binary):
        payload, blobs = payload.header, payload.blobs
    body = b"" if payload is None else json.dumps(payload).encode()
    if blobs:
        fields = [("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", str(len(body)))]
    encoding = _accepted(accept_encoding) if infer else None
    if encoding is not None:
        packer = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
        return [*fields, ("Content-Encoding", encoding)], [packer.compress(b"".join([body, *blobs])) + packer.flush()]
    return fields, [body, *blobs]


def sse_event(event: Any) -> bytes:
    """One Server-Sent Event carrying ``event`` as JSON (``bytes``: as they are, e.g. ``[DONE]``)."""
    if isinstance(event, bytes):
        return b"data: " + event + b"\n\n"
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def decompress(encoding: bytes, body: bytes, limit: int) -> bytes:
    """A gzip / deflate request body (as tritonclient sends it), inflated to at most
    max_body_bytes: a small body that would inflate past the limit is refused (413) without
    inflating it all. Large bodies inflate off the loop."""
    name = encoding.strip().lower()
    if name in (b"identity", b""):
        return body
    if name not in (b"gzip", b"deflate"):
        raise Refused(415, f"Content-Encoding {name.decode('latin-1')!r}: only gzip and deflate are accepted")

    def inflate() -> bytes | None:
        inflater = zlib.decompressobj(wbits=47)  # zlib or gzip framing, by its header
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise Refused(400, f"the {name.decode()} request body does not inflate: {exc}") from None
        if len(out) > limit:
            return None
        if not inflater.eof:
            raise Refused(400, f"the {name.decode()} request body is truncated")
        return out

    out = inflate() if len(body) < 65536 else await asyncio.get_running_loop().run_in_executor(None, inflate)
    if out is None:
        raise Refused(413, f"request body inflates past the limit of {limit} bytes")
    return out


MAX_PIPELINED = 64  # requests of one connection waiting for their answers before it is read no further


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: httptools feeds the request parts; complete requests are
    queued and answered in order."""

    def __init__(self, endpoint: Any) -> None:
        self.endpoint = endpoint
        self.parser = endpoint.httptools.HttpRequestParser(self)
        self.parse_error = endpoint.httptools.HttpParserError
        # --http-header-forward-pattern, compiled (or None)
        self.forward: re.Pattern[str] | None = endpoint.options.forward
        self.forwarded: list[tuple[str, bytes]] | None = None  # the headers it found, names as sent
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.queue: deque[Any] = deque()  # complete requests (or why reading stopped), answered in order
        self.wakeup: asyncio.Future[None] | None = None  # the worker waits on it when the queue is empty
        self.worker: asyncio.Task[None] | None = None
        self.refused: Refused | None = None  # why the connection is refused (set in a callback)
        self.deadline = math.inf  # (loop time) see _arm; the endpoint's sweep calls _expired after it
        self.idle_since = math.inf  # (loop time) accepted, or its last answer sent: see idle()
        self.spoke = False  # it sent something (a client that sends nothing is the first closed to make room)
        self.in_request = False  # bytes of a request arrived, and not yet all of it
        self.busy = False  # answering a request
        self.reading_paused = False
        self.writable = asyncio.Event()  # the transport's buffer is under its high-water mark
        self.writable.set()

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.worker = asyncio.ensure_future(self._answer())
        self.endpoint.connections.add(self)  # the endpoint's Listener kept it within max_connections
        self.idle_since = self.endpoint.now()
        self._arm()

    def idle(self) -> bool:
        """Nothing in flight: no request arriving, queued or being answered, and the last answer
        all handed to the kernel (a keep-alive connection between requests, or one that sent
        nothing yet). Such a connection may be closed to admit a new one (``Listener.make_room``)."""
        transport = self.transport
        return (
            self.worker is not None
            and transport is not None
            and not (self.in_request or self.busy or self.queue or self.refused)
            and not transport.is_closing()
            and transport.get_write_buffer_size() == 0
        )

    def _arm(self) -> None:
        """(Re)start the clock: idle_timeout_s between requests, request_timeout_s within one
        (a deadline the endpoint's periodic sweep checks: no timer per request)."""
        options = self.endpoint.options
        delay = options.request_timeout_s if self.in_request else options.idle_timeout_s
        self.deadline = self.endpoint.now() + delay

    def _expired(self) -> None:
        self.deadline = math.inf
        if self.in_request and self.refused is None:  # stalled mid-request: answered after what came before
            self.refused = Refused(408, "the request did not arrive within request_timeout_s")
            self._put(self.refused)
        elif self.transport is not None and not self.queue and not self.busy:
            self.transport.close()  # idle
        else:
            self._arm()

    def _put(self, item: Any) -> None:
        self.queue.append(item)
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)
        if len(self.queue) >= MAX_PIPELINED:
            self._pause_reading()

    # Flow control: a client that pipelines more than MAX_PIPELINED requests, or does not read
    # its answers (our buffer passes its high-water mark), is not read from until it catches up.
    def _pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None and not self.transport.is_closing():
            self.reading_paused = True
            self.transport.pause_reading()

    def _maybe_resume_reading(self) -> None:
        if self.reading_paused and self.writable.is_set() and len(self.queue) < MAX_PIPELINED // 2:
            self.reading_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.spoke = True
        if self.refused is not None or self.worker is None:
            return  # the connection is being refused: nothing more is read
        try:
            self.parser.feed_data(data)
        except self.parse_error as exc:  # (our callbacks' refusals come wrapped in it)
            self.refused = self.refused or Refused(400, f"malformed HTTP request: {exc}")
            self._put(self.refused)

    def eof_received(self) -> bool:
        """The client finished sending: answer what it sent, then close."""
        self._put(None)
        return True  # keep the transport open for the answers

    def pause_writing(self) -> None:
        self.writable.clear()
        self._pause_reading()

    def resume_writing(self) -> None:
        self.writable.set()
        self._maybe_resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.endpoint.connections.discard(self)
        if self.worker is not None:
            self.worker.cancel()

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.headers, self.header_bytes, self.body, self.body_bytes = b"", {}, 0, [], 0
        self.forwarded = [] if self.forward is not None else None
        self.in_request = True  # it has request_timeout_s to arrive whole
        self._arm()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.setdefault(name.lower(), value)  # a name sent twice: its first value, as Triton reads it
        self._count(len(name) + len(value))
        if self.forwarded is not None and self.forward is not None and self.forward.search(name.decode("latin-1")):
            self.forwarded.append((name.decode("latin-1"), value))

    def on_headers_complete(self) -> None:
        length = self.headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.endpoint.options.max_body_bytes):
            self._refuse(413, f"request body over the limit of {self.endpoint.options.max_body_bytes} bytes")
        if self.headers.get(b"transfer-encoding") is not None:
            self._refuse(411, "a request body needs Content-Length (chunked transfer is not accepted)")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.endpoint.options.max_body_bytes:
            self._refuse(413, f"request body over the limit of {self.endpoint.options.max_body_bytes} bytes")
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_request = False
        self._arm()
        method = self.parser.get_method().decode()
        self._put(
            (
                method,
                self.url.decode("latin-1"),
                self.headers,
                b"".join(self.body),
                self.parser.should_keep_alive(),
                self.forwarded,
            )
        )

    def _count(self, n: int) -> None:
        self.header_bytes += n
        if self.header_bytes > self.endpoint.options.max_header_bytes:
            self._refuse(431, f"request headers over the limit of {self.endpoint.options.max_header_bytes} bytes")

    def _refuse(self, status: int, message: str) -> None:
        """Stop reading this connection: answer ``status`` after what came before, then close."""
        self.refused = Refused(status, message)
        raise self.refused

    # -- answering, in order
    async def _answer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.queue:
                self.wakeup = loop.create_future()
                await self.wakeup
            if not self.writable.is_set():  # the client is not reading its answers: wait for it
                await self.writable.wait()
            item = self.queue.popleft()
            self._maybe_resume_reading()
            if item is None:  # end of the client's data
                if self.transport is not None:
                    self.transport.close()
                return
            if isinstance(item, Refused):  # the connection cannot be read further
                refusal = getattr(self.endpoint, "refusal", None)
                payload = refusal(self.url, item) if refusal is not None else {"error": str(item)}
                self._send(item.status, payload, keep_alive=False)
                return
            method, url, headers, body, keep_alive, forwarded = item
            self.busy = True
            try:
                status, payload = await self.endpoint.answer(method, url, headers, body, forwarded)
                if isinstance(payload, EventStream):
                    await self._stream(payload.events, keep_alive, payload.stall_timeout_s)
                else:
                    self._send(status, payload, keep_alive, headers.get(b"accept-encoding"))
            finally:
                self.busy = False
                self.idle_since = loop.time()
            if not keep_alive:
                return

    async def _stream(self, events: AsyncIterator[Any], keep_alive: bool, stall_timeout_s: float | None = None) -> None:
        """Server-Sent Events in HTTP/1.1 chunks, written no faster than the client reads (a
        slow reader holds back the model's responses instead of growing our buffer)."""
        close = "" if keep_alive else "Connection: close\r\n"
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
            f"Transfer-Encoding: chunked\r\n{close}\r\n"
        )
        transport = self.transport
        if transport is None:
            await events.aclose()  # type: ignore[attr-defined]
            return
        transport.write(head.encode())
        try:
            async for event in events:
                data = sse_event(event)
                transport.write(b"%x\r\n%s\r\n" % (len(data), data))
                if not self.writable.is_set():
                    try:
                        await asyncio.wait_for(self.writable.wait(), stall_timeout_s)
                    except asyncio.TimeoutError:  # it reads nothing: let the request go
                        transport.abort()
                        return
                if transport.is_closing():
                    return  # the client left: closing the events cancels the request
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        transport.write(b"0\r\n\r\n")
        if not keep_alive:
            transport.close()

    def _send(self, status: int, payload: Any, keep_alive: bool, accept_encoding: bytes | None = None) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        fields, parts = encode(status, payload, accept_encoding)
        fields.append(("Content-Length", str(sum(len(p) for p in parts))))
        if not keep_alive:
            fields.append(("Connection", "close"))
        head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
        self.transport.writelines([head.encode() + b"\r\n", *parts])
        if not keep_alive:
            self.transport.close()
