"""Triton's Vertex AI endpoint (``tritonserver --allow-vertex-ai``, ``src/vertex_ai_server.cc``):
an HTTP server of its own port that answers two routes, named by the environment Vertex AI sets
(``AIP_PREDICT_ROUTE``, ``AIP_HEALTH_ROUTE``), with the semantics of Triton's:

- a GET on a path that fully matches the health route (a regular expression) says whether the
  server is ready (200, else 400);
- a POST on a path that fully matches the predict route is an inference of the default model
  (``vertex_ai_default_model``, or the one model that is ready when the endpoint starts); with
  the header ``X-Vertex-Ai-Triton-Redirect: <path>`` it is redirected to that KServe-v2 path
  instead (``v2/models/M/infer``, ``v2/models/M/config``, ``v2/health/live``, ``metrics``,
  repository and shared memory...; only POST is accepted, and each path answers as its own
  method would);
- anything else is answered 400 with no body.

Inference bodies are JSON, or Triton's binary tensor data when the Content-Type is
``application/vnd.vertex-ai-triton.binary+json;json-header-size=<N>`` (the JSON's size comes
from there, not from ``Inference-Header-Content-Length``). Bodies and answers are never
compressed (Triton reads and writes identity here). The routes themselves are
:class:`~.rest.RestApi`'s: this only maps Vertex AI's requests onto them.
"""

from __future__ import annotations

import re
from typing import Any

from ...core import CoreServer
from ...errors import InvalidArgumentError
from .answers import Refused
from .endpoint import RestEndpoint
from .options import HttpOptions
from .rest import Handler, RestApi

BINARY_MIME_TYPE = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT_HEADER = "X-Vertex-Ai-Triton-Redirect"

# Triton's own KServe-v2 path patterns (http_server.cc), for the redirected requests
_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?")  # fmt: skip
_SERVER = re.compile(r"/v2(?:/health/(live|ready))?")
_SHARED_MEMORY = re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
_REPOSITORY = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")
_MODEL_GETS = {"ready", "config", "stats", None}  # model paths answered as GETs (None: metadata)


def default_model(server: CoreServer, name: str | None) -> str:
    """The model that predictions without a redirect go to: ``name``, which must be ready, or
    the only model that is ready (Triton's rule and wording)."""
    ready = [m.name for m in server.models() for v in server.versions(m.name) if server.model(m.name, v).ready]
    if name is None:
        if len(ready) != 1:
            raise InvalidArgumentError(
                "Expect the model repository contains only a single model if default model is not specified "
                f"(ready: {sorted(ready)}); set the default model (TritonConfig(vertex_ai_default_model=...))"
            )
        return ready[0]
    if name not in ready:
        raise InvalidArgumentError(f"Expect the default model '{name}' is loaded (ready: {sorted(ready)})")
    return name


def _route(pattern: str, variable: str) -> re.Pattern[str]:
    if not pattern:
        raise InvalidArgumentError(f"{variable} is not defined for Vertex AI endpoint")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InvalidArgumentError(f"{variable} {pattern!r} is not a valid regular expression: {exc}") from None


class VertexAiEndpoint(RestEndpoint):
    """Triton's Vertex AI endpoint for ``server`` (see the module's docstring), listening on
    ``options.address``; ``model`` is the default model (see :func:`default_model`)."""

    direct_infer = False  # its routes are its own (resolve)

    def __init__(
        self, server: CoreServer, options: HttpOptions, predict_route: str, health_route: str, model: str
    ) -> None:
        self.predict = _route(predict_route, "AIP_PREDICT_ROUTE")
        self.health = _route(health_route, "AIP_HEALTH_ROUTE")
        self.model_name = model
        super().__init__(server, options)

    async def answer(
        self,
        method: str,
        url: str,
        headers: dict[bytes, bytes],
        body: bytes,
        forwarded: list[tuple[str, bytes]] | None = None,
    ) -> tuple[int, Any]:
        # identity only, both ways: the connection reads accept-encoding from this same dict
        headers.pop(b"content-encoding", None)
        headers.pop(b"accept-encoding", None)
        return await super().answer(method, url, headers, body, forwarded)

    def resolve(self, method: str, url: str) -> tuple[str | None, Handler]:
        """Every request is Vertex AI's: in no restricted-API group (Triton's Vertex AI server
        takes no restrictions), answered by :meth:`_vertex`."""
        return None, lambda h, b, f: self._vertex(method, url, h, b, f)

    async def _via(
        self, method: str, target: str, headers: dict[bytes, bytes], body: bytes, forwarded: Any
    ) -> tuple[int, Any]:
        """The answer of the REST route ``target``."""
        _group, handle = RestApi.resolve(self, method, target)
        return await handle(headers, body, forwarded)

    async def _vertex(
        self, method: str, url: str, headers: dict[bytes, bytes], body: bytes, forwarded: Any
    ) -> tuple[int, Any]:
        path = url.split("?", 1)[0]
        if self.health.fullmatch(path):
            if method != "GET":
                raise Refused(405, "Method Not Allowed")
            return await self._via(method, "/v2/health/ready", headers, body, forwarded)
        if self.predict.fullmatch(path):
            redirect = headers.get(REDIRECT_HEADER.lower().encode())
            if redirect is None:
                how: str | None
                target, how = f"/v2/models/{self.model_name}/infer", "INFER"
            else:
                if method != "POST":
                    raise Refused(405, "Method Not Allowed")
                target = "/" + redirect.decode("latin-1")
                how = self._redirected(target)
            if how == "INFER":
                headers = self._header_length(headers, len(body))
                return await self._via(method, target, headers, body, forwarded)
            if how is not None:
                return await self._via(how, target, headers, body, forwarded)
        return 400, None  # Triton answers anything else with a bare 400

    @staticmethod
    def _redirected(target: str) -> str | None:
        """How a redirect target that Triton's Vertex AI endpoint serves is answered: as a
        "GET", a "POST" or an "INFER" (a POST whose body may be binary); None for a target it
        does not serve."""
        if target in ("/metrics", "/v2/models/stats", "/v2"):
            return "GET"
        model = _MODEL.fullmatch(target)
        if model is not None:
            if model.group(3) == "infer":
                return "INFER"
            if model.group(3) in _MODEL_GETS:
                return "GET"
        if _SERVER.fullmatch(target):
            return "GET"
        shm = _SHARED_MEMORY.fullmatch(target)
        if shm is not None:
            return "GET" if shm.group(2) == "status" else "POST"
        if _REPOSITORY.fullmatch(target):
            return "POST"
        return None

    @staticmethod
    def _header_length(headers: dict[bytes, bytes], size: int) -> dict[bytes, bytes]:
        """The headers with the JSON part's length as the REST routes read it: from Vertex AI's
        binary Content-Type, else the whole body (``Inference-Header-Content-Length`` is not
        read here, as in Triton)."""
        headers = {k: v for k, v in headers.items() if k != b"inference-header-content-length"}
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        at = content_type.find(BINARY_MIME_TYPE)
        if at < 0:
            return headers
        if at != 0:
            raise InvalidArgumentError(
                f"expect MIME type for binary data starts with '{BINARY_MIME_TYPE}', got: {content_type}"
            )
        given = content_type[len(BINARY_MIME_TYPE) :]
        digits = re.match(r"\s*[+-]?\d+", given)  # read as C's atoi does: leading digits, else 0
        length = int(digits.group(0)) if digits else 0
        if length < 0 or length > size:
            raise InvalidArgumentError(f"inference header size should be in range (0, {size}), got: {given}")
        headers[b"inference-header-content-length"] = str(length).encode()
        return headers
