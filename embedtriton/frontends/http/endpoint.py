"""The REST endpoint's server side: ``embedtriton._h2.HttpServer`` serves the connections in C
(parsing, limits, keep-alive, pipelining, timeouts) and hands each complete request to
:meth:`RestEndpoint.on_request` on its IO thread. Inference is decoded there and submitted with a
target that encodes and answers on the thread that completes it (no event-loop hop); the other
routes (:class:`.rest.RestApi`) run as coroutines on the endpoint's asyncio loop and answer
through the call, Server-Sent Event streams included."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any
from urllib.parse import unquote

from ...core import CoreServer
from ...core.handles import http_fast, release_answered
from ...errors import InvalidArgumentError, UnavailableError
from .. import c_path, kserve, security
from ..descriptors import connection_cap
from .answers import EventStream, Refused, encode, sse_event
from .options import HttpOptions
from .rest import PendingInfer, RestApi, answering

log = logging.getLogger("embedtriton")

_EVENTS = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]
_WATCH_S = 0.05  # how often a stream checks that its client is still there (while it waits on its events)
_WRITABLE_S = 0.005  # how often a stream whose client does not read checks again


class _InferReply:
    """The target of one inference request submitted from the IO thread: called once with
    ``(outputs, None)`` or ``(None, error)`` on the thread that completes it, where it encodes the
    answer and hands it to the connection."""

    __slots__ = ("api", "call", "pending", "accept", "url")

    def __init__(self, api: RestApi, call: Any, pending: PendingInfer, accept: bytes | None, url: str) -> None:
        self.api, self.call, self.pending, self.accept, self.url = api, call, pending, accept, url

    def __call__(self, outputs: dict[str, Any] | None, error: BaseException | None) -> None:
        # (the error is not raised here: its traceback would hold this frame, and so the call,
        # in a cycle that only the garbage collector breaks)
        if error is None:
            try:
                status, payload = 200, self.api.encode_infer(self.pending, outputs)  # type: ignore[arg-type]
            except Exception as exc:
                status, payload = self.api.failed(exc, "inference", "POST", self.url)
        else:
            status, payload = self.api.failed(error, "inference", "POST", self.url)  # type: ignore[arg-type]
        _respond(self.call, status, payload, self.accept)


def _respond(call: Any, status: int, payload: Any, accept: bytes | None) -> None:
    try:
        fields, parts = encode(status, payload, accept)
    except Exception as exc:  # (an answer that does not encode: a bug of ours)
        log.error("HTTP answer failed to encode", exc_info=exc)
        fields, parts = encode(500, {"error": f"internal error: {type(exc).__name__}: {exc}"}, None)
        status = 500
    call.respond(status, fields, parts)


class RestEndpoint(RestApi):
    """A KServe-v2 HTTP/REST server for a server's models (see the module's docstring)."""

    direct_infer = True  # /infer decoded on the IO thread (False: every route through answer())

    def __init__(self, server: CoreServer, options: HttpOptions) -> None:
        from ... import _h2

        super().__init__(server, options)
        # options.max_connections, or fewer when the process's descriptor limit leaves less room
        self.max_connections = connection_cap(options.max_connections, "HTTP")
        options.ssl_context()  # the TLS files are checked here (InvalidArgumentError), served in C
        tls = None
        if options.tls_cert and options.tls_key:
            tls = (options.tls_cert, options.tls_key, options.tls_client_ca)
        host, _, port = options.address.rpartition(":")  # type: ignore[union-attr]
        self._in_c: dict[tuple[str, str], tuple[Any, int | None]] = {}  # c_path.admit's entries
        self._loop = asyncio.new_event_loop()  # the routes besides inference, and streams
        self._streams: set[asyncio.Task[None]] = set()
        try:
            self._http = _h2.HttpServer(
                host.strip("[]"), int(port), self.on_request, self.on_refused,
                max_connections=self.max_connections, max_body_bytes=options.max_body_bytes,
                max_header_bytes=options.max_header_bytes, idle_timeout=float(options.idle_timeout_s),
                request_timeout=float(options.request_timeout_s), tls=tls, names=options.forward is not None,
                max_buffered_bytes=options.max_buffered_bytes,
            )  # fmt: skip
        except OSError as exc:
            self._loop.close()
            raise UnavailableError(f"cannot serve HTTP on {options.address}: {exc}") from None
        except ValueError as exc:
            self._loop.close()
            raise InvalidArgumentError(f"cannot load the TLS files: {exc}") from None
        self.port: int = self._http.port
        self.use_c_path(True)
        self._thread = threading.Thread(target=self._loop.run_forever, name="embedtriton-http", daemon=True)
        self._thread.start()

    def stats(self) -> dict[str, Any]:
        """The transport's counters: connections (open now), accepted, refused, evicted,
        idle_closed, requests, request_timeouts, paused (times a client was read no further until
        it read its answers), budget_refusals (503s for max_buffered_bytes), incoming_bytes (what
        counts against it now)..."""
        return dict(self._http.stats())

    # -- called by the HttpServer on its IO thread, with the GIL
    def on_request(
        self, call: Any, method: str, url: str, headers: dict[bytes, bytes], body: bytes, names: Any
    ) -> None:
        forwarded = None
        if names is not None and self.options.forward is not None:  # the names as sent, for the pattern
            forwarded = [(n, v) for n, v in names if self.options.forward.search(n)]
        if (
            self.direct_infer
            and method == "POST"
            and b"content-encoding" not in headers
            and self._infer_now(call, url, headers, body, forwarded)
        ):
            return
        asyncio.run_coroutine_threadsafe(self._answer(call, method, url, headers, body, forwarded), self._loop)

    def on_refused(self, call: Any, status: int, message: str, url: bytes) -> None:
        """A request refused before its route (size, time, HTTP): answered, then the connection closes."""
        _respond(call, status, self.refusal(url, Refused(status, message)), None)

    def use_c_path(self, on: bool) -> None:
        """Whether plain /infer requests are decoded, run and answered in C (native/_native/kserve.c
        and kserve_json.c, handed over by the HTTP IO thread without a Python call; the others it
        declines to :meth:`on_request`). On from the start where only the C path's requests are
        served: not for forwarded headers, restricted inference, traces, nor once draining. Off:
        every request takes the Python path, as before (tests compare the two)."""
        if on and not self._python_only():
            server = self.server
            self._http.set_fast(http_fast(), (self._in_c, server._bound, server._handle, self._admit_in_c))
        else:
            self._http.set_fast(None, None)  # (the IO thread reads it with the GIL)

    def _python_only(self) -> bool:
        """Whether every /infer must take the Python path (frontends/c_path.py: the options and the
        server's state; and an endpoint whose routes are its own)."""
        return (
            not self.direct_infer
            or c_path.server_declines(self.server, self.draining)
            or bool(c_path.options_declining(self.options, c_path.HTTP_OPTIONS))
        )

    def _admit_in_c(self, name: str, version: str) -> None:
        c_path.admit(self.server, self._in_c, name, version, json=True)

    def drain(self) -> None:
        self.use_c_path(False)
        super().drain()

    def _infer_now(self, call: Any, url: str, headers: dict[bytes, bytes], body: bytes, forwarded: Any) -> bool:
        """/v2/models/<m>[/versions/<v>]/infer: decoded here, submitted with a target that answers
        from the completing thread. False for any other route."""
        path = url.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if len(parts) == 4 and parts[3] == "infer" and parts[1] == "models" and parts[0] == "v2":
            version = ""
        elif len(parts) == 6 and parts[5] == "infer" and parts[3] == "versions" and parts[:2] == ["v2", "models"]:
            version = parts[4]
        else:
            return False
        if "%" in path:
            parts = [unquote(p) for p in parts]
            version = parts[4] if len(parts) == 6 else ""
        name = parts[2]
        accept = headers.get(b"accept-encoding")
        try:
            restriction = self.options.restrictions.get("inference")
            if restriction is not None and not restriction.admits(headers.get(restriction.header.encode())):
                _respond(call, 403, self._error("inference", 403, restriction.message), None)
                return True
            model = kserve.model_of(self.server, name, version)
            found = None
            if self.options.forward is not None:
                pairs = forwarded if forwarded is not None else [(k.decode("latin-1"), v) for k, v in headers.items()]
                found = security.forwarded(self.options.forward, pairs)
            pending = self.decode_infer(model, name, version, headers, body, found)
            reply = _InferReply(self, call, pending, accept, url)
            handle = pending.decoded.model.submit(pending.decoded.request, None, reply, cancellable=True)
            if handle is not None:
                call.on_gone = handle.cancel  # its client left: Triton drops it (or its answer goes nowhere)
        except Exception as exc:
            status, payload = self.failed(exc, "inference", "POST", url)
            _respond(call, status, payload, accept if status == 200 else None)
        return True

    async def _answer(
        self, call: Any, method: str, url: str, headers: dict[bytes, bytes], body: bytes, forwarded: Any
    ) -> None:
        answering.set(call)  # (this task's: an inference it submits is cancelled if the client leaves)
        status, payload = await self.answer(method, url, headers, body, forwarded)
        if isinstance(payload, EventStream):
            task = asyncio.current_task()
            assert task is not None
            self._streams.add(task)
            try:
                await self._stream(call, payload)
            except Exception as exc:  # the events failed mid-stream: no answer can follow its chunks
                log.error("HTTP %s %s: the event stream failed", method, url[:200], exc_info=exc)
                call.abort()
            finally:
                self._streams.discard(task)
        else:
            _respond(call, status, payload, headers.get(b"accept-encoding"))

    async def _stream(self, call: Any, stream: EventStream) -> None:
        """Server-Sent Events in HTTP/1.1 chunks, written no faster than the client reads (a slow
        reader holds back the model's responses instead of growing our buffer); a client that reads
        nothing for ``stall_timeout_s`` is disconnected, and one that leaves closes the events
        (cancelling the request) even while they wait for the model."""
        events = stream.events
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.ensure_future(_watch(call, task))
        try:
            if not call.begin(200, _EVENTS):
                return
            async for event in events:
                if not call.send(sse_event(event)):
                    return  # the client left
                if not call.writable():
                    deadline = None if stream.stall_timeout_s is None else self._loop.time() + stream.stall_timeout_s
                    while not call.writable():
                        if not call.open:
                            return
                        if deadline is not None and self._loop.time() >= deadline:
                            call.abort()  # it reads nothing: let the request go
                            return
                        await asyncio.sleep(_WRITABLE_S)
            call.end()
        except asyncio.CancelledError:
            if call.open:  # not the watcher's doing: the endpoint stops
                raise
        finally:
            watcher.cancel()
            await events.aclose()  # type: ignore[attr-defined]

    def stop(self, grace: float = 1.0) -> None:
        """Stop accepting; requests in progress get ``grace`` seconds; then every connection closes."""
        self.use_c_path(False)
        self._http.stop(grace)
        for task in list(self._streams):
            self._loop.call_soon_threadsafe(task.cancel)

        async def settle() -> None:
            await asyncio.sleep(0)

        try:
            asyncio.run_coroutine_threadsafe(settle(), self._loop).result(timeout=5)
        except Exception:  # already closed, or the wait ran out: stop the loop anyway
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self.shm.clear()
        release_answered()  # the calls answered in C since a request last took them


async def _watch(call: Any, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` once ``call``'s client is gone."""
    while call.open:
        await asyncio.sleep(_WATCH_S)
    task.cancel()
