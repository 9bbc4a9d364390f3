"""The glue between a batch that Triton hands the backend and a Python callable.

The native backend builds one :class:`Request` per Triton request (a dict of
input name -> numpy array, plus ``.parameters``) and calls
:meth:`Binding.execute` once per batch with the list of them.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
import traceback
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from . import tracing
from .config import ModelConfig, Tensor
from .tensors import DATATYPE_VALUE, triton_dtype

log = logging.getLogger("embedtriton")

InferFunc = Callable[[list["Request"]], Sequence[Mapping[str, Any]]]


class Final:
    """The last outputs of a request in an iterative batch-step function (see
    ``SequenceBatcher(iterative=True)``): ``Final(outputs)`` sends them and ends the
    request's stream; ``Final()`` ends it without outputs."""

    __slots__ = ("outputs",)

    def __init__(self, outputs: Mapping[str, Any] | None = None) -> None:
        self.outputs = outputs


class Request(dict):
    """One inference request as the callable sees it: input name -> array.

    Arrays are read-only views of the request's memory while the callable runs
    (a view the callable keeps gets its own copy afterwards). ``parameters`` holds the
    request's parameters (str, int, float or bool values).

    On a sequence model (``ModelConfig(sequence_batcher=...)``) a request also has
    ``correlation_id``, ``sequence_start``, ``sequence_end`` and ``state``: a dict the
    library keeps for the sequence, created at its start, the same object on each of its
    requests, dropped at its end or when Triton ends it for being idle.
    """

    __slots__ = (
        "parameters",
        "correlation_id",
        "sequence_start",
        "sequence_end",
        "sequence_ready",
        "state",
        "_span",
    )

    @property
    def span(self) -> Any:
        """The request's OpenTelemetry span when it is traced (see ``Tracing``), else None."""
        return getattr(self, "_span", None)

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self.items()}
        return f"Request({shapes}, parameters={getattr(self, 'parameters', {})})"


def batch(func: Callable[..., Mapping[str, Any]]) -> InferFunc:
    """Decorate ``func(**inputs) -> outputs`` to serve a whole batch in one call.

    The requests' inputs are concatenated along the batch axis (axis 0) and passed as
    keyword arguments; the returned dict of batched outputs is split back into one dict
    per request, by each request's batch size. A function that takes a ``parameters``
    keyword also gets the requests' parameters: a list with one dict per request.
    """
    wants_parameters = "parameters" in inspect.signature(func).parameters

    def gather(requests: list[Request]) -> tuple[dict[str, Any], list[int]]:
        extra = {"parameters": [r.parameters for r in requests]} if wants_parameters else {}
        if len(requests) == 1:
            return {**requests[0], **extra}, [0]
        names = requests[0].keys()
        inputs = {name: np.concatenate([r[name] for r in requests]) for name in names}
        sizes = [len(next(iter(r.values()))) if r else 1 for r in requests]
        return {**inputs, **extra}, list(np.cumsum(sizes)[:-1])

    def split(outputs: Mapping[str, Any] | None, n: int, bounds: list[int]) -> list[dict[str, Any] | None]:
        if outputs is None:
            return [None] * n
        if n == 1:
            return [dict(outputs)]
        parts = {name: np.split(np.asarray(value), bounds) for name, value in outputs.items()}
        return [{name: p[i] for name, p in parts.items()} for i in range(n)]

    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def run_stream(requests: list[Request]) -> Iterator[list[dict[str, Any] | None]]:
            kwargs, bounds = gather(requests)
            for outputs in func(**kwargs):
                yield split(outputs, len(requests), bounds)

        return run_stream

    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def run_async_stream(requests: list[Request]) -> AsyncIterator[list[dict[str, Any] | None]]:
            kwargs, bounds = gather(requests)
            async for outputs in func(**kwargs):
                yield split(outputs, len(requests), bounds)

        return run_async_stream

    @functools.wraps(func)
    def run(requests: list[Request]) -> list[dict[str, Any] | None]:
        kwargs, bounds = gather(requests)
        return split(func(**kwargs), len(requests), bounds)

    return run


_iterative_bindings: weakref.WeakSet[Binding] = weakref.WeakSet()


def request_done(key: int) -> None:
    """Triton released a streamed request for good: drop its generator wherever it is."""
    for binding in list(_iterative_bindings):
        binding._forget(key)


class Binding:
    """A bound model: what the native backend reads at load time and calls per batch."""

    def __init__(
        self,
        name: str,
        infer_func: InferFunc,
        inputs: list[Tensor],
        outputs: list[Tensor],
        config: ModelConfig,
    ) -> None:
        self.name = name
        self.infer_func = infer_func
        self.inputs = inputs
        self.outputs = outputs
        self.config = config
        self.max_batch_size = config.max_batch_size if config.batching else 0
        self.decoupled = config.decoupled
        self.batch_rule = config.batch_rule
        self.sequence = config.sequence_batcher is not None
        self.iterative = self.sequence and config.sequence_batcher.iterative
        self._gens: dict[int, Iterator[Any]] = {}  # iterative: in-flight request -> its generator
        self._live: dict[int, Request] = {}  # iterative batch-step form: in-flight request -> Request
        self._stepwise = self.iterative and not inspect.isgeneratorfunction(infer_func)
        if self.iterative:
            _iterative_bindings.add(self)
        idle_us = config.sequence_batcher.max_sequence_idle_microseconds if self.sequence else 0
        self._idle_s = idle_us / 1e6
        self._states: dict[Any, dict[str, Any]] = {}  # correlation id -> the sequence's state
        self._last_seen: dict[Any, float] = {}
        # (name, TRITONSERVER_DataType value, dims) per output, read by the backend.
        self.output_specs = [(t.name, DATATYPE_VALUE[triton_dtype(t.dtype)], t.shape) for t in outputs]
        self.loaded_at = 0.0  # time.monotonic() when Triton last finished loading it
        self._alive = 0  # loaded copies of the model in Triton (the backend counts them)
        self._alive_changed = threading.Condition()

    def _loaded(self, delta: int) -> None:
        """Called by the backend when Triton initializes (+1) or finalizes (-1) the model."""
        with self._alive_changed:
            self._alive += delta
            self._alive_changed.notify_all()

    def wait_finalized(self, timeout: float, drain: Callable[[], Any]) -> bool:
        """Wait until Triton has finalized every loaded copy of the model.

        Triton deletes an unloaded model on a thread of its own once the last request
        referring to it is deleted; ``drain`` deletes the requests released meanwhile.
        """
        deadline = time.monotonic() + timeout
        with self._alive_changed:
            while self._alive > 0:
                drain()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._alive_changed.wait(min(left, 0.005))
        return True

    def execute(self, requests: list[Request]) -> list[Any] | Iterator[Any] | str:
        """Run the callable on one batch; an error message (str) when it raised.

        For a decoupled model: an iterator of steps (lists with one outputs dict or None
        per request), ending with an error message (str) if the callable raised.
        """
        if self.sequence:
            return self._execute_sequence(requests)
        traced = tracing.spans_of(requests) if tracing.live_spans else None
        try:
            if traced is None:
                result = self.infer_func(requests)
            else:
                with traced:
                    result = self.infer_func(requests)
        except Exception as exc:
            if traced is not None:
                tracing.mark_failed(requests, exc)
            return self._failed(exc)
        if self.decoupled:
            return self._steps(result, len(requests))
        if type(result) is list:
            return result
        if isinstance(result, (tuple, list)):
            return list(result)
        return (
            f"model '{self.name}' must return a list with one dict of outputs per request; "
            f"it returned {type(result).__name__} (use @batch for a function of batched arrays)"
        )

    def _knows(self, key: int) -> bool:
        return key in self._gens or key in self._live

    def _forget(self, key: int) -> None:
        """A request's caller went away: close its generator."""
        self._live.pop(key, None)
        gen = self._gens.pop(key, None)
        if gen is not None:
            gen.close()

    def _iterate_batch(self, step: list[tuple[int, Request | None]]) -> list[tuple[Any, bool]]:
        """Batch-step form: one call per iteration with every in-flight request; each keeps
        its Request (and ``.state``) across iterations; ``Final(...)`` ends a request."""
        keys = []
        for key, request in step:
            if key is not None and key not in self._live and request is not None:
                request.state = {}
                self._live[key] = request
            keys.append(key if key in self._live else None)
        live = [self._live[k] for k in keys if k is not None]
        try:
            outputs = self.infer_func(live) if live else []
            if not isinstance(outputs, (list, tuple)) or len(outputs) != len(live):
                raise TypeError(f"must return a list with one entry per request ({len(live)})")
        except Exception as exc:
            message = self._failed(exc)
            for k in keys:
                self._live.pop(k, None)
            return [(message if k is not None else None, True) for k in keys]
        answers = iter(outputs)
        results: list[tuple[Any, bool]] = []
        for k in keys:
            if k is None:
                results.append((None, True))
                continue
            out = next(answers)
            if isinstance(out, Final):
                del self._live[k]
                results.append((out.outputs, True))
            else:
                results.append((out, False))
        return results

    def _iterate(self, step: list[tuple[int, Request | None]]) -> list[tuple[Any, bool]]:
        """One scheduling iteration of an iterative model: advance each request's generator
        by one step. Returns (outputs | None | error message, done) per request."""
        if self._stepwise:
            return self._iterate_batch(step)
        results: list[tuple[Any, bool]] = []
        for key, request in step:
            if key is None:  # padding added by the sequence batcher
                results.append((None, True))
                continue
            gen = self._gens.get(key)
            if gen is None:
                if request is None:
                    results.append((f"model '{self.name}' lost track of a request", True))
                    continue
                try:
                    gen = self.infer_func(request)  # type: ignore[arg-type]
                except Exception as exc:
                    results.append((self._failed(exc), True))
                    continue
                if not hasattr(gen, "__next__"):
                    results.append(
                        (
                            f"model '{self.name}' is iterative: its function must be a generator "
                            f"of one request's outputs, not {type(gen).__name__}",
                            True,
                        )
                    )
                    continue
                self._gens[key] = gen
            try:
                results.append((next(gen), False))
            except StopIteration:
                del self._gens[key]
                results.append((None, True))
            except Exception as exc:
                del self._gens[key]
                results.append((self._failed(exc), True))
        return results

    def _include(self, batch: list[Request], candidate: Request) -> bool:
        """Called by Triton's batcher: may ``candidate`` join ``batch`` (the requests accepted
        so far into the batch being formed)? A rule that raises lets the request in."""
        try:
            accepted = bool(self.batch_rule(candidate, batch))  # type: ignore[misc]
        except Exception:
            log.exception("batch_rule of model %r raised; the request joins the batch", self.name)
            accepted = True
        if accepted:
            batch.append(candidate)
        return accepted

    def _execute_sequence(self, requests: list[Request]) -> list[Any] | Iterator[Any] | str:
        """Attach each sequence's state; padding requests (not ready) skip the callable."""
        now = time.monotonic()
        for cid in [c for c, seen in self._last_seen.items() if now - seen > self._idle_s]:
            self._states.pop(cid, None)  # Triton ended it for being idle
            del self._last_seen[cid]
        live = [r for r in requests if r.sequence_ready]
        for r in live:
            cid = r.correlation_id
            if r.sequence_start or cid not in self._states:
                self._states[cid] = {}
            r.state = self._states[cid]
            self._last_seen[cid] = now
        try:
            result = self.infer_func(live) if live else []
        except Exception as exc:
            return self._failed(exc)
        finally:
            for r in live:
                if r.sequence_end:
                    self._states.pop(r.correlation_id, None)
                    self._last_seen.pop(r.correlation_id, None)
        if self.decoupled:
            return self._steps(result, len(live))  # (decoupled sequences: padding not expected)
        if not isinstance(result, (list, tuple)) or len(result) != len(live):
            return f"model '{self.name}' must return a list with one dict of outputs per request"
        answers = iter(result)
        return [next(answers) if r.sequence_ready else None for r in requests]

    def _failed(self, exc: BaseException) -> str:
        log.debug("model %r raised:\n%s", self.name, traceback.format_exc())
        return f"model '{self.name}' raised {type(exc).__name__}: {exc}"

    def _steps(self, result: Any, n: int) -> Iterator[Any]:
        """Drive a (sync or async) generator one step at a time, on the model's thread."""
        if hasattr(result, "__anext__"):
            result = _sync_iterator(result)
        if not hasattr(result, "__next__"):
            yield (
                f"model '{self.name}' is decoupled: its function must be a generator that yields "
                f"one list of outputs (or None) per request at each step, not {type(result).__name__}"
            )
            return
        try:
            while True:
                try:
                    step = next(result)
                except StopIteration:
                    return
                except Exception as exc:
                    yield self._failed(exc)
                    return
                yield list(step) if isinstance(step, tuple) else step
        finally:
            result.close()


def _sync_iterator(agen: Any) -> Iterator[Any]:
    """An async generator as a plain one, driven by a private event loop."""
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        try:
            loop.run_until_complete(agen.aclose())
        finally:
            loop.close()
