"""The KServe-v2 HTTP/REST API: routes and inference, decoded and encoded here. The connections
are served by :mod:`.endpoint` (``embedtriton._h2.HttpServer``, in C), which decodes ``/infer`` on
its IO thread with :meth:`RestApi.decode_infer` and answers with :meth:`RestApi.encode_infer` on
the thread that completes it; the other routes run as coroutines on the endpoint's asyncio loop.
The answers' kinds and encoding are :mod:`.answers`'; the extensions besides inference
(repository, shared memory, logging, trace) are :mod:`.extensions`'.

Inference takes JSON tensors and Triton's binary tensor data extension, and inputs and outputs
in registered system or CUDA shared memory; it goes through the same :mod:`..kserve` checks as
gRPC, then ``Model.submit``. Errors are Triton's JSON ``{"error": ...}`` with Triton's status codes
(a client's mistake is a 4xx).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np

from ...core import CoreServer
from ...errors import SERVER_STOPPING, InvalidArgumentError, TritonError, UnavailableError, UnsupportedError
from .. import kserve, security
from ..shared_memory import regions_of
from . import extensions, openai
from .answers import Binary, Refused, Text, decompress, status_of
from .generate import generate
from .options import HttpOptions

log = logging.getLogger("embedtriton")

# The transport's call (an _h2.HttpCall) of the request the current task answers, where there is
# one (endpoint.py sets it): an inference submitted for it is cancelled if its client leaves.
answering: contextvars.ContextVar[Any] = contextvars.ContextVar("answering", default=None)

# A route's handler: (lower-cased headers, body, forwarded headers) -> (status, answer)
Handler = Callable[[dict[bytes, bytes], bytes, Any], Awaitable[tuple[int, Any]]]

# /v2/models/{m}[/versions/{v}]/<action> -> Triton's restricted-API group (http_server.cc)
_MODEL_GROUPS = {
    "": "metadata", "ready": "health", "config": "model-config", "stats": "statistics", "infer": "inference",
    "generate": "inference", "generate_stream": "inference", "trace/setting": "trace",
}  # fmt: skip


@dataclass(slots=True)
class PendingInfer:
    """An inference request decoded (:meth:`RestApi.decode_infer`), what its answer needs."""

    decoded: kserve.Decoded
    name: str
    version: str
    request_id: Any
    in_binary: set[str]
    binary_default: bool
    outputs: bool  # the request named its outputs
    shm_params: dict[str, dict[str, Any]]


class RestApi:
    """The endpoint's routes without a socket: ``answer()`` turns one request into its status
    and answer (also what a Ray Serve replica answers its HTTP requests with)."""

    def __init__(self, server: CoreServer, options: HttpOptions) -> None:
        self.server = server
        self.options = options
        self.draining = False
        self.shm = regions_of(server)  # shared with the gRPC endpoint, as in Triton
        self._openai = openai.OpenAIRoutes(self) if options.openai else None

    async def answer(
        self,
        method: str,
        url: str,
        headers: dict[bytes, bytes],
        body: bytes,
        forwarded: list[tuple[str, bytes]] | None = None,
    ) -> tuple[int, Any]:
        """One request's status and answer (a dict, :class:`Binary`, :class:`Text`, :class:`EventStream`
        or None); errors as Triton writes them: ``{"error": ...}`` with its status code.
        ``headers``: lower-cased names; ``forwarded``: the headers the forward pattern found, with
        their names as sent (without it, the pattern runs over ``headers``); on the OpenAI routes,
        errors in OpenAI's shape."""
        group: str | None = None
        try:
            group, handle = self.resolve(method, url)
            restriction = self.options.restrictions.get(group)  # checked first, as Triton: nothing runs
            if restriction is not None and not restriction.admits(headers.get(restriction.header.encode())):
                return 403, self._error(group, 403, restriction.message)
            if b"content-encoding" in headers:
                body = await decompress(headers[b"content-encoding"], body, self.options.max_body_bytes)
            return await handle(headers, body, forwarded)
        except Exception as exc:
            return self.failed(exc, group, method, url)

    def failed(self, exc: Exception, group: str | None, method: str, url: str) -> tuple[int, Any]:
        """The status and answer of a request that raised ``exc`` (Triton's status for its errors,
        400 for malformed values, 500 with the traceback logged for a bug of ours)."""
        if isinstance(exc, Refused):
            return exc.status, self.refusal(url.encode("latin-1", "replace"), exc)
        if isinstance(exc, TritonError):
            return status_of(exc), self._error(group, status_of(exc), str(exc))
        if isinstance(exc, (ValueError, TypeError, OverflowError, KeyError, AttributeError)):  # malformed values
            return 400, self._error(group, 400, f"malformed request: {exc}")
        log.error("HTTP %s %s failed", method, url[:200], exc_info=exc)  # the client still gets an answer
        return 500, self._error(group, 500, f"internal error: {type(exc).__name__}: {exc}")

    def _error(self, group: str | None, status: int, message: str) -> dict[str, Any]:
        """An error answer: OpenAI's shape on its routes, Triton's elsewhere."""
        return openai.error_body(status, message) if group == "openai" else {"error": message}

    def refusal(self, url: bytes, exc: Refused) -> dict[str, Any]:
        """The answer to a request refused before its route ran (size, time, HTTP, encoding)."""
        openai_route = self.options.openai and url.startswith(b"/v1/")
        return self._error("openai" if openai_route else None, exc.status, str(exc))

    def drain(self) -> None:
        """The server stops: new inference requests are refused (503); health says not ready."""
        self.draining = True

    # -- routes
    def resolve(self, method: str, url: str) -> tuple[str | None, Handler]:
        """The restricted-API group of a request's route (Triton's, None for routes in no group)
        and the handler that answers it. Nothing runs and no body is parsed before the group's
        restriction is checked."""
        path = url.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if "%" in path:
            parts = [unquote(p) for p in parts]
        if len(parts) == 4 and parts[3] == "infer" and parts[1] == "models" and parts[0] == "v2" and method == "POST":
            name = parts[2]  # the common case first
            return "inference", lambda h, b, f: self._infer_answer(name, "", h, b, f)
        if path == "/metrics" and method == "GET":  # also here, besides serve_metrics' own port (no group, as Triton's)
            return None, self._metrics
        if parts[:1] == ["v1"] and self._openai is not None:  # OpenAI's routes (their errors in its shape)
            openai_answer = self._openai.answer
            return "openai", lambda h, b, f: openai_answer(method, parts[1:], h, b)
        if parts[:1] != ["v2"]:
            raise Refused(404, f"no such endpoint: {path}")
        rest = parts[1:]
        if rest in ([], [""]):
            return "metadata", self._get(method, self._server_metadata)
        if rest in (["health", "live"], ["health", "ready"]):
            return "health", self._get(method, lambda: self._health(rest[1]))
        if rest[:1] == ["repository"]:
            return "model-repository", lambda h, b, f: self._ok(extensions.repository(
                self.server, self.draining, method, rest[1:], b))  # fmt: skip
        if rest[:1] in (["systemsharedmemory"], ["cudasharedmemory"]):
            return "shared-memory", lambda h, b, f: self._now(extensions.shared_memory(
                self.shm, self.options.shared_memory, self.draining, rest[0], method, rest[1:], b))  # fmt: skip
        if rest == ["logging"]:
            return "logging", lambda h, b, f: self._now(self._settings(method, extensions.logging_settings, b))
        if rest == ["trace", "setting"]:
            return "trace", lambda h, b, f: self._now(self._settings(method, self._trace(""), b))
        if rest == ["models", "stats"]:  # every model's statistics (a model named "stats" is shadowed, as in Triton)
            return "statistics", self._get(method, self._all_stats)
        if rest[:1] == ["models"] and len(rest) >= 2:
            name, version, action = rest[1], "", rest[2:]
            if action[:1] == ["versions"] and len(action) >= 2:
                version, action = action[1], action[2:]
            group = _MODEL_GROUPS.get("/".join(action))
            if group is None:
                raise Refused(404, f"no such endpoint for model '{name}': {'/'.join(action)}")
            return group, lambda h, b, f: self._model_route(method, name, version, action, h, b, f)
        raise Refused(404, f"no such endpoint: {path}")

    @staticmethod
    async def _ok(work: Any) -> tuple[int, Any]:
        return 200, await work

    @staticmethod
    async def _now(answer: Any) -> tuple[int, Any]:
        return 200, answer

    @staticmethod
    def _get(method: str, answer: Any) -> Handler:
        async def handle(headers: Any, body: bytes, forwarded: Any) -> tuple[int, Any]:
            if method != "GET":
                raise Refused(405, "Method Not Allowed")
            result = answer()
            return result if isinstance(result, tuple) else (200, result)

        return handle

    async def _metrics(self, headers: Any, body: bytes, forwarded: Any) -> tuple[int, Any]:
        return 200, Text("text/plain; version=0.0.4", self.server.metrics().encode())

    def _health(self, kind: str) -> tuple[int, Any]:
        ok = self.server.live if kind == "live" else self.server.ready and not self.draining
        return (200 if ok else 400), None

    def _settings(self, method: str, apply: Any, body: bytes) -> Any:
        if method not in ("GET", "POST"):
            raise Refused(405, "Method Not Allowed")
        return apply(self.server, method, body)

    @staticmethod
    def _trace(model_name: str) -> Any:
        return lambda server, method, body: extensions.trace_settings(server, model_name, method, body)

    def _all_stats(self) -> dict[str, Any]:
        return {"model_stats": [kserve.model_of(self.server, m.name, "").statistics() for m in self.server.models()]}

    def _server_metadata(self) -> dict[str, Any]:
        """Triton's name and version; of its extensions, those this endpoint implements."""
        meta = self.server.metadata()
        served = kserve.served_extensions(self.options.shared_memory, self.server.tracer is not None)
        served.add("binary_tensor_data")
        names = [e for e in meta.get("extensions", []) if e in served]
        return {"name": meta.get("name"), "version": meta.get("version"), "extensions": names}

    async def _model_route(
        self,
        method: str,
        name: str,
        version: str,
        action: list[str],
        headers: dict[bytes, bytes],
        body: bytes,
        forwarded: list[tuple[str, bytes]] | None,
    ) -> tuple[int, Any]:
        if action == ["trace", "setting"]:
            return 200, self._settings(method, self._trace(name), body)
        if action in (["infer"], ["generate"], ["generate_stream"]) and method != "POST":
            raise Refused(405, "Method Not Allowed")
        if action == ["infer"]:
            return await self._infer_answer(name, version, headers, body, forwarded)
        model = kserve.model_of(self.server, name, version)
        if action in (["generate"], ["generate_stream"]):
            stream = action == ["generate_stream"]
            stall = self.options.request_timeout_s  # a stream's client that reads nothing this long is let go
            return 200, await generate(model, name, version, body, stream, self.draining, stall)
        if method != "GET":
            raise Refused(405, "Method Not Allowed")
        if action == []:
            return 200, model.metadata()
        if action == ["ready"]:
            return (200 if model.ready else 400), None
        if action == ["config"]:
            return 200, model.config()
        return 200, {"model_stats": [model.statistics()]}  # ["stats"]

    async def _infer_answer(
        self, name: str, version: str, headers: dict[bytes, bytes], body: bytes, forwarded: Any
    ) -> tuple[int, Any]:
        model = kserve.model_of(self.server, name, version)
        found = None
        if self.options.forward is not None:  # without the names as sent (Ray's proxy), the lower-cased ones
            pairs = forwarded if forwarded is not None else [(k.decode("latin-1"), v) for k, v in headers.items()]
            found = security.forwarded(self.options.forward, pairs)
        return 200, await self._infer(model, name, version, headers, body, found)

    async def _infer(
        self,
        model: Any,
        name: str,
        version: str,
        headers: dict[bytes, bytes],
        body: bytes,
        forwarded: dict[str, str] | None = None,
    ) -> Any:
        pending = self.decode_infer(model, name, version, headers, body, forwarded)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        handle = pending.decoded.model.submit(pending.decoded.request, loop, future, cancellable=True)
        call = answering.get()
        if call is not None and handle is not None:
            call.on_gone = handle.cancel  # its client left: Triton drops it, and answers CANCELLED
        return self.encode_infer(pending, await future)

    def decode_infer(
        self,
        model: Any,
        name: str,
        version: str,
        headers: dict[bytes, bytes],
        body: bytes,
        forwarded: dict[str, str] | None = None,
    ) -> PendingInfer:
        """An inference request's JSON (and binary tensors) decoded into the core's request, ready
        for ``Model.submit``; its answer is :meth:`encode_infer`'s."""
        if self.draining:
            raise UnavailableError(SERVER_STOPPING)
        if model.decoupled:  # Triton's check and words (http_server.cc, CheckTransactionPolicy)
            raise UnsupportedError("HTTP end point doesn't support models with decoupled transaction policy")
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
                inputs[tname] = kserve.shm_input(decoded, self.shm, ref, tname, datatype, tuple(shape))
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
            inputs[tname] = json_input(tname, datatype, tuple(shape), tensor.get("data"))
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
        if forwarded:  # forwarded headers: after (over) the request's own parameters, as Triton sets them
            decoded.request.parameters = {**(decoded.request.parameters or {}), **forwarded}
        return PendingInfer(decoded, name, version, request_id, in_binary, binary_default, bool(outputs), shm_params)

    @staticmethod
    def encode_infer(pending: PendingInfer, results: dict[str, Any]) -> Any:
        """The answer (JSON, or :class:`Binary`) to a decoded inference request with its outputs."""
        decoded, name, version, request_id = pending.decoded, pending.name, pending.version, pending.request_id
        in_binary, binary_default, outputs, shm_params = (
            pending.in_binary, pending.binary_default, pending.outputs, pending.shm_params)  # fmt: skip
        model = decoded.model
        decoded.check_regions()  # a region shrunk under the request: its data is lost
        answer: dict[str, Any] = {"model_name": name, "model_version": version or "1", "outputs": []}
        if request_id:
            answer["id"] = request_id
        blobs: list[bytes] = []
        for oname, array in results.items():
            datatype = kserve.output_datatype(array)
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
                if datatype == "BYTES":  # (numbers are JSON as they are)
                    flat = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in flat]
                entry["data"] = flat
            answer["outputs"].append(entry)
        return Binary(answer, blobs) if blobs else answer


_FLOATS = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


def json_input(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """An input from its JSON ``data``. A flat list of numbers for a float datatype (what clients
    send) converts in one numpy call; anything else (nested lists, strings, other datatypes, a
    list numpy refuses) takes :func:`_flatten` and ``kserve.array_from_values``, which define the
    result and the errors."""
    floats, count = _FLOATS.get(datatype), math.prod(shape)
    if floats is not None and type(data) is list and len(data) == count and str not in map(type, data):
        try:
            array = np.array(data, dtype=floats)
        except (ValueError, TypeError):
            array = None
        if array is not None and array.ndim == 1:
            return array.reshape(shape)
    return kserve.array_from_values(name, datatype, shape, _flatten(data, count, name))


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
