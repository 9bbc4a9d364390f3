"""``FuturesModelClient``: PyTriton's client whose calls return ``concurrent.futures.Future``s,
run by up to ``max_workers`` threads (each with its own :class:`~.client.ModelClient`) from a
queue of at most ``max_queue_size`` calls; ``non_blocking=True`` makes a full queue raise
``PyTritonClientQueueFullError`` at once (else a call waits, up to ``inference_timeout_s`` when
given)."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any

from ..exceptions import PyTritonClientClosedError, PyTritonClientQueueFullError
from ..model_config.triton_model_config import TritonModelConfig
from . import utils
from .client import ModelClient

__all__ = ["FuturesModelClient"]

_CLOSE = object()  # a worker's signal to leave


class FuturesModelClient:
    """Thread-pool client of one model; every method returns a Future."""

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        max_workers: int | None = 128,
        max_queue_size: int | None = 128,
        non_blocking: bool = False,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
    ) -> None:
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if max_queue_size is not None and max_queue_size <= 0:
            raise ValueError("max_queue_size must be greater than 0")
        utils.TritonUrl.from_url(url)  # an invalid URL fails here, not in a worker
        self._url = url
        self._model_name = model_name
        self._model_version = model_version
        self._max_workers = max_workers
        self._non_blocking = non_blocking
        self._init_timeout_s = utils.DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else init_timeout_s
        self._inference_timeout_s = inference_timeout_s
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue_size or 0)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._config: TritonModelConfig | None = None  # read once, shared by the workers' clients

    def __enter__(self) -> FuturesModelClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self, wait: bool = True) -> None:
        """Stop the workers once the queued calls are done (``wait``: until they are)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(_CLOSE)
        if wait:
            for thread in threads:
                thread.join()

    def wait_for_model(self, timeout_s: float) -> Future:
        """A future of :meth:`ModelClient.wait_for_model`, run on a worker thread."""
        return self._submit("wait_for_model", timeout_s)

    def model_config(self) -> Future:
        """A future of the model's configuration."""
        return self._submit("model_config")

    def infer_sample(
        self,
        *inputs: Any,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named: Any,
    ) -> Future:
        """A future of :meth:`ModelClient.infer_sample`'s outputs."""
        return self._submit("infer_sample", (inputs, parameters, headers, named))

    def infer_batch(
        self,
        *inputs: Any,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named: Any,
    ) -> Future:
        """A future of :meth:`ModelClient.infer_batch`'s outputs."""
        return self._submit("infer_batch", (inputs, parameters, headers, named))

    def _submit(self, what: str, args: Any = None) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise PyTritonClientClosedError("FutureModelClient is already closed")
            if self._max_workers is None or len(self._threads) < self._max_workers:
                if len(self._threads) <= self._queue.qsize() or not self._threads:
                    thread = threading.Thread(target=self._work, name="pytriton-futures-client", daemon=True)
                    self._threads.append(thread)
                    thread.start()
        try:
            if self._non_blocking:
                self._queue.put_nowait((future, what, args))
            else:
                self._queue.put((future, what, args), timeout=self._inference_timeout_s)
        except queue.Full:
            raise PyTritonClientQueueFullError("Queue is full") from None
        return future

    def _client(self) -> ModelClient:
        return ModelClient(
            self._url,
            self._model_name,
            self._model_version,
            init_timeout_s=self._init_timeout_s,
            inference_timeout_s=self._inference_timeout_s,
            model_config=self._config,
            ensure_model_is_ready=self._config is None,
        )

    def _work(self) -> None:
        client: ModelClient | None = None
        try:
            while True:
                item = self._queue.get()
                if item is _CLOSE:
                    return
                future, what, args = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    if client is None:
                        client = self._client()
                    future.set_result(self._run(client, what, args))
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            if client is not None:
                client.close()
            _leave_gevent_hub()

    def _run(self, client: ModelClient, what: str, args: Any) -> Any:
        if what == "wait_for_model":
            return client.wait_for_model(args)
        if what == "model_config":
            result: Any = client.model_config
        else:
            inputs, parameters, headers, named = args
            call = client.infer_sample if what == "infer_sample" else client.infer_batch
            result = call(*inputs, parameters=parameters, headers=headers, **named)
        if self._config is None:
            self._config = client._model_config
        return result


def _leave_gevent_hub() -> None:
    """tritonclient.http runs on gevent, which keeps a hub per thread: free this thread's."""
    import sys

    gevent = sys.modules.get("gevent")
    if gevent is not None:
        hub = gevent.get_hub()
        hub.destroy()
