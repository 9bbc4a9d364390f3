"""Ray Serve replicas that each embed Triton (``pip install "embedtriton[ray]"``).

Every replica starts its own :class:`~embedtriton.Server`, binds the models with the ``bind``
function it is given, and stops it (draining) when Ray shuts the replica down. Triton batches
inside each replica; Ray Serve spreads requests over the replicas, scales them
(``num_replicas`` or ``autoscaling_config``), places them (``ray_actor_options``: CPUs, GPUs)
and replaces a replica that dies::

    from ray import serve
    from embedtriton.ray import triton_app

    app = triton_app(bind, num_replicas=2, ray_actor_options={"num_cpus": 1})
    handle = serve.run(app)
    outputs = await handle.infer.remote("AddSub", {"a": a, "b": b})  # (or .result() outside asyncio)

Through a handle, inputs and outputs are numpy arrays carried by Ray's own serialization, and
each replica calls the model with the asyncio in-process path. Over Ray Serve's HTTP proxy a
replica answers Triton's KServe-v2 REST protocol (inference with JSON or binary tensors,
health, metadata, config, statistics, generate): ``tritonclient.http`` pointed at the proxy
works unmodified.

A request in flight on a replica that dies fails with Ray's error (``RayActorError`` or
``ActorDiedError``); Ray Serve does not retry it (a model call need not be idempotent), so the
caller retries, as Ray Serve documents. Requests of a sequence (``correlation_id``) must reach
the same replica: Ray's routing does not guarantee that, so serve stateful models from one
replica or route them yourself.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from .config import ServerConfig
from .errors import UnavailableError
from .frontends.http.answers import EventStream, encode, sse_event
from .frontends.http.options import HttpOptions
from .frontends.http.rest import RestApi
from .server import Server

Binder = Callable[[Server], Any]


def _resolve(bind: Binder | str) -> Binder:
    if callable(bind):
        return bind
    module, _, attr = str(bind).partition(":")
    if not module or not attr:
        raise ValueError(f"bind must be a function or 'module:function', not {bind!r}")
    return getattr(importlib.import_module(module), attr)


class TritonDeployment:
    """One Ray Serve replica: an embedded Triton serving the models ``bind`` binds.

    Use it through :func:`triton_app`, or decorate it yourself:
    ``serve.deployment(TritonDeployment, ...).bind(bind, server_config)``.
    """

    def __init__(
        self, bind: Binder | str, server_config: ServerConfig | None = None, max_body_bytes: int = 64 << 20
    ) -> None:
        self.server = Server(server_config)
        _resolve(bind)(self.server)
        self.server.start()
        # the REST routes without a socket: Ray's proxy owns the port (shared memory: another host's)
        self._rest = RestApi(self.server, HttpOptions(shared_memory=False, max_body_bytes=max_body_bytes))
        self.requests = 0

    async def infer(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        """Run one request on ``model`` (``Model.infer_async``); ``options``: :class:`RequestOptions`
        and ``version``. Returns the outputs as numpy arrays."""
        self.requests += 1
        version = options.pop("version", -1)
        return await self.server.model(model, version).infer_async(inputs, **options)

    async def stream(self, model: str, inputs: Mapping[str, Any], **options: Any) -> AsyncIterator[dict[str, Any]]:
        """A decoupled model's responses as they come (call with ``handle.options(stream=True)``)."""
        self.requests += 1
        version = options.pop("version", -1)
        async for outputs in self.server.model(model, version).stream_async(inputs, **options):
            yield outputs

    async def replica(self) -> dict[str, Any]:
        """This replica: its Ray id, process, the requests it took through the handle, and
        Triton's statistics for each model (``inference_count`` against ``execution_count``
        shows its batching). :func:`replica_reports` asks every replica."""
        await asyncio.sleep(0.02)  # (held briefly, so that concurrent asks spread over the replicas)
        try:
            from ray import serve

            context = serve.get_replica_context()
            replica_id = getattr(getattr(context, "replica_id", None), "unique_id", None) or context.replica_tag
        except Exception:  # not inside Ray Serve (a plain instance, as in a unit test)
            replica_id = None
        return {
            "replica": replica_id,
            "pid": os.getpid(),
            "requests": self.requests,
            "models": {model.name: model.statistics() for model in self.server.models()},
        }

    def check_health(self) -> None:
        """Ray Serve's periodic health check: a replica whose Triton is not ready is replaced."""
        if not self.server.ready:
            raise UnavailableError("the embedded Triton server is not ready")

    async def __call__(self, request: Any) -> Any:
        """An HTTP request from Ray Serve's proxy (a Starlette request), answered as Triton's REST
        endpoint answers it."""
        from starlette.responses import Response, StreamingResponse

        path = request.url.path
        root = request.scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        url = f"{path}?{request.url.query}" if request.url.query else path
        headers = {k.encode("latin-1").lower(): v.encode("latin-1") for k, v in request.headers.items()}
        body = await request.body()
        limit = self._rest.options.max_body_bytes
        if len(body) > limit:  # (Ray's proxy has read it all: the answer is Triton's endpoint's)
            status, payload = 413, {"error": f"request body over the limit of {limit} bytes"}
        else:
            status, payload = await self._rest.answer(request.method, url, headers, body)
        if isinstance(payload, EventStream):
            return StreamingResponse(_events(payload), media_type="text/event-stream")
        fields, parts = encode(status, payload, headers.get(b"accept-encoding"))
        return Response(b"".join(parts), status_code=status, headers=dict(fields))

    def __del__(self) -> None:
        """Ray Serve shuts the replica down: drain, then stop Triton."""
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()


async def _events(stream: EventStream) -> AsyncIterator[bytes]:
    try:
        async for event in stream.events:
            yield sse_event(event)
    finally:
        await stream.events.aclose()  # type: ignore[attr-defined]


def replica_reports(handle: Any, replicas: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """:meth:`TritonDeployment.replica` of each of ``replicas`` replicas behind ``handle`` (a
    deployment handle, e.g. what ``serve.run`` returns). Ray Serve has no broadcast: this asks
    several times at once, again and again, until that many distinct replicas answered, or
    raises TimeoutError with those that did. Call it outside a running event loop."""
    seen: dict[Any, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < replicas:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(seen)} of {replicas} replicas answered within {timeout_s:g} s: {sorted(seen)}")
        asks = [handle.replica.remote() for _ in range(2 * replicas + 2)]
        for ask in asks:
            info = ask.result(timeout_s=max(left, 1.0))
            seen[info["replica"]] = info
    return sorted(seen.values(), key=lambda info: str(info["replica"]))


def _check_no_source_tree_in_the_way() -> None:
    """Ray puts the driver's current directory first on its workers' sys.path: started from a
    checkout of embedtriton, the replicas would import the source tree (without its built native
    module) instead of the installed package, and fail to start."""
    here = Path.cwd() / "embedtriton"
    installed = Path(__file__).resolve().parent
    if (here / "__init__.py").exists() and here.resolve() != installed:
        raise UnavailableError(
            f"Ray's workers put the current directory ({Path.cwd()}) first on sys.path, and its embedtriton/ "
            f"folder would shadow the installed package ({installed}) in every replica: start Ray from "
            "another directory (or install embedtriton in place with pip install -e .)"
        )


def triton_app(
    bind: Binder | str,
    *,
    name: str = "Triton",
    server_config: ServerConfig | None = None,
    max_body_bytes: int = 64 << 20,
    **deployment_options: Any,
) -> Any:
    """A Ray Serve application of :class:`TritonDeployment` replicas, for ``serve.run``.

    ``bind``: a function (or ``"module:function"``) that binds models on the :class:`Server` it
    is given, run in every replica; ``server_config``: each replica's :class:`ServerConfig`;
    ``deployment_options``: ``serve.deployment``'s own (``num_replicas``,
    ``autoscaling_config``, ``ray_actor_options={"num_cpus": ..., "num_gpus": ...}``,
    ``max_ongoing_requests``, ``health_check_period_s``...). Ray's ``max_ongoing_requests``
    (default 5) caps the requests in flight per replica: raise it to let Triton's batcher
    gather bigger batches.
    """
    try:
        from ray import serve
    except ImportError:
        raise ImportError('embedtriton.ray needs Ray Serve: pip install "embedtriton[ray]"') from None
    _check_no_source_tree_in_the_way()
    deployment = serve.deployment(TritonDeployment, name=name, **deployment_options)
    return deployment.bind(bind, server_config, max_body_bytes)
