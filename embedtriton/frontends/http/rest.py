"""The KServe-v2 HTTP/REST endpoint: HTTP/1.1 parsed by ``httptools`` (llhttp, chosen by
``benchmarks/bench_http_parsers.py``: ~60x h11, ~25x the standard library's), on an asyncio
loop of its own, keep-alive and pipelining (requests of a connection are answered in order).

This first slice serves health, server and model metadata, model config and statistics, and
inference with JSON tensors; errors are Triton's JSON ``{"error": ...}`` with Triton's status
codes (a client's mistake is a 4xx). Limits: a body over ``max_body_bytes`` or a header block
over ``max_header_bytes`` is refused (413 / 431) and the connection closed; a request without
``Content-Length`` that has a body (chunked) is refused with 411.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np

from ...core import CoreServer
from ...errors import InvalidArgumentError, NotFoundError, TritonError, UnavailableError, UnsupportedError
from ...tensors import triton_dtype
from .. import kserve
from ..grpc.options import normalize_address

# Triton's HTTP status for each error (http_server.cc HttpCodeFromError)
_STATUS = [(NotFoundError, 404), (UnavailableError, 503), (UnsupportedError, 501), (InvalidArgumentError, 400)]
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
            413: "Payload Too Large", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable"}  # fmt: skip


def status_of(error: BaseException) -> int:
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    return 500 if isinstance(error, TritonError) and error.code == "INTERNAL" else 400


@dataclass(frozen=True)
class HttpOptions:
    """Settings of the HTTP/REST endpoint (``Server.serve_http(options=...)``)."""

    address: str | int = "127.0.0.1:8000"
    max_body_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_connections: int = 1024  # more are closed at once
    idle_timeout_s: float = 300.0  # a connection idle this long is closed
    request_timeout_s: float = 30.0  # a request begun must arrive whole within this (else 408)

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


@dataclass
class _Binary:
    """An answer with the binary tensor data extension: a JSON header, then raw tensor bytes."""

    header: dict[str, Any]
    blobs: list[bytes]


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: httptools feeds the request parts; complete requests are
    queued and answered in order."""

    def __init__(self, endpoint: RestEndpoint) -> None:
        import httptools

        self.endpoint = endpoint
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None
        self.refused: _Refused | None = None  # why the connection is refused (set in a callback)
        self.timer: asyncio.TimerHandle | None = None
        self.in_request = False  # bytes of a request arrived, and not yet all of it
        self.busy = False  # answering a request

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.endpoint.connections) >= self.endpoint.options.max_connections:
            transport.close()  # over max_connections: no worker, nothing read
            return
        self.worker = asyncio.ensure_future(self._answer())
        self.endpoint.connections.add(self)
        self._arm()

    def _arm(self) -> None:
        """(Re)start the clock: idle_timeout_s between requests, request_timeout_s within one."""
        if self.timer is not None:
            self.timer.cancel()
        options = self.endpoint.options
        delay = options.request_timeout_s if self.in_request else options.idle_timeout_s
        self.timer = asyncio.get_running_loop().call_later(delay, self._expired)

    def _expired(self) -> None:
        self.timer = None
        if self.in_request and self.refused is None:  # stalled mid-request: answered after what came before
            self.refused = _Refused(408, "the request did not arrive within request_timeout_s")
            self.queue.put_nowait(self.refused)
        elif self.transport is not None and self.queue.empty() and not self.busy:
            self.transport.close()  # idle
        else:
            self._arm()

    def data_received(self, data: bytes) -> None:
        import httptools

        if self.refused is not None or self.worker is None:
            return  # the connection is being refused: nothing more is read
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:  # (our callbacks' refusals come wrapped in it)
            self.refused = self.refused or _Refused(400, f"malformed HTTP request: {exc}")
            self.queue.put_nowait(self.refused)

    def eof_received(self) -> bool:
        """The client finished sending: answer what it sent, then close."""
        self.queue.put_nowait(None)
        return True  # keep the transport open for the answers

    def connection_lost(self, exc: Exception | None) -> None:
        self.endpoint.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        if self.worker is not None:
            self.worker.cancel()

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.headers, self.header_bytes, self.body, self.body_bytes = b"", {}, 0, [], 0
        self.in_request = True  # it has request_timeout_s to arrive whole
        self._arm()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value
        self._count(len(name) + len(value))

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
        self.queue.put_nowait(
            (method, self.url.decode("latin-1"), self.headers, b"".join(self.body), self.parser.should_keep_alive())
        )

    def _count(self, n: int) -> None:
        self.header_bytes += n
        if self.header_bytes > self.endpoint.options.max_header_bytes:
            self._refuse(431, f"request headers over the limit of {self.endpoint.options.max_header_bytes} bytes")

    def _refuse(self, status: int, message: str) -> None:
        """Stop reading this connection: answer ``status`` after what came before, then close."""
        self.refused = _Refused(status, message)
        raise self.refused

    # -- answering, in order
    async def _answer(self) -> None:
        while True:
            item = await self.queue.get()
            if item is None:  # end of the client's data
                if self.transport is not None:
                    self.transport.close()
                return
            if isinstance(item, _Refused):  # the connection cannot be read further
                self._send(item.status, {"error": str(item)}, keep_alive=False)
                return
            method, url, headers, body, keep_alive = item
            self.busy = True
            try:
                status, payload = await self.endpoint.route(method, url, headers, body)
            except _Refused as exc:
                status, payload = exc.status, {"error": str(exc)}
            except TritonError as exc:
                status, payload = status_of(exc), {"error": str(exc)}
            except (ValueError, TypeError, OverflowError, KeyError, AttributeError) as exc:  # malformed values
                status, payload = 400, {"error": f"malformed request: {exc}"}
            finally:
                self.busy = False
            self._send(status, payload, keep_alive)
            if not keep_alive:
                return

    def _send(self, status: int, payload: Any, keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        extra, blobs = "Content-Type: application/json\r\n", []
        if isinstance(payload, _Binary):  # the binary tensor data extension: JSON, then the tensors' bytes
            payload, blobs = payload.header, payload.blobs
        body = b"" if payload is None else json.dumps(payload).encode()
        if blobs:
            extra = f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(body)}\r\n"
        size = len(body) + sum(len(b) for b in blobs)
        close = "" if keep_alive else "Connection: close\r\n"
        head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n{extra}Content-Length: {size}\r\n{close}\r\n"
        self.transport.writelines([head.encode(), body, *blobs])
        if not keep_alive:
            self.transport.close()


class RestEndpoint:
    """A KServe-v2 HTTP/REST server for a server's models (see the module's docstring)."""

    def __init__(self, server: CoreServer, options: HttpOptions) -> None:
        self.server = server
        self.options = options
        self.draining = False
        self.connections: set[_Connection] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="embedtriton-http", daemon=True)
        self._thread.start()
        host, _, port = options.address.rpartition(":")  # type: ignore[union-attr]

        async def start() -> asyncio.AbstractServer:
            return await self._loop.create_server(lambda: _Connection(self), host.strip("[]"), int(port))

        try:
            self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=30)
        except Exception as exc:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise UnavailableError(f"cannot serve HTTP on {options.address}: {exc}") from None
        self.port: int = self._server.sockets[0].getsockname()[1]

    def drain(self) -> None:
        """The server stops: new inference requests are refused (503); health says not ready."""
        self.draining = True

    def stop(self, grace: float = 1.0) -> None:
        async def close() -> None:
            self._server.close()
            until = self._loop.time() + grace  # answers in progress get the grace period; idle connections none
            while self._loop.time() < until and any(c.busy or not c.queue.empty() for c in self.connections):
                await asyncio.sleep(0.005)
            for connection in list(self.connections):
                if connection.transport is not None:
                    connection.transport.close()
                if connection.worker is not None:
                    connection.worker.cancel()
            await asyncio.sleep(0)

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=grace + 5)
        except Exception:  # already closed, or the wait ran out: stop the loop anyway
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # -- routes
    async def route(self, method: str, url: str, headers: dict[bytes, bytes], body: bytes) -> tuple[int, Any]:
        path = url.split("?", 1)[0]
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:1] != ["v2"]:
            raise _Refused(404, f"no such endpoint: {path}")
        rest = parts[1:]
        if rest in ([], [""]) and method == "GET":
            meta = self.server.metadata()
            return 200, {"name": meta.get("name"), "version": meta.get("version"), "extensions": []}
        if rest[:1] == ["health"] and len(rest) == 2 and method == "GET":
            ok = self.server.live if rest[1] == "live" else self.server.ready and not self.draining
            return (200 if ok else 400), None
        if rest[:1] == ["models"] and len(rest) >= 2:
            name, version, action = rest[1], "", rest[2:]
            if action[:1] == ["versions"] and len(action) >= 2:
                version, action = action[1], action[2:]
            return await self._model_route(method, name, version, action, headers, body)
        raise _Refused(404, f"no such endpoint: {path}")

    async def _model_route(
        self, method: str, name: str, version: str, action: list[str], headers: dict[bytes, bytes], body: bytes
    ) -> tuple[int, Any]:
        model = kserve.model_of(self.server, name, version)
        if action == [] and method == "GET":
            return 200, model.metadata()
        if action == ["ready"] and method == "GET":
            return (200 if model.ready else 400), None
        if action == ["config"] and method == "GET":
            return 200, model.config()
        if action == ["stats"] and method == "GET":
            return 200, {"model_stats": [model.statistics()]}
        if action == ["infer"]:
            if method != "POST":
                raise _Refused(405, "Method Not Allowed")
            return 200, await self._infer(model, name, version, headers, body)
        raise _Refused(404, f"no such endpoint for model '{name}': {'/'.join(action)}")

    async def _infer(self, model: Any, name: str, version: str, headers: dict[bytes, bytes], body: bytes) -> Any:
        if self.draining:
            raise UnavailableError("the server is stopping: it takes no new requests")
        header_size = headers.get(b"inference-header-content-length")
        binary = memoryview(b"")
        if header_size is not None:  # the binary tensor data extension: JSON, then the inputs' bytes
            if not header_size.isdigit() or int(header_size) > len(body):
                raise InvalidArgumentError(
                    f"Inference-Header-Content-Length {header_size.decode('latin-1')!r} does not fit the "
                    f"{len(body)}-byte body"
                )
            binary, body = memoryview(body)[int(header_size) :], body[: int(header_size)]
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"malformed JSON request body: {exc}") from None
        if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
            raise InvalidArgumentError("the request body must be a JSON object with an 'inputs' list")
        decoded = kserve.Decoded(model)
        inputs = decoded.request.inputs = {}
        offset = 0
        for tensor in request["inputs"]:
            if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
                raise InvalidArgumentError("each input must be an object with a 'name'")
            tname, datatype, shape = tensor["name"], tensor.get("datatype"), tensor.get("shape")
            if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
                raise InvalidArgumentError(f"input '{tname}': 'shape' must be a list of integers")
            kserve.check_shape(tname, tuple(shape))
            if tname in inputs:
                raise InvalidArgumentError(f"input '{tname}' already exists in request")
            if not isinstance(datatype, str):
                raise InvalidArgumentError(f"input '{tname}': 'datatype' must be a string such as \"FP32\"")
            size = (tensor.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
                    raise InvalidArgumentError(
                        f"input '{tname}': binary_data_size {size!r} does not fit the {len(binary) - offset} "
                        "bytes of binary data left in the request"
                    )
                inputs[tname] = kserve.array_from_bytes(tname, datatype, tuple(shape), binary[offset : offset + size])
                offset += size
                continue
            values = _flatten(tensor.get("data"), math.prod(shape), tname)
            inputs[tname] = kserve.array_from_values(tname, datatype, tuple(shape), values)
        if offset != len(binary):
            raise InvalidArgumentError(f"{len(binary) - offset} bytes of binary data follow that no input claims")
        params = request.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidArgumentError("'parameters' must be a JSON object")
        params = dict(params)
        binary_default = bool(params.pop("binary_data_output", False))  # outputs not named otherwise
        in_binary: set[str] = set()
        outputs = request.get("outputs")
        if isinstance(outputs, list) and outputs:
            wanted = []
            for o in outputs:
                if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                    raise InvalidArgumentError("each requested output must be an object with a 'name'")
                oparams = dict(o.get("parameters") or {})
                if oparams.pop("binary_data", binary_default):
                    in_binary.add(o["name"])
                wanted.append((o["name"], oparams))
            kserve.requested_outputs(decoded, None, wanted)  # type: ignore[arg-type]
        request_id = request.get("id", "")
        kserve.apply_parameters(decoded, params, request_id if isinstance(request_id, str) else "")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        decoded.model.submit(decoded.request, loop, future)
        results = await future
        answer: dict[str, Any] = {"model_name": name, "model_version": version or "1", "outputs": []}
        if request_id:
            answer["id"] = request_id
        blobs: list[bytes] = []
        for oname, array in results.items():
            datatype = triton_dtype(array.dtype)
            if decoded.classify and oname in decoded.classify:
                array = kserve.classify(array, datatype, decoded.classify[oname], model.batched, model.labels(oname))
                datatype = "BYTES"
            entry: dict[str, Any] = {"name": oname, "datatype": datatype, "shape": list(array.shape)}
            if oname in in_binary or (binary_default and not outputs):
                raw = kserve.output_bytes(array, datatype)
                entry["parameters"] = {"binary_data_size": len(raw)}
                blobs.append(raw)
            else:
                flat = np.asarray(array).reshape(-1).tolist()
                entry["data"] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in flat]
            answer["outputs"].append(entry)
        return _Binary(answer, blobs) if blobs else answer


def _flatten(data: Any, expected: int, name: str) -> list[Any]:
    """A tensor's JSON ``data``, flat or nested, as a flat list (never more than it declares)."""
    if not isinstance(data, list):
        raise InvalidArgumentError(f"input '{name}': 'data' must be a JSON list")
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item.encode() if isinstance(item, str) else item)
            if len(out) > expected:
                raise InvalidArgumentError(f"input '{name}': more values than its shape holds ({expected})")
        else:
            stack.pop()
    return out
