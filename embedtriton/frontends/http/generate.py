"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` (one JSON
answer) and ``/generate_stream`` (Server-Sent Events, one ``data:`` event per response), as
Triton's ``http_server.cc`` maps them:

- a request key that names a model input becomes that input: a scalar or a (flat) list, shaped
  by the input's declared shape (fixed dimensions first, the innermost variable one takes what
  is left, other variable ones are 1); any other key, and the keys of ``"parameters"``, are
  request parameters;
- an answer holds ``model_name``, ``model_version`` and each output by name, a single element
  without its list;
- ``/generate`` expects exactly one response (else Triton's error); errors before the first
  response are JSON errors with a status code, later ones an ``{"error": ...}`` event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import numpy as np

from ...core import Model
from ...core.streams import iterate_async
from ...errors import SERVER_STOPPING, InternalError, InvalidArgumentError, TritonError, UnavailableError
from ...tensors import triton_dtype
from .. import kserve
from .answers import EventStream

ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates "
    "various number of responses"
)


def _shape(name: str, declared: list[int], count: int) -> tuple[int, ...]:
    """The declared shape with ``count`` elements, filled as Triton fills it."""
    shape = list(declared)
    left = count
    for d in shape:
        if d != -1:
            if d == 0 or left % d:
                raise InvalidArgumentError(f"The schema can not convert input '{name}' to tensor with proper shape")
            left //= d
    for i in reversed(range(len(shape))):
        if shape[i] == -1:
            shape[i], left = left, 1
    if left != 1:
        raise InvalidArgumentError(f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


def decode(model: Model, body: bytes) -> kserve.Decoded:
    """The request a generate body describes (inputs, parameters), checked."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"malformed JSON request body: {exc}") from None
    if not isinstance(request, dict):
        raise InvalidArgumentError("the generate request body must be a JSON object")
    declared = {t["name"]: t for t in model.metadata().get("inputs", [])}
    decoded = kserve.Decoded(model)
    inputs: dict[str, Any] = {}
    params: dict[str, Any] = {}
    items: Iterable[tuple[str, Any]]
    for key, value in request.items():
        if key == "parameters" and key not in declared:
            if not isinstance(value, dict):
                raise InvalidArgumentError("'parameters' must be a JSON object")
            items = value.items()
        elif key in declared:
            datatype = declared[key]["datatype"]
            values = value if isinstance(value, list) else [value]
            flat = _flat(key, values)
            shape = _shape(key, declared[key]["shape"], len(flat))
            inputs[key] = kserve.array_from_values(key, datatype, shape, flat)
            continue
        else:
            items = [(key, value)]
        for pname, pvalue in items:
            if not isinstance(pvalue, (str, int, float, bool)):
                raise InvalidArgumentError(f"parameter '{pname}' must be a string, number or boolean")
            params[pname] = pvalue
    decoded.request.inputs = inputs
    kserve.apply_parameters(decoded, params, "")
    return decoded


def _flat(name: str, values: list[Any]) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, (list, dict)) or v is None:
            raise InvalidArgumentError(f"input '{name}': a generate input is a scalar or a flat list of scalars")
        out.append(v.encode() if isinstance(v, str) else v)
    return out


def answer(name: str, version: str, outputs: dict[str, Any]) -> dict[str, Any]:
    """One response as the generate extension writes it."""
    result: dict[str, Any] = {"model_name": name, "model_version": version or "1"}
    for oname, array in outputs.items():
        flat = np.asarray(array).reshape(-1).tolist()
        if triton_dtype(array.dtype) == "BYTES":
            flat = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in flat]
        result[oname] = flat[0] if len(flat) == 1 else flat
    return result


async def generate(
    model: Model, name: str, version: str, body: bytes, stream: bool, draining: bool, stall_timeout_s: float | None
) -> Any:
    """The answer of ``/generate`` (a dict) or ``/generate_stream`` (an :class:`EventStream`
    whose client is disconnected, and its request cancelled, after ``stall_timeout_s`` without
    reading)."""
    if draining:
        raise UnavailableError(SERVER_STOPPING)
    decoded = decode(model, body)
    arrived = asyncio.Event()
    handle = model.submit(decoded.request, asyncio.get_running_loop(), arrived.set, True)
    responses = iterate_async(handle, arrived)
    if not stream:
        try:
            collected = [outputs async for outputs in responses]
        finally:
            await responses.aclose()
        if len(collected) != 1:
            raise InternalError(ONE_RESPONSE)
        return answer(name, version, collected[0])
    try:  # the first response decides the status: an error before it is a JSON error
        first = await responses.__anext__()
    except StopAsyncIteration:
        await responses.aclose()
        return EventStream(_none())
    except BaseException:
        await responses.aclose()
        raise
    return EventStream(_events(name, version, first, responses), stall_timeout_s)


async def _events(
    name: str, version: str, first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    try:
        yield answer(name, version, first)
        async for outputs in rest:
            yield answer(name, version, outputs)
    except TritonError as exc:  # after a 200: the error travels as an event, as Triton sends it
        yield {"error": str(exc)}
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


async def _none() -> AsyncIterator[dict[str, Any]]:
    return
    yield {}  # an async generator that yields nothing
