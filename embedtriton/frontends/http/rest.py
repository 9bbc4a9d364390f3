"""The KServe-v2 HTTP/REST endpoint: routes and inference, on an asyncio loop of its own.
Connections (parsing, limits, keep-alive, pipelining) are :mod:`.connection`'s; the extensions
besides inference (repository, shared memory, logging, trace) are :mod:`.extensions`'.

Inference takes JSON tensors and Triton's binary tensor data extension, and inputs and outputs
in registered system shared memory; it goes through the same :mod:`..kserve` checks as gRPC,
then ``Model.submit``. Errors are Triton's JSON ``{"error": ...}`` with Triton's status codes
(a client's mistake is a 4xx).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from typing import Any
from urllib.parse import unquote

import numpy as np

from ...core import CoreServer
from ...errors import InvalidArgumentError, TritonError, UnavailableError
from ...tensors import triton_dtype
from .. import kserve
from ..shared_memory import regions_of
from . import extensions
from .connection import Binary, Connection, Refused, Text, decompress, status_of
from .generate import generate
from .options import HttpOptions


class RestApi:
    """The endpoint's routes without a socket: ``answer()`` turns one request into its status
    and answer (also what a Ray Serve replica answers its HTTP requests with)."""

    def __init__(self, server: CoreServer, options: HttpOptions) -> None:
        self.server = server
        self.options = options
        self.draining = False
        self.shm = regions_of(server)  # shared with the gRPC endpoint, as in Triton

    async def answer(self, method: str, url: str, headers: dict[bytes, bytes], body: bytes) -> tuple[int, Any]:
        """One request's status and answer (a dict, :class:`Binary`, :class:`Text`, :class:`EventStream`
        or None); errors as Triton writes them: ``{"error": ...}`` with its status code."""
        try:
            if b"content-encoding" in headers:
                body = await decompress(headers[b"content-encoding"], body, self.options.max_body_bytes)
            return await self.route(method, url, headers, body)
        except Refused as exc:
            return exc.status, {"error": str(exc)}
        except TritonError as exc:
            return status_of(exc), {"error": str(exc)}
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError) as exc:  # malformed values
            return 400, {"error": f"malformed request: {exc}"}

    def drain(self) -> None:
        """The server stops: new inference requests are refused (503); health says not ready."""
        self.draining = True

    # -- routes
    async def route(self, method: str, url: str, headers: dict[bytes, bytes], body: bytes) -> tuple[int, Any]:
        path = url.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if "%" in path:
            parts = [unquote(p) for p in parts]
        if len(parts) == 4 and parts[3] == "infer" and parts[1] == "models" and parts[0] == "v2" and method == "POST":
            model = kserve.model_of(self.server, parts[2], "")  # the common case first
            return 200, await self._infer(model, parts[2], "", headers, body)
        if path == "/metrics" and method == "GET":  # also here, besides serve_metrics' own port
            return 200, Text("text/plain; version=0.0.4", self.server.metrics().encode())
        if parts[:1] != ["v2"]:
            raise Refused(404, f"no such endpoint: {path}")
        rest = parts[1:]
        if rest in ([], [""]) and method == "GET":
            return 200, self._server_metadata()
        if rest[:1] == ["health"] and len(rest) == 2 and method == "GET":
            ok = self.server.live if rest[1] == "live" else self.server.ready and not self.draining
            return (200 if ok else 400), None
        if rest[:1] == ["repository"]:
            return 200, await extensions.repository(self.server, self.draining, method, rest[1:], body)
        if rest[:1] in (["systemsharedmemory"], ["cudasharedmemory"]):
            answer = extensions.shared_memory(
                self.shm, self.options.shared_memory, self.draining, rest[0], method, rest[1:], body
            )
            return 200, answer
        if rest == ["logging"] and method in ("GET", "POST"):
            return 200, extensions.logging_settings(self.server, method, body)
        if rest == ["trace", "setting"] and method in ("GET", "POST"):
            return 200, extensions.trace_settings(self.server, "", method, body)
        if rest == ["models", "stats"]:  # every model's (as Triton, before any model named "stats")
            if method != "GET":
                raise Refused(405, "Method Not Allowed")
            return 200, {"model_stats": [model.statistics() for model in self.server.models()]}
        if rest[:1] == ["models"] and len(rest) >= 2:
            name, version, action = rest[1], "", rest[2:]
            if action[:1] == ["versions"] and len(action) >= 2:
                version, action = action[1], action[2:]
            if action == ["trace", "setting"] and method in ("GET", "POST"):
                return 200, extensions.trace_settings(self.server, name, method, body)
            return await self._model_route(method, name, version, action, headers, body)
        raise Refused(404, f"no such endpoint: {path}")

    def _server_metadata(self) -> dict[str, Any]:
        """Triton's name and version; of its extensions, those this endpoint implements."""
        meta = self.server.metadata()
        served = {*kserve.EXTENSIONS, "binary_tensor_data"}
        if not self.options.shared_memory:
            served.discard("system_shared_memory")
        if self.server.tracer is None:
            served.discard("trace")
        names = [e for e in meta.get("extensions", []) if e in served]
        return {"name": meta.get("name"), "version": meta.get("version"), "extensions": names}

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
                raise Refused(405, "Method Not Allowed")
            return 200, await self._infer(model, name, version, headers, body)
        if action in (["generate"], ["generate_stream"]):
            if method != "POST":
                raise Refused(405, "Method Not Allowed")
            stream = action == ["generate_stream"]
            return 200, await generate(model, name, version, body, stream, self.draining)
        raise Refused(404, f"no such endpoint for model '{name}': {'/'.join(action)}")

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
            tparams = tensor.get("parameters") or {}
            if not isinstance(tparams, dict):
                raise InvalidArgumentError(f"input '{tname}': 'parameters' must be a JSON object")
            ref = kserve.shm_reference(tname, tparams)
            if ref is not None:  # read from the client's registered region
                if "data" in tensor or "binary_data_size" in tparams:
                    raise InvalidArgumentError(f"input '{tname}' names a shared-memory region and also carries data")
                view = kserve.shm_view(decoded, self.shm, ref, f"input '{tname}'")
                inputs[tname] = kserve.array_from_bytes(tname, datatype, tuple(shape), view)
                continue
            size = tparams.get("binary_data_size")
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
        shm_params: dict[str, dict[str, Any]] = {}
        outputs = request.get("outputs")
        if isinstance(outputs, list) and outputs:
            wanted = []
            for o in outputs:
                if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                    raise InvalidArgumentError("each requested output must be an object with a 'name'")
                oparams = o.get("parameters") or {}
                if not isinstance(oparams, dict):
                    raise InvalidArgumentError(f"output '{o['name']}': 'parameters' must be a JSON object")
                oparams = dict(oparams)
                if oparams.pop("binary_data", binary_default):
                    in_binary.add(o["name"])
                if "shared_memory_region" in oparams:
                    shm_params[o["name"]] = {k: v for k, v in oparams.items() if k.startswith("shared_memory_")}
                wanted.append((o["name"], oparams))
            kserve.requested_outputs(decoded, self.shm, wanted)
        request_id = request.get("id", "")
        kserve.apply_parameters(decoded, params, request_id if isinstance(request_id, str) else "")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        decoded.model.submit(decoded.request, loop, future)
        results = await future
        decoded.check_regions()  # a region shrunk under the request: its data is lost
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
            if oname in decoded.in_shm:  # already written into the client's region
                size = len(kserve.output_bytes(array, datatype)) if datatype == "BYTES" else array.nbytes
                entry["parameters"] = {**shm_params[oname], "shared_memory_byte_size": size}
            elif oname in in_binary or (binary_default and not outputs):
                raw = kserve.output_bytes(array, datatype)
                entry["parameters"] = {"binary_data_size": len(raw)}
                blobs.append(raw)
            else:
                flat = np.asarray(array).reshape(-1).tolist()
                entry["data"] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in flat]
            answer["outputs"].append(entry)
        return Binary(answer, blobs) if blobs else answer


class RestEndpoint(RestApi):
    """A KServe-v2 HTTP/REST server for a server's models (see the module's docstring)."""

    def __init__(self, server: CoreServer, options: HttpOptions) -> None:
        super().__init__(server, options)
        self.connections: set[Connection] = set()
        context = options.ssl_context()
        handshake = options.request_timeout_s if context else None  # a stalled TLS handshake is cut too
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="embedtriton-http", daemon=True)
        self._thread.start()
        host, _, port = options.address.rpartition(":")  # type: ignore[union-attr]

        async def start() -> asyncio.AbstractServer:
            return await self._loop.create_server(
                lambda: Connection(self), host.strip("[]"), int(port), ssl=context, ssl_handshake_timeout=handshake
            )

        self.now = self._loop.time
        self._sweep_every = min(1.0, options.request_timeout_s / 4, options.idle_timeout_s / 4)
        self._loop.call_soon_threadsafe(self._sweep)
        try:
            self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=30)
        except Exception as exc:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise UnavailableError(f"cannot serve HTTP on {options.address}: {exc}") from None
        self.port: int = self._server.sockets[0].getsockname()[1]

    def _sweep(self) -> None:
        """Every so often: connections past their deadline (stalled or idle) are dealt with."""
        now = self._loop.time()
        for connection in [c for c in self.connections if c.deadline <= now]:
            connection._expired()
        self._loop.call_later(self._sweep_every, self._sweep)

    def stop(self, grace: float = 1.0) -> None:
        async def close() -> None:
            self._server.close()
            until = self._loop.time() + grace  # answers in progress (not idle keep-alives) get the grace period
            while self._loop.time() < until and any(c.busy or c.queue for c in self.connections):
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
        self.shm.unregister()


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
