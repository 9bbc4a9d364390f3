"""How a PyTriton inference callable runs on embedtriton: the callable embedtriton binds around
the user's one(s), and what decorators learn about the model they serve.

PyTriton's callable gets a list of requests (mappings input name -> array, with
``.parameters``) and returns one dict of outputs per request, or yields such lists on a
decoupled model: embedtriton's raw callable has the same contract, so requests and answers
pass through untouched. Around each call (and each step of a generator) the model being
served is made current (a context variable), which is how ``@batch``, ``@fill_optionals``,
``@triton_context``... read its configuration. A list of callables is served as that many
model instances, each callable used by one instance thread at a time, as in PyTriton.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import logging
import queue
from collections.abc import Callable, Sequence
from typing import Any

from .exceptions import PyTritonUnrecoverableError, PyTritonValidationError
from .model_config.triton_model_config import TritonModelConfig

log = logging.getLogger("embedtriton.pytriton")


class ModelConfigs(dict):
    """``TritonContext.model_configs``: bound callable -> its model's TritonModelConfig (a bound
    ``__call__`` method is looked up by its object, as the object is what was bound)."""

    @staticmethod
    def _key(func: Any) -> Any:
        if inspect.ismethod(func) and func.__name__ == "__call__":
            return func.__self__
        return func

    def __getitem__(self, func: Any) -> TritonModelConfig:
        return super().__getitem__(self._key(func))

    def __setitem__(self, func: Any, config: TritonModelConfig) -> None:
        super().__setitem__(self._key(func), config)

    def __contains__(self, func: object) -> bool:
        return super().__contains__(self._key(func))


@dataclasses.dataclass
class TritonContext:
    """What ``@triton_context`` passes as ``triton_context``: ``model_configs`` (callable ->
    config, for every callable bound on this Triton) and ``model_config``, the configuration of
    the model whose request is being served."""

    model_configs: ModelConfigs = dataclasses.field(default_factory=ModelConfigs)

    @property
    def model_config(self) -> TritonModelConfig:
        return current().config


@dataclasses.dataclass(frozen=True)
class Served:
    """The model a call serves: its configuration and its Triton's context."""

    config: TritonModelConfig
    context: TritonContext


_current: contextvars.ContextVar[Served | None] = contextvars.ContextVar("embedtriton_pytriton_served", default=None)


def current() -> Served:
    """The model being served by the running call (for decorators)."""
    served = _current.get()
    if served is None:
        # PyTriton's words (a decorator that reads the model's config, called outside a bound model)
        raise PyTritonValidationError("Wrapped function or object must bound with triton to get  __triton_context__")
    return served


def _is_async(func: Any) -> bool:
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def declared_order(names: Sequence[str]) -> Callable[[list[Any]], None]:
    """A function that puts each request's inputs in the order ``names`` declares them (inputs
    not declared last). PyTriton hands a callable its inputs in the model's order whatever order
    the client sent them in, and callables rely on it (``a, b = inputs.values()``); Triton hands
    them over in the request's order."""
    declared = tuple(names)
    rank = {name: i for i, name in enumerate(declared)}
    last = len(declared)

    def reorder(requests: list[Any]) -> None:
        for request in requests:
            if len(request) < 2 or tuple(request) == declared:
                continue
            present = list(request)
            wanted = sorted(present, key=lambda n: rank.get(n, last))
            if present != wanted:
                for name in wanted:  # (the same request object: it keeps .parameters and the rest)
                    request[name] = request.pop(name)

    return reorder


def serving(
    funcs: Sequence[Callable[..., Any]], served: Served, on_unrecoverable: Callable[[BaseException], None]
) -> Any:
    """The callable embedtriton binds for PyTriton callable(s) ``funcs``."""
    reorder = declared_order([spec.name for spec in served.config.inputs or []])
    kinds = {_is_async(f) for f in funcs}
    if len(kinds) > 1:
        raise PyTritonValidationError("a list of inference callables must be all async (async def) or all plain")
    pool: queue.SimpleQueue[Callable[..., Any]] = queue.SimpleQueue()
    for f in funcs:
        pool.put(f)
    single = funcs[0] if len(funcs) == 1 else None

    def take() -> Callable[..., Any]:
        return single if single is not None else pool.get()  # (never waits: one call per instance thread)

    def give_back(func: Callable[..., Any]) -> None:
        if single is None:
            pool.put(func)

    def fatal(exc: BaseException) -> None:
        if isinstance(exc, PyTritonUnrecoverableError):
            log.error("model %r raised PyTritonUnrecoverableError: stopping the server", served.config.model_name)
            on_unrecoverable(exc)

    def steps(gen: Any, func: Callable[..., Any]) -> Any:
        try:
            while True:
                token = _current.set(served)
                try:
                    step = next(gen)
                except StopIteration:
                    return
                except BaseException as exc:
                    fatal(exc)
                    raise
                finally:
                    _current.reset(token)
                yield step
        finally:
            try:
                gen.close()
            finally:
                give_back(func)

    async def async_steps(gen: Any, func: Callable[..., Any]) -> Any:
        try:
            while True:
                token = _current.set(served)
                try:
                    step = await gen.__anext__()
                except StopAsyncIteration:
                    return
                except BaseException as exc:
                    fatal(exc)
                    raise
                finally:
                    _current.reset(token)
                yield step
        finally:
            try:
                await gen.aclose()
            finally:
                give_back(func)

    if kinds == {True}:

        async def infer_async(requests: list[Any]) -> Any:
            reorder(requests)
            func = take()
            token = _current.set(served)
            try:
                return await func(requests)
            except BaseException as exc:
                fatal(exc)
                raise
            finally:
                _current.reset(token)
                give_back(func)

        return infer_async

    def infer(requests: list[Any]) -> Any:
        reorder(requests)
        func = take()
        token = _current.set(served)
        try:
            result = func(requests)
        except BaseException as exc:
            give_back(func)
            fatal(exc)
            raise
        finally:
            _current.reset(token)
        if inspect.isgenerator(result):
            return steps(result, func)
        if inspect.isasyncgen(result):
            return async_steps(result, func)
        give_back(func)
        return result

    return infer
