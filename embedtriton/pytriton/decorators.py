"""PyTriton's inference-callable decorators, with its semantics, on embedtriton.

Two kinds, as in PyTriton. Request-list decorators take the list of requests (mappings input
name -> array): ``batch``, ``sample``, ``group_by_keys``, ``fill_optionals``, ``first_value``
(both kinds). Keyword decorators sit below ``@batch`` and take the batched inputs as keyword
arguments: ``group_by_values``, ``pad_batch``, ``first_value``, ``triton_context``. All of them
also decorate methods (``@batch def __call__(self, x)``). Those that need the model's
configuration read the model being served (so they work on a bound callable; called outside one,
they say so).

Differences from PyTriton: ``@pad_batch`` cuts outputs of the padded size back to the rows that
came in (PyTriton leaves that to the function, and its ``@batch`` refuses the padded outputs);
``triton_context.model_config`` is the served model's configuration (PyTriton documents it, its
object lacks it); ``group_by_values`` ignores keys a batch does not carry.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ._serving import ModelConfigs, TritonContext, current
from .exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from .model_config.triton_model_config import TritonModelConfig

__all__ = [
    "TRITON_CONTEXT_FIELD_NAME",
    "ConstantPadder",
    "InferenceRequest",
    "InferenceRequests",
    "InferenceResult",
    "InferenceResults",
    "InputNames",
    "ModelConfigDict",
    "TritonContext",
    "batch",
    "convert_output",
    "fill_optionals",
    "first_value",
    "get_inference_request_batch_size",
    "get_model_config",
    "get_triton_context",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
    "triton_context",
]

TRITON_CONTEXT_FIELD_NAME = "triton_context"  # the keyword argument @triton_context adds (PyTriton's name)
_SPECIAL = (TRITON_CONTEXT_FIELD_NAME, "__triton_context__")  # keyword arguments that are not inputs

# PyTriton's names for what callables take and return, for type hints
InputNames = list[str]
InferenceRequest = dict[str, np.ndarray]
InferenceRequests = list[InferenceRequest] | tuple[InferenceRequest, ...]
InferenceResult = dict[str, np.ndarray]
InferenceResults = list[InferenceResult] | tuple[InferenceResult, ...]
ModelConfigDict = ModelConfigs  # TritonContext.model_configs: callable -> its model's TritonModelConfig


def get_model_config(*_: Any) -> TritonModelConfig:
    """The configuration of the model being served (for custom decorators)."""
    return current().config


def get_triton_context(*_: Any) -> TritonContext:
    """The TritonContext of the Triton serving the running call."""
    return current().context


def get_inference_request_batch_size(request: Mapping[str, np.ndarray]) -> int:
    """A request's batch size: the first dimension of its first input."""
    return int(next(iter(request.values())).shape[0])


def convert_output(outputs: Any, *_: Any, model_config: TritonModelConfig | None = None) -> dict[str, Any]:
    """A callable's outputs as a dict: a list or tuple is matched to the declared outputs in order."""
    if isinstance(outputs, dict):
        return outputs
    if isinstance(outputs, (list, tuple)):
        config = model_config or current().config
        declared = config.outputs or []
        if len(outputs) != len(declared):
            raise PyTritonValidationError("Outputs length different than config outputs length")
        return {spec.name: value for spec, value in zip(declared, outputs, strict=True)}
    raise PyTritonValidationError(f"Unsupported output type {type(outputs)}.")


def _split(outputs: Any, requests: list[Any]) -> list[dict[str, Any]]:
    """Batched outputs cut back into one dict per request, by each request's batch size."""
    outputs = convert_output(outputs)
    sizes = [get_inference_request_batch_size(r) for r in requests]
    total = sum(sizes)
    wrong = {name: np.shape(value) for name, value in outputs.items() if np.shape(value)[:1] != (total,)}
    if wrong:  # (PyTriton's words)
        raise ValueError(
            "Received output tensors with different batch sizes: "
            f"{', '.join(f'{name}: {shape}' for name, shape in wrong.items())}. Expected batch size: {total}. "
        )
    answers, start = [], 0
    for size in sizes:
        answers.append({name: value[start : start + size] for name, value in outputs.items()})
        start += size
    return answers


def batch(func: Callable[..., Any]) -> Callable[..., Any]:
    """Requests -> one call with each input concatenated along the batch axis (keyword
    arguments); the returned batched outputs (a dict, or a list in the declared order) are cut
    back into one dict per request. A generator's every yield is cut the same way. Requests
    with different sets of inputs cannot be batched: put ``@group_by_keys`` above."""

    def gather(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], list[Any], dict[str, Any]]:
        *lead, requests = args
        names = requests[0].keys()
        if any(r.keys() != names for r in requests[1:]):  # (@group_by_keys above @batch groups them)
            raise PyTritonValidationError("Cannot batch requests with different set of inputs keys")
        inputs = {name: np.concatenate([r[name] for r in requests]) for name in names}
        return tuple(lead), requests, {**kwargs, **inputs}

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def run_async(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            lead, requests, call = gather(args, kwargs)
            return _split(await func(*lead, **call), requests)

        return run_async

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        lead, requests, call = gather(args, kwargs)
        result = func(*lead, **call)
        if inspect.isgenerator(result):
            return (_split(step, requests) for step in result)
        return _split(result, requests)

    return run


def sample(func: Callable[..., Any]) -> Callable[..., Any]:
    """For models without batching: the first request's inputs as keyword arguments; its
    outputs (a dict, or a list in the declared order) as the one answer."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        *lead, requests = args
        result = func(*lead, **{**kwargs, **requests[0]})
        if inspect.isgenerator(result):
            return ([convert_output(step)] for step in result)
        return [convert_output(result)]

    return run


def group_by_keys(func: Callable[..., Any]) -> Callable[..., Any]:
    """Calls ``func`` once per group of requests that carry the same set of inputs (optional
    inputs make groups), answers back in the requests' order. The groups are called in
    PyTriton's order: by their sorted input names."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        *lead, requests = args
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(tuple(sorted(request.keys())), []).append(i)
        if len(groups) == 1:
            return func(*lead, requests, **kwargs)
        answers: list[Any] = [None] * len(requests)
        for _, indices in sorted(groups.items()):
            result = func(*lead, [requests[i] for i in indices], **kwargs)
            if inspect.isgenerator(result):
                result.close()
                raise PyTritonRuntimeError(
                    "@group_by_keys: a generator (decoupled model) cannot answer several groups in one batch"
                )
            for i, answer in zip(indices, result, strict=True):
                answers[i] = answer
        return answers

    return run


def _serialized(value: np.ndarray) -> bytes:
    """A bytes tensor as Triton serializes it (length-prefixed items after the total length),
    which is how PyTriton compares such values."""
    if value.size == 0:
        return b""
    items = [
        item if isinstance(item, bytes) else str(item).encode("utf-8") for item in value.reshape(-1, order="C").tolist()
    ]
    body = b"".join(struct.pack("<I", len(item)) + item for item in items)
    return struct.pack("<I", len(body)) + body


def _row_key(value: Any, row: int) -> Any:
    """What PyTriton groups and orders a row of an input by: the row's raw bytes (serialized
    bytes for string inputs), or the value itself when the row is a scalar."""
    item = value[row]
    if not isinstance(item, np.ndarray):
        return item
    if item.dtype == np.object_ or item.dtype.type == np.bytes_:
        return _serialized(item)
    return item.tobytes()


class ConstantPadder:
    """``pad_fn`` for ``group_by_values``: pads the groups' outputs to a common shape with
    ``pad_value`` (``b""`` for strings) so they merge into one batch."""

    def __init__(self, pad_value: Any = 0) -> None:
        self.pad_value = pad_value

    def __call__(self, batches: Any) -> list[dict[str, np.ndarray]]:
        names = list(dict.fromkeys(name for b in batches for name in b))
        out: list[dict[str, np.ndarray]] = [{} for _ in batches]
        for name in names:
            present = [b[name] for b in batches if name in b]
            kinds = {a.dtype.kind for a in present}
            if len(kinds) > 1 or (kinds - {"S", "U"} and len({a.dtype for a in present}) > 1):
                raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
            dtype = (
                max((a.dtype for a in present), key=lambda d: d.itemsize) if kinds <= {"S", "U"} else present[0].dtype
            )
            shape = tuple(np.max([a.shape[1:] for a in present], axis=0).tolist())
            fill = b"" if dtype.kind in "SUO" else self.pad_value
            for i, b in enumerate(batches):
                if name in b:
                    a = b[name]
                    widths = [(0, 0)] + [(0, want - have) for have, want in zip(a.shape[1:], shape, strict=True)]
                    out[i][name] = np.pad(a, widths, mode="constant", constant_values=fill).astype(dtype)
        return out


def group_by_values(*keys: str, pad_fn: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    """Below ``@batch``: splits the batch into groups of rows that have the same values in the
    inputs ``keys``, calls the function once per group and merges the outputs back in row
    order (``pad_fn``, e.g. ``ConstantPadder()``, first evens out the groups' output shapes).
    The groups are called in PyTriton's order: sorted by the keys' raw bytes (the value itself
    for a scalar row), rows in their order within a group."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            inputs = {k: v for k, v in kwargs.items() if k not in _SPECIAL}
            if not inputs:  # handed the request list: @batch is below, not above
                raise PyTritonRuntimeError("The @group_by_values decorator must be used after the @batch decorator.")
            others = {k: v for k, v in kwargs.items() if k in _SPECIAL}
            size = get_inference_request_batch_size(inputs)
            present = [k for k in keys if k in inputs]
            groups: dict[Any, list[int]] = {}
            for row in range(size):
                groups.setdefault(tuple(_row_key(inputs[k], row) for k in present), []).append(row)
            if len(groups) == 1:
                return func(*args, **kwargs)
            indices = [np.array(rows) for _, rows in sorted(groups.items(), key=lambda group: group[0])]
            results = []
            for rows in indices:
                result = func(*args, **{name: value[rows] for name, value in inputs.items()}, **others)
                if inspect.isgenerator(result):
                    result.close()
                    raise PyTritonRuntimeError("@group_by_values: a generator cannot answer several groups at once")
                results.append(convert_output(result))
            if pad_fn is not None:
                results = list(pad_fn(results))
            merged = {
                name: np.zeros((size, *np.shape(value)[1:]), dtype=np.asarray(value).dtype)
                for name, value in results[0].items()
            }
            for rows, result in zip(indices, results, strict=True):
                for name, value in result.items():
                    merged[name][rows] = value
            return merged

        return run

    return decorate


def fill_optionals(**defaults: np.ndarray) -> Callable[..., Any]:
    """Gives each request the inputs it left out, from ``defaults`` (arrays without the batch
    axis; repeated for each row on a batching model). Put it first (outermost) so that other
    decorators see full requests."""

    def check(config: TritonModelConfig) -> None:  # (PyTriton's checks, in its order and words)
        specs = {s.name: s for s in config.inputs or []}
        unknown = sorted(set(defaults) - set(specs))
        if unknown:
            raise PyTritonBadParameterError(f"Could not found {', '.join(unknown)} inputs")
        not_arrays = {k: v for k, v in defaults.items() if not isinstance(v, np.ndarray)}
        if not_arrays:
            listed = ", ".join(f"{k}={v}" for k, v in not_arrays.items())
            raise PyTritonBadParameterError(f"Could not use {listed} defaults as they are not NumPy arrays")

        def same_dtype(value: np.ndarray, expected: Any) -> bool:  # (bytes inputs take any bytes array)
            if np.dtype(expected).kind in "OSU":
                return value.dtype.kind in "OSU"
            return value.dtype == np.dtype(expected)

        wrong = {k: (v.dtype, specs[k].dtype) for k, v in defaults.items() if not same_dtype(v, specs[k].dtype)}
        if wrong:
            listed = ", ".join(f"{k}: dtype={have} expected_dtype={want}" for k, (have, want) in wrong.items())
            raise PyTritonBadParameterError(
                f"Could not use {listed} defaults as they have different than input signature dtypes"
            )

        def same_shape(have: tuple[int, ...], want: tuple[int, ...]) -> bool:
            return len(have) == len(want) and all(w == -1 or h == w for h, w in zip(have, want, strict=True))

        wrong_shapes = {
            k: (v.shape, specs[k].shape) for k, v in defaults.items() if not same_shape(v.shape, specs[k].shape)
        }
        if wrong_shapes:
            listed = ", ".join(f"{k}: shape={have} expected_shape={want}" for k, (have, want) in wrong_shapes.items())
            raise PyTritonBadParameterError(
                f"Could not use {listed} defaults as they have different than input signature shapes"
            )

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            config = current().config
            check(config)
            for request in args[-1]:
                rows = get_inference_request_batch_size(request) if config.batching else None
                for name, value in defaults.items():
                    if name not in request:
                        request[name] = np.tile(value, (rows,) + (1,) * value.ndim) if rows is not None else value
            return func(*args, **kwargs)

        return run

    return decorate


def triton_context(func: Callable[..., Any]) -> Callable[..., Any]:
    """Adds the keyword argument ``triton_context`` (``.model_config``: the served model's
    configuration; ``.model_configs[callable]``: every bound callable's)."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs, **{TRITON_CONTEXT_FIELD_NAME: current().context})

    return run


def pad_batch(func: Callable[..., Any]) -> Callable[..., Any]:
    """Below ``@batch``: repeats the last row of every input until the batch has the next
    preferred batch size (or ``max_batch_size``); outputs of that size are cut back to the rows
    that came in."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        config = current().config
        inputs = {k: v for k, v in kwargs.items() if k not in _SPECIAL and isinstance(v, np.ndarray)}
        size = get_inference_request_batch_size(inputs)
        sizes = sorted((config.batcher.preferred_batch_size or []) if config.batcher else []) + [config.max_batch_size]
        target = sizes[min(bisect.bisect_left(sizes, size), len(sizes) - 1)]
        if target <= size:
            return func(*args, **kwargs)
        padded = {name: np.concatenate([v, np.repeat(v[-1:], target - size, axis=0)]) for name, v in inputs.items()}
        result = func(*args, **{**kwargs, **padded})

        def cut(outputs: Any) -> Any:
            outputs = convert_output(outputs)
            return {k: v[:size] if np.shape(v)[:1] == (target,) else v for k, v in outputs.items()}

        return (cut(step) for step in result) if inspect.isgenerator(result) else cut(result)

    return run


def first_value(*keys: str, squeeze_single_values: bool = True, strict: bool = True) -> Callable[..., Any]:
    """Replaces the inputs ``keys`` by their first row (a scalar when that row has one element
    and ``squeeze_single_values``); with ``strict``, all rows must be equal. Works below
    ``@batch`` (keyword arguments) and on the request list; batching models only."""
    if any(k in _SPECIAL for k in keys):
        not_allowed = [k for k in keys if k in _SPECIAL]
        raise PyTritonBadParameterError(
            f"The keys {', '.join(not_allowed)} are not allowed as keys for @first_value wrapper. "
            f"The set of not allowed keys are {', '.join(_SPECIAL)}"
        )

    def first(values: Any, name: str) -> Any:
        if strict:
            unique = np.unique(values, axis=None if values.dtype.kind == "O" else 0)
            if len(unique) > 1:
                raise PyTritonRuntimeError(
                    f"The values on the {name!r} input are not equal. "
                    "To proceed, either disable strict mode in @first_value wrapper "
                    "or ensure that the values always are consistent. "
                    f"The current values of {name!r} are {values!r}."
                )
        value = values[0]
        if squeeze_single_values and isinstance(value, np.ndarray) and all(d == 1 for d in value.shape):
            value = np.squeeze(value)[()]
        return value

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not current().config.batching:
                raise PyTritonRuntimeError(
                    "The @first_value decorator can only be used with models that support batching."
                )
            if set(kwargs) - set(_SPECIAL):  # below @batch
                return func(*args, **{k: first(v, k) if k in keys else v for k, v in kwargs.items()})
            for request in args[-1]:
                for name in keys:
                    if name in request:
                        request[name] = first(request[name], name)
            return func(*args, **kwargs)

        return run

    return decorate
