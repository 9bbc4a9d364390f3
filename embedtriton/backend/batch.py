"""``@batch``: a function of batched arrays as a callable of requests."""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .request import Request

InferFunc = Callable[[list[Request]], Sequence[Mapping[str, Any]]]


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
