"""``AsyncioModelClient`` and ``AsyncioDecoupledModelClient``: PyTriton's asyncio clients, on
``tritonclient.http.aio`` / ``tritonclient.grpc.aio``. The same arguments, timeouts and errors
as :class:`~.client.ModelClient`; ``await client.model_config`` (an awaitable property, as in
PyTriton); ``async with``. The decoupled client (gRPC only) yields responses as they come."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np

from ..exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from ..model_config.triton_model_config import TritonModelConfig
from . import utils
from .client import _failure

__all__ = ["AsyncioDecoupledModelClient", "AsyncioModelClient"]


async def _ask(check: Callable[[], Awaitable[Any]]) -> bool:
    from tritonclient.utils import InferenceServerException

    try:
        return bool(await check())
    except (InferenceServerException, OSError, asyncio.TimeoutError):
        return False
    except Exception as exc:  # aiohttp's and grpc's own error types
        if type(exc).__module__.split(".")[0] in ("aiohttp", "grpc"):
            return False
        raise


def _server_failure(exc: BaseException) -> Exception | None:
    """The asyncio clients' error for tritonclient's InferenceServerException (PyTriton's
    wording: their messages differ from the synchronous clients')."""
    from tritonclient.utils import InferenceServerException

    if not isinstance(exc, InferenceServerException):
        return None
    message = f"Error occurred on Triton Inference Server side:\n {exc.message() or exc}"
    if "Deadline Exceeded" in message:
        return PyTritonClientTimeoutError(message)
    return PyTritonClientInferenceServerError(message)


class AsyncioModelClient(utils.ClientState):
    """asyncio client of one model; see :class:`~.client.ModelClient` for the arguments."""

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        model_config: TritonModelConfig | None = None,
        ensure_model_is_ready: bool = True,
        access_token: str | None = None,
    ) -> None:
        utils.set_up(
            self, url, model_name, model_version, init_timeout_s, inference_timeout_s, access_token,
            model_config, ensure_model_is_ready, lazy_init,
        )  # fmt: skip

    @classmethod
    def from_existing_client(cls, existing_client: Any) -> Any:
        """A new client of the same class, model and settings as ``existing_client`` (any of the
        model clients), sharing its configuration once read (the model is then not waited for)."""
        return cls(**utils.settings_of(existing_client), ensure_model_is_ready=False)

    def get_lib(self) -> Any:
        """The asyncio tritonclient module this client speaks with (``tritonclient.grpc.aio`` or
        ``tritonclient.http.aio``)."""
        import tritonclient.grpc.aio
        import tritonclient.http.aio

        return {"grpc": tritonclient.grpc.aio, "http": tritonclient.http.aio}[self._triton_url.scheme]

    def _new_client(self, timeout_s: float) -> Any:
        if self._triton_url.scheme == "http":
            return self._lib.InferenceServerClient(self._triton_url.without_scheme, conn_timeout=timeout_s)
        return self._lib.InferenceServerClient(self._triton_url.without_scheme)

    async def __aenter__(self) -> AsyncioModelClient:
        try:
            if not self._lazy_init:
                await self._wait_and_init_model_config(self._init_timeout_s)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections; the client cannot be used afterwards."""
        clients, self._general_client, self._infer_client = (self._general_client, self._infer_client), None, None
        for client in clients:
            if client is not None:
                await client.close()

    def _require_open(self) -> None:
        if self._general_client is None or self._infer_client is None:
            raise PyTritonClientClosedError("AsyncioModelClient is closed")

    async def wait_for_model(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the server and the model (PyTritonClientTimeoutError after)."""
        self._require_open()
        client, name, version = self._general_client, self._model_name, self._model_version or ""

        async def ready() -> None:
            pause = 0.02
            while not (
                await _ask(client.is_server_live)
                and await _ask(client.is_server_ready)
                and await _ask(lambda: client.is_model_ready(name, version))
            ):
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

        try:
            await asyncio.wait_for(ready(), timeout_s)
        except asyncio.TimeoutError:
            raise PyTritonClientTimeoutError(
                f"Timeout while waiting for model {name} to be ready for {timeout_s}s"
            ) from None

    async def _wait_and_init_model_config(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        await self.wait_for_model(timeout_s)
        self._model_ready = True
        client, name, version = self._general_client, self._model_name, self._model_version or ""
        try:
            if self._triton_url.scheme == "grpc":
                raw = (await client.get_model_config(name, version, as_json=True))["config"]
            else:
                raw = await client.get_model_config(name, version)
        except Exception as exc:
            failure = _failure(exc, max(0.0, deadline - time.monotonic()))
            if failure is None:
                raise
            raise failure from exc
        self._model_config = utils.parse_triton_config(raw)

    @property
    async def model_config(self) -> TritonModelConfig:
        """The model's configuration on the server (``await client.model_config``)."""
        if self._model_config is None:
            await self._wait_and_init_model_config(self._init_timeout_s)
        return self._model_config  # type: ignore[return-value]  # set by _wait_and_init_model_config

    async def _prepared(self, inputs: Any) -> tuple[TritonModelConfig, list[Any], list[Any]]:
        self._require_open()
        if not self._model_ready:
            await self._wait_and_init_model_config(self._init_timeout_s)
        config = await self.model_config
        if isinstance(inputs, tuple):
            inputs = utils.named_inputs(config, inputs, {})
        return config, *utils.build_request(self._lib, config, inputs)

    async def infer_sample(
        self,
        *inputs: Any,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named: Any,
    ) -> Any:
        """One sample (inputs without the batch axis) -> its outputs (without the batch axis)."""
        utils.check_call(inputs, named, parameters, headers)
        batching = (await self.model_config).max_batch_size > 0
        if batching:
            inputs = tuple(x[np.newaxis, ...] for x in inputs)
            named = {k: v[np.newaxis, ...] for k, v in named.items()}
        result = await self._infer(inputs or named, parameters, headers)
        return {k: v[0] for k, v in result.items()} if batching else result

    async def infer_batch(
        self,
        *inputs: Any,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named: Any,
    ) -> Any:
        """A batch (inputs with the batch axis first) -> batched outputs."""
        utils.check_call(inputs, named, parameters, headers)
        config = await self.model_config
        if config.max_batch_size <= 0:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {config.model_name} doesn't support batching - use infer_sample method instead"
            )
        return await self._infer(inputs or named, parameters, headers)

    async def _infer(self, inputs: Any, parameters: Any, headers: Any) -> dict[str, np.ndarray]:
        config, wrapped, outputs = await self._prepared(inputs)
        if config.decoupled:
            raise PyTritonClientInferenceServerError(
                "Model config is decoupled. Use AsyncioDecoupledModelClient instead."
            )
        extra = {"client_timeout": self._inference_timeout_s} if self._triton_url.scheme == "grpc" else {}
        try:
            result = await self._infer_client.infer(
                model_name=self._model_name,
                inputs=wrapped,
                model_version=self._model_version or "",
                outputs=outputs,
                request_id=str(next(self._request_ids)),
                headers={**(self._headers or {}), **(headers or {})} or None,
                parameters=parameters,
                **extra,
            )
        except asyncio.TimeoutError as exc:
            raise PyTritonClientTimeoutError(
                f"Timeout exceeded while running inference for {self._model_name}"
            ) from exc
        except Exception as exc:
            failure = _server_failure(exc) or _failure(exc, self._inference_timeout_s)
            if failure is None:
                raise
            raise failure from exc
        return utils.result_arrays(result)


class AsyncioDecoupledModelClient(AsyncioModelClient):
    """asyncio client of a decoupled model: ``infer_sample``/``infer_batch`` are async
    generators of the responses' outputs; ``inference_timeout_s`` bounds each wait. Streaming
    needs gRPC: as with PyTriton, an ``http://`` client can be made and read the model's config,
    and its first inference raises ``PyTritonClientValueError``."""

    async def infer_sample(  # type: ignore[override]
        self,
        *inputs: Any,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named: Any,
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """One sample -> an async iterator of each response's outputs (without the batch axis)."""
        utils.check_call(inputs, named, parameters, headers)
        batching = (await self.model_config).max_batch_size > 0
        if batching:
            inputs = tuple(x[np.newaxis, ...] for x in inputs)
            named = {k: v[np.newaxis, ...] for k, v in named.items()}
        async for result in self._stream(inputs or named, parameters, headers):
            yield {k: v[0] for k, v in result.items()} if batching else result

    async def infer_batch(  # type: ignore[override]
        self,
        *inputs: Any,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named: Any,
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """A batch -> an async iterator of each response's batched outputs."""
        utils.check_call(inputs, named, parameters, headers)
        config = await self.model_config
        if config.max_batch_size <= 0:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {config.model_name} doesn't support batching - use infer_sample method instead"
            )
        async for result in self._stream(inputs or named, parameters, headers):
            yield result

    async def _stream(self, inputs: Any, parameters: Any, headers: Any) -> AsyncIterator[dict[str, np.ndarray]]:
        config = await self.model_config
        if not config.decoupled:
            raise PyTritonClientInferenceServerError("Model config is coupled. Use AsyncioModelClient instead.")
        _, wrapped, outputs = await self._prepared(inputs)
        if self._triton_url.scheme != "grpc":
            raise PyTritonClientValueError("AsyncioDecoupledModelClient is only supported for grpc protocol")
        request = {
            "model_name": self._model_name,
            "inputs": wrapped,
            "model_version": self._model_version or "",
            "outputs": outputs,
            "request_id": str(next(self._request_ids)),
            "parameters": parameters,
        }

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield request  # then the client half-closes: the stream ends after the request's last response

        responses = self._infer_client.stream_infer(
            inputs_iterator=requests(), headers={**(self._headers or {}), **(headers or {})} or None
        )
        finished = False
        try:
            while True:
                try:
                    result, error = await asyncio.wait_for(responses.__anext__(), self._inference_timeout_s)
                except StopAsyncIteration:
                    finished = True
                    return
                except asyncio.TimeoutError:
                    raise PyTritonClientTimeoutError(
                        f"Timeout while waiting for model {self._model_name} to return next response "
                        f"{self._inference_timeout_s}s"
                    ) from None
                if error is not None:
                    raise (_server_failure(error) or _failure(error, self._inference_timeout_s) or error) from error
                outputs_now = utils.result_arrays(result)
                if outputs_now:
                    yield outputs_now
        finally:
            cancel = getattr(responses, "cancel", None)  # (older tritonclient releases lack it)
            if not finished and cancel is not None:  # the caller stopped reading, or it failed
                cancel()
