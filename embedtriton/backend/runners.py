"""One runner per execution mode, chosen once when a model is bound (never tested per batch).

The native backend calls a runner with a batch of :class:`Request` objects on one of
Triton's model-instance threads:

- :class:`Plain`: the callable once per batch, one outputs dict per request back;
- :class:`Decoupled`: the callable is a (sync or async) generator; each step is handed
  back as it comes;
- :class:`Sequence`: a stateful model; each request gets its sequence's ``state``;
  padding requests (not ready) skip the callable; plain or decoupled replies;
- :class:`Iterative`: continuous batching, one generator per request, advanced one step per
  scheduling iteration; :class:`IterativeBatch`: the batch-step form, one call per iteration
  with every request in flight, ``Final(...)`` ending a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
import weakref
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

from .. import tracing
from .request import Final, Request, deadline, deadlines, take_deadline

log = logging.getLogger("embedtriton")

Step = list[tuple[int, "Request | None"]]  # (request key, Request or None), an iteration of an iterative model
Results = list[tuple[Any, bool]]  # (outputs | None | error message, done) per request


LOG_EVERY_S = 10.0  # a failing model's tracebacks are logged at most this often (per model)
_FRAMES = 3  # the callable's innermost frames named in the caller's error
_OWN = str(Path(__file__).resolve().parents[1])  # embedtriton's own frames are not the callable's


class Runner:
    """Calls ``func`` for model ``name``; turns its exceptions into error messages (str)."""

    def __init__(self, name: str, func: Callable[..., Any]) -> None:
        self.name = name
        self.func = func
        self._logged_at = -LOG_EVERY_S
        self._unlogged = 0

    def failed(self, exc: BaseException) -> str:
        """The caller's error for an exception of the callable: type, message and where it was
        raised (its last frames). The traceback goes to the log at ERROR, at most once per
        LOG_EVERY_S per model, so that a model failing under load does not flood the log."""
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_OWN)]
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames[-_FRAMES:]))
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            left_out, self._unlogged, self._logged_at = self._unlogged, 0, now
            more = f" ({left_out} more failures since the last one logged)" if left_out else ""
            log.error("model %r raised%s:\n%s", self.name, more, "".join(traceback.format_exception(exc)).rstrip())
        else:
            self._unlogged += 1
        return f"model '{self.name}' raised {type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")


class Plain(Runner):
    """The callable once per batch; a list with one outputs dict per request back."""

    def execute(self, requests: list[Request]) -> list[Any] | Iterator[Any] | str:
        """Run the callable on one batch; an error message (str) when it raised."""
        traced = tracing.spans_of(requests) if tracing.live_spans else None
        token = deadline.set(take_deadline(requests)) if deadlines.used else None
        try:
            if traced is None:
                result = self.func(requests)
            else:
                with traced:
                    result = self.func(requests)
        except Exception as exc:
            if traced is not None:
                tracing.mark_failed(requests, exc)
            return self.failed(exc)
        finally:
            if token is not None:
                deadline.reset(token)
        return self.reply(result, len(requests))

    def reply(self, result: Any, n: int) -> list[Any] | Iterator[Any] | str:
        if type(result) is list:
            return result
        if isinstance(result, (tuple, list)):
            return list(result)
        return (
            f"model '{self.name}' must return a list with one dict of outputs per request; "
            f"it returned {type(result).__name__} (use @batch for a function of batched arrays)"
        )


class Decoupled(Plain):
    """The callable is a generator: an iterator of steps (lists with one outputs dict or None
    per request), ending with an error message (str) if the callable raised."""

    def reply(self, result: Any, n: int) -> Iterator[Any]:
        return self.steps(result)

    def steps(self, result: Any) -> Iterator[Any]:
        """Drive a (sync or async) generator one step at a time, on the model's thread."""
        if hasattr(result, "__anext__"):
            result = sync_iterator(result)
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
                    yield self.failed(exc)
                    return
                yield list(step) if isinstance(step, tuple) else step
        finally:
            result.close()


class Sequence(Runner):
    """A stateful model: attach each sequence's state; padding requests skip the callable."""

    def __init__(self, name: str, func: Callable[..., Any], idle_us: int, decoupled: bool) -> None:
        super().__init__(name, func)
        self._idle_s = idle_us / 1e6
        self._states: dict[Any, dict[str, Any]] = {}  # correlation id -> the sequence's state
        self._last_seen: dict[Any, float] = {}
        self._decoupled = Decoupled(name, func) if decoupled else None

    def execute(self, requests: list[Request]) -> list[Any] | Iterator[Any] | str:
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
        token = deadline.set(take_deadline(requests)) if deadlines.used else None
        try:
            result = self.func(live) if live else []
        except Exception as exc:
            return self.failed(exc)
        finally:
            if token is not None:
                deadline.reset(token)
            for r in live:
                if r.sequence_end:
                    self._states.pop(r.correlation_id, None)
                    self._last_seen.pop(r.correlation_id, None)
        if self._decoupled is not None:
            return self._decoupled.steps(result)  # (decoupled sequences: padding not expected)
        if not isinstance(result, (list, tuple)) or len(result) != len(live):
            return f"model '{self.name}' must return a list with one dict of outputs per request"
        answers = iter(result)
        return [next(answers) if r.sequence_ready else None for r in requests]


_iterative: weakref.WeakSet[Iterative] = weakref.WeakSet()


def request_done(key: int) -> None:
    """Triton released a streamed request for good: drop its generator wherever it is."""
    for runner in list(_iterative):
        runner.forget(key)


class Iterative(Runner):
    """Continuous batching, generator form: one generator per request, one step per iteration."""

    def __init__(self, name: str, func: Callable[..., Any]) -> None:
        super().__init__(name, func)
        self._gens: dict[int, Generator[Any, Any, Any]] = {}  # in-flight request -> its generator
        _iterative.add(self)

    def execute(self, requests: list[Request]) -> str:
        # The backend hands an iterative model's requests to iterate(), never here.
        return f"model '{self.name}' is iterative: its requests are run by iterate()"

    def knows(self, key: int) -> bool:
        return key in self._gens

    def forget(self, key: int) -> None:
        """A request's caller went away: close its generator."""
        gen = self._gens.pop(key, None)
        if gen is not None:
            gen.close()

    def iterate(self, step: Step) -> Results:
        """One scheduling iteration: advance each request's generator by one step."""
        results: Results = []
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
                    gen = self.func(request)
                except Exception as exc:
                    results.append((self.failed(exc), True))
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
                results.append((self.failed(exc), True))
        return results


class IterativeBatch(Iterative):
    """Continuous batching, batch-step form: one call per iteration with every in-flight
    request; each keeps its Request (and ``.state``) across iterations; ``Final(...)`` ends one,
    an exception object in its place fails it alone."""

    def __init__(self, name: str, func: Callable[..., Any]) -> None:
        super().__init__(name, func)
        self._live: dict[int, Request] = {}  # in-flight request -> its Request
        # func.on_forget(request), when func has one: a request left without its Final (its caller
        # went away, or the function failed), e.g. for embedtriton.openai's step models
        self._on_forget: Callable[[Request], None] | None = getattr(func, "on_forget", None)

    def knows(self, key: int) -> bool:
        return key in self._live

    def forget(self, key: int) -> None:
        request = self._live.pop(key, None)
        if request is not None and self._on_forget is not None:
            try:
                self._on_forget(request)
            except Exception as exc:
                self.failed(exc)  # (logged; nobody else is left to tell)

    def iterate(self, step: Step) -> Results:
        keys = []
        for key, request in step:
            if key is not None and key not in self._live and request is not None:
                request.state = {}
                self._live[key] = request
            keys.append(key if key in self._live else None)
        live = [self._live[k] for k in keys if k is not None]
        try:
            outputs = self.func(live) if live else []
            if not isinstance(outputs, (list, tuple)) or len(outputs) != len(live):
                raise TypeError(f"must return a list with one entry per request ({len(live)})")
        except Exception as exc:
            message = self.failed(exc)
            for k in keys:
                if k is not None:
                    self.forget(k)
            return [(message if k is not None else None, True) for k in keys]
        answers = iter(outputs)
        results: Results = []
        for k in keys:
            if k is None:
                results.append((None, True))
                continue
            out = next(answers)
            if isinstance(out, Final):
                del self._live[k]
                results.append((out.outputs, True))
            elif isinstance(out, BaseException):  # that request alone fails
                del self._live[k]
                results.append((self.failed(out), True))
            else:
                results.append((out, False))
        return results


class Async(Plain):
    """An ``async def`` callable (plain or ``@batch``): ``execute`` hands the backend a
    coroutine, which runs on the library's event loop (:mod:`.aio`) and answers its batch
    there; the model's instance is free for other batches meanwhile, so the callable can await
    other models, its own included."""

    def execute(self, requests: list[Request]) -> Any:
        return self._run(requests)

    async def _run(self, requests: list[Request]) -> list[Any] | Iterator[Any] | str:
        traced = tracing.spans_of(requests) if tracing.live_spans else None
        if deadlines.used:  # (this task's own context)
            deadline.set(take_deadline(requests))
        try:
            if traced is None:
                result = await self.func(requests)
            else:
                with traced:
                    result = await self.func(requests)
        except Exception as exc:
            if traced is not None:
                tracing.mark_failed(requests, exc)
            return self.failed(exc)
        return self.reply(result, len(requests))


def sync_iterator(agen: Any) -> Iterator[Any]:
    """An async generator as a plain one, driven by a private event loop (closed with it)."""
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
