"""``ModelClient`` and ``DecoupledModelClient``: PyTriton's synchronous clients of one model, on
the stock ``tritonclient`` (``http`` or ``grpc``), any KServe-v2 server.

``infer_sample(*inputs, **named_inputs)`` sends one sample (the batch axis is added and taken
off again on a batching model), ``infer_batch`` a batch; positional inputs follow the model's
declared order. The first call waits up to ``init_timeout_s`` (300 s) for the server and the
model, then reads the model's configuration (``lazy_init=False``: at construction); an inference
may take ``inference_timeout_s`` (60 s). Errors: ``PyTritonClientTimeoutError`` (a wait or an
inference ran out of time, or the server could not be reached), ``PyTritonClientInferenceServerError``
(the model or Triton failed the request), ``PyTritonClientValueError`` and its kin for bad
arguments, ``PyTritonClientClosedError`` after ``close()``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
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
from .utils import TritonUrl

__all__ = ["DecoupledModelClient", "ModelClient"]


def _failure(exc: BaseException, timeout_s: float) -> Exception | None:
    """The client error for an exception of tritonclient (None: not one of its failures)."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, InferenceServerException):
        message = exc.message() or str(exc)
        if "Deadline Exceeded" in message:
            return PyTritonClientTimeoutError(
                f"Timeout occurred during inference request. Timeout: {timeout_s} s. Message: {message}"
            )
        return PyTritonClientInferenceServerError(f"Error occurred during inference request. Message: {message}")
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("gevent", "geventhttpclient"):
        return PyTritonClientTimeoutError(
            f"Timeout occurred during inference request. Timeout: {timeout_s} s Message: {exc}"
        )
    return None


class ModelClient(utils.ClientState):
    """Synchronous client of one model (``url``: ``grpc://host:port``, ``http://host:port`` or
    ``host:port``; ``model_version``: None for the latest)."""

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
        if not lazy_init:
            try:
                self._wait_and_init_model_config(self._init_timeout_s)
            except BaseException:
                self.close()
                raise

    @classmethod
    def from_existing_client(cls, existing_client: ModelClient) -> ModelClient:
        """A new client of the same model with the same settings (and its configuration, read once)."""
        return cls(**utils.settings_of(existing_client), ensure_model_is_ready=existing_client._model_config is None)

    def get_lib(self) -> Any:
        """The tritonclient module this client speaks with (``tritonclient.grpc`` or ``tritonclient.http``)."""
        import tritonclient.grpc
        import tritonclient.http

        return {"grpc": tritonclient.grpc, "http": tritonclient.http}[self._triton_url.scheme]

    def _new_client(self, timeout_s: float) -> Any:
        if self._triton_url.scheme == "http":
            return self._lib.InferenceServerClient(
                self._triton_url.without_scheme, connection_timeout=timeout_s, network_timeout=timeout_s
            )
        return self._lib.InferenceServerClient(self._triton_url.without_scheme)

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections; the client cannot be used afterwards."""
        clients, self._general_client, self._infer_client = (self._general_client, self._infer_client), None, None
        for client in clients:
            if client is not None:
                client.close()

    def _require_open(self) -> None:
        if self._general_client is None or self._infer_client is None:
            raise PyTritonClientClosedError("ModelClient is closed")

    def wait_for_server(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the server to be ready (PyTritonClientTimeoutError after)."""
        self._require_open()
        utils.wait_for_server_ready(self._general_client, timeout_s)

    def wait_for_model(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the server and the model to be ready
        (PyTritonClientTimeoutError after)."""
        self._require_open()
        utils.wait_for_model_ready(self._general_client, self._model_name, self._model_version, timeout_s)

    def load_model(self, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Ask the server to load the model (with a config override, as JSON), as PyTriton's client does."""
        self._require_open()
        self._general_client.load_model(self._model_name, config=config, files=files, headers=self._headers)

    def unload_model(self) -> None:
        """Ask the server to unload the model."""
        self._require_open()
        self._general_client.unload_model(self._model_name, headers=self._headers)

    @property
    def model_config(self) -> TritonModelConfig:
        """The model's configuration on the server (waits up to ``init_timeout_s`` for it)."""
        if self._model_config is None:
            self._wait_and_init_model_config(self._init_timeout_s)
        return self._model_config  # type: ignore[return-value]  # set by _wait_and_init_model_config

    @property
    def is_batching_supported(self) -> bool:
        return self.model_config.max_batch_size > 0

    def _wait_and_init_model_config(self, timeout_s: float) -> None:
        import time

        self._require_open()
        deadline = time.monotonic() + timeout_s
        self.wait_for_model(timeout_s)
        self._model_ready = True
        try:
            self._model_config = utils.model_config_of(self._general_client, self._model_name, self._model_version)
        except Exception as exc:
            failure = _failure(exc, max(0.0, deadline - time.monotonic()))
            if failure is None:
                raise
            raise failure from exc

    def infer_sample(
        self,
        *inputs: Any,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named: Any,
    ) -> dict[str, np.ndarray]:
        """One sample (inputs without the batch axis) -> its outputs (without the batch axis)."""
        utils.check_call(inputs, named, parameters, headers)
        if self.is_batching_supported:
            inputs = tuple(x[np.newaxis, ...] for x in inputs)
            named = {k: v[np.newaxis, ...] for k, v in named.items()}
        return self._debatch(self._infer(inputs or named, parameters, headers))

    def infer_batch(
        self,
        *inputs: Any,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named: Any,
    ) -> dict[str, np.ndarray]:
        """A batch (inputs with the batch axis first) -> batched outputs."""
        utils.check_call(inputs, named, parameters, headers)
        if not self.is_batching_supported:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {self.model_config.model_name} doesn't support batching - use infer_sample method instead"
            )
        return self._infer(inputs or named, parameters, headers)

    def _debatch(self, result: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: value[0] for name, value in result.items()} if self.is_batching_supported else result

    def _request(self, inputs: Any) -> tuple[list[Any], list[Any]]:
        self._require_open()
        if not self._model_ready:
            self._wait_and_init_model_config(self._init_timeout_s)
        config = self.model_config
        if isinstance(inputs, tuple):
            inputs = utils.named_inputs(config, inputs, {})
        return utils.build_request(self._lib, config, inputs)

    def _infer(self, inputs: Any, parameters: Any, headers: Any) -> dict[str, np.ndarray]:
        if self.model_config.decoupled:
            raise PyTritonClientInferenceServerError("Model config is decoupled. Use DecoupledModelClient instead.")
        wrapped, outputs = self._request(inputs)
        extra = {"client_timeout": self._inference_timeout_s} if self._triton_url.scheme == "grpc" else {}
        try:
            result = self._infer_client.infer(
                model_name=self._model_name,
                inputs=wrapped,
                model_version=self._model_version or "",
                outputs=outputs,
                request_id=str(next(self._request_ids)),
                headers={**(self._headers or {}), **(headers or {})} or None,
                parameters=parameters,
                **extra,
            )
        except Exception as exc:
            failure = _failure(exc, self._inference_timeout_s)
            if failure is None:
                raise
            raise failure from exc
        return utils.result_arrays(result)


class DecoupledModelClient(ModelClient):
    """Client of a decoupled (streaming) model, over gRPC only: ``infer_sample`` and
    ``infer_batch`` return an iterator of the responses' outputs, one inference at a time.
    ``inference_timeout_s`` bounds the wait for each next response."""

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
    ) -> None:
        if TritonUrl.from_url(url).scheme != "grpc":
            raise PyTritonClientValueError("DecoupledModelClient is only supported for grpc protocol")
        self._responses: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._busy = threading.Lock()
        self._streaming = False
        super().__init__(
            url,
            model_name,
            model_version,
            lazy_init=lazy_init,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
            model_config=model_config,
            ensure_model_is_ready=ensure_model_is_ready,
        )

    def close(self) -> None:
        """Stop the response stream (cancelling its requests), then close the connections."""
        if self._infer_client is not None and self._streaming:
            self._infer_client.stop_stream(cancel_requests=True)
            self._streaming = False
        super().close()

    def _debatch(self, result: Any) -> Any:
        if self.is_batching_supported:
            return ({name: value[0] for name, value in step.items()} for step in result)
        return result

    def _on_response(self, result: Any, error: Any) -> None:
        """(gRPC's thread) Queue a response as (request id, outputs | None at the end | error)."""
        if error is not None:
            self._responses.put((None, error))
            return
        response = result.get_response()
        outputs = utils.result_arrays(result)
        final = response.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            if outputs:  # (a final response that carries outputs too)
                self._responses.put((response.id, outputs))
            self._responses.put((response.id, None))
        else:
            self._responses.put((response.id, outputs))

    # PyTriton's API: a decoupled model's inference yields its responses instead of returning one
    def _infer(  # type: ignore[override]
        self, inputs: Any, parameters: Any, headers: Any
    ) -> Iterator[dict[str, np.ndarray]]:
        if not self._busy.acquire(blocking=False):
            raise PyTritonClientInferenceServerError("Inference is already in progress")
        try:
            if not self.model_config.decoupled:
                raise PyTritonClientInferenceServerError("Model config is coupled. Use ModelClient instead.")
            if parameters is not None:
                raise PyTritonClientValueError("DecoupledModelClient does not support parameters")
            if headers is not None:
                raise PyTritonClientValueError("DecoupledModelClient does not support headers")
            wrapped, outputs = self._request(inputs)
            if not self._streaming:
                self._infer_client.start_stream(callback=self._on_response, headers=self._headers)
                self._streaming = True
            request_id = str(next(self._request_ids))
            self._infer_client.async_stream_infer(
                model_name=self._model_name,
                inputs=wrapped,
                model_version=self._model_version or "",
                outputs=outputs,
                request_id=request_id,
                enable_empty_final_response=True,
            )
        except BaseException as exc:
            self._busy.release()
            failure = _failure(exc, self._inference_timeout_s) if isinstance(exc, Exception) else None
            if failure is None:
                raise
            raise failure from exc
        return self._iterate(request_id)

    def _iterate(self, request_id: str) -> Iterator[dict[str, np.ndarray]]:
        try:
            while True:
                try:
                    answered, item = self._responses.get(timeout=self._inference_timeout_s)
                except queue.Empty:
                    raise PyTritonClientTimeoutError(
                        f"Timeout occurred during inference request. Timeout: {self._inference_timeout_s} s"
                    ) from None
                if answered is not None and answered != request_id:
                    continue  # the rest of an earlier inference its caller stopped reading
                if item is None:
                    return
                if isinstance(item, Exception):
                    failure = _failure(item, self._inference_timeout_s)
                    raise (failure or item) from item
                yield item
        finally:
            self._busy.release()
