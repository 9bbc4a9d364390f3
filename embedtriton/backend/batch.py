"""``@batch``: a function of batched arrays as a callable of requests."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .request import Request

# what an infer_func returns: one output dict (or None) per request; on a decoupled model a
# (sync or async) generator of such lists; an async infer_func's coroutine
InferOutputs = Sequence[Mapping[str, Any] | None]
InferFunc = Callable[
    [list[Request]], InferOutputs | Iterator[InferOutputs] | AsyncIterator[InferOutputs] | Awaitable[InferOutputs]
]


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
        if any(r.keys() != names for r in requests):  # optional inputs some requests left out
            raise ValueError(
                "@batch cannot concatenate requests that carry different inputs ("
                + ", ".join(sorted({str(sorted(r.keys())) for r in requests}))
                + "): optional inputs were left out by some; handle the requests one group at a time "
                "(a raw infer_func), or fill the missing inputs before batching"
            )
        inputs = {name: concatenate([r[name] for r in requests]) for name in names}
        sizes = [len(next(iter(r.values()))) if r else 1 for r in requests]
        return {**inputs, **extra}, list(itertools.accumulate(sizes[:-1]))

    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def run_stream(requests: list[Request]) -> Iterator[list[dict[str, Any] | None]]:
            kwargs, bounds = gather(requests)
            for outputs in func(**kwargs):
                yield split_outputs(outputs, len(requests), bounds)

        run_stream.batched = True  # type: ignore[attr-defined]
        return run_stream

    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def run_async_stream(requests: list[Request]) -> AsyncIterator[list[dict[str, Any] | None]]:
            kwargs, bounds = gather(requests)
            async for outputs in func(**kwargs):
                yield split_outputs(outputs, len(requests), bounds)

        run_async_stream.batched = True  # type: ignore[attr-defined]
        return run_async_stream

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def run_async(requests: list[Request]) -> list[dict[str, Any] | None]:
            kwargs, bounds = gather(requests)
            return split_outputs(await func(**kwargs), len(requests), bounds)

        run_async.batched = True  # type: ignore[attr-defined]
        return run_async

    @functools.wraps(func)
    def run(requests: list[Request]) -> list[dict[str, Any] | None]:
        kwargs, bounds = gather(requests)
        return split_outputs(func(**kwargs), len(requests), bounds)

    run.batched = True  # type: ignore[attr-defined]
    # What the native backend calls instead of `run` where a batch allows it (numpy host inputs,
    # no tracing, no deadlines: see Binding.fast_batch): the same steps, done in C.
    run.batch_function = func  # type: ignore[attr-defined]
    run.batch_parameters = wants_parameters  # type: ignore[attr-defined]
    return run


def split_outputs(outputs: Mapping[str, Any] | None, n: int, bounds: list[int]) -> list[dict[str, Any] | None]:
    """A @batch function's batched outputs as one dict per request (``bounds``: where each
    request after the first starts, in rows)."""
    if outputs is None:
        return [None] * n
    if not isinstance(outputs, Mapping):
        raise TypeError(
            f"a @batch function must return a dict of arrays (output name -> batched array), "
            f"not {type(outputs).__name__}"
        )
    if n == 1:
        return [dict(outputs)]
    parts = {name: split_rows(value, bounds) for name, value in outputs.items()}
    return [{name: p[i] for name, p in parts.items()} for i in range(n)]


def _is_torch(array: Any) -> bool:
    return type(array).__module__.startswith("torch")


def concatenate(arrays: list[Any]) -> Any:
    """Requests' arrays joined along the batch axis, where they are: numpy (host), cupy (through
    numpy's dispatch to cupy.concatenate) or torch (torch.cat), GPU arrays staying on the GPU."""
    if _is_torch(arrays[0]):
        import torch

        return torch.cat(arrays)
    return np.concatenate(arrays)


def split_rows(value: Any, bounds: list[int]) -> list[Any]:
    """A batched output cut back into one part per request (views, no copy)."""
    if _is_torch(value):
        import torch

        return list(torch.tensor_split(value, bounds))
    if not hasattr(value, "__array_function__"):  # lists, scalars: as numpy arrays (cupy stays cupy)
        value = np.asarray(value)
    if getattr(value, "ndim", 0) >= 1:  # what np.split does along axis 0, without its overhead
        starts = [0, *bounds]
        return [value[start:end] for start, end in zip(starts, [*bounds, None], strict=True)]
    return np.split(value, bounds)  # (raises its error for a 0-d array)


def signature_problem(func: Callable[..., Any]) -> str | None:
    """Why ``func`` cannot take the one argument it is called with (a list of requests, or one
    request), or None. Catches the usual slip: a function of batched arrays without ``@batch``."""
    if getattr(func, "batched", False):
        return None
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return None
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) <= 1 and (positional or any(p.kind is p.VAR_POSITIONAL for p in params)):
        return None
    names = ", ".join(p.name for p in params)
    return (
        f"infer_func({names}) is called with one argument, the list of requests; for a function "
        "of batched arrays (one keyword argument per input), decorate it with @embedtriton.batch"
    )
