"""One inference request, as every caller hands it to :meth:`Model.submit`: ``Model.infer``
and friends build it from keyword options, the network frontends from their requests
(through :mod:`embedtriton.frontends.kserve`)."""

from __future__ import annotations

import copy
import operator
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from ..errors import InvalidArgumentError
from ..triton.devices import require_gpu

SEQUENCE_START, SEQUENCE_END = 1, 2  # TRITONSERVER_RequestFlag


def sequence_flags(start: bool, end: bool) -> int:
    """Triton's request flags for a request of a sequence."""
    return (SEQUENCE_START if start else 0) | (SEQUENCE_END if end else 0)


_INT64_MAX, _UINT64_MAX = 2**63 - 1, 2**64 - 1

# What each option takes: a wrong one is refused as "<option> must be <takes>, not <what it got>"
# (refusal). The native submit refuses most of them (the TAKES_* of native/_native/inputs.h, the same words);
# Python checks only what it reads before the native path does, and only when options are given.
TAKES = {
    "parameters": "a mapping of str names to str, int, float or bool values, such as {'k': 1}",
    "parameters[]": "a str, a float, a bool or an int from -2**63 to 2**63-1",
    "priority": "an int from 0 to 2**64-1 (1 is the highest level, 0 the model's default)",
    "timeout_us": "an int of microseconds from 0 to 2**64-1 (0: no timeout)",
    "request_id": "a str",
    "outputs": "a list of output names (str)",
    "outputs[]": "an output name (str)",
    "correlation_id": "an int from 1 to 2**64-1 or a non-empty str",
    "sequence_start": "True or False",
    "sequence_end": "True or False",
    "output_device": "'cpu', 'gpu' or 'gpu:N'",
}
NOT_TEXT = ": a str must be UTF-8 text without NUL characters"  # (the native hint for such a str)


def shown(value: Any) -> str:
    """repr(value) for a message, cut to 80 characters (as the native ``shown``)."""
    try:
        text = repr(value)
    except Exception:  # (a broken __repr__, an int too long to print)
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= 80 else text[:77] + "..."


def refusal(option: str, value: Any, takes: str | None = None, hint: str = "") -> InvalidArgumentError:
    """The error for a wrong option: what it is, what it got and what it takes."""
    return InvalidArgumentError(f"{option} must be {takes or TAKES[option]}, not {shown(value)}{hint}")


class RequestOptions(TypedDict, total=False):
    """The per-request options of ``Model.infer``, ``infer_async``, ``stream`` and ``stream_async``.

    - ``parameters``: request parameters (str, int, float or bool values), as
      ``request.parameters`` on the model side.
    - ``priority``: the request's priority level (1 is the highest; 0 is the model's default).
    - ``timeout_us``: queue timeout in microseconds (with a queue policy that allows it).
    - ``request_id``: an id Triton keeps with the request (logs, traces).
    - ``outputs``: names of the outputs to return (all by default).
    - ``correlation_id`` (a positive int or a str) with ``sequence_start`` / ``sequence_end``:
      the sequence a request of a stateful model belongs to, and its first and last requests.
    - ``output_device``: where outputs come back: ``"cpu"`` (host numpy arrays, the default) or
      ``"gpu"`` / ``"gpu:N"`` (GPU 0 / N): :class:`embedtriton.DeviceArray` objects in memory Triton
      writes the outputs to directly, owned by the arrays (``cupy.from_dlpack(out["y"])``,
      ``torch.from_dlpack(...)``: no copy).

    ``priority``, ``timeout_us`` and an int ``correlation_id`` take ints (numpy integers too, not
    bools). A wrong value raises :class:`InvalidArgumentError` naming the option, what it got and
    what it takes, e.g. "outputs must be a list of output names (str), not 'y': for one output,
    pass ['y']"; ``infer_async`` raises it where it is awaited.
    """

    parameters: Mapping[str, str | int | float | bool] | None
    priority: int | None
    timeout_us: int | None
    request_id: str | None
    outputs: Sequence[str] | None
    correlation_id: int | str | None
    sequence_start: bool
    sequence_end: bool
    output_device: str


_OPTIONS = frozenset(RequestOptions.__annotations__)


class InferRequest:
    """One request: inputs (name -> array) and its per-request options.

    ``outputs`` names the outputs to return, or maps names to caller-provided buffers (shared
    memory) or None. ``sequence`` is ``(correlation id, TRITONSERVER_RequestFlag bits)``.
    ``trace_parent``: the OpenTelemetry context of a remote caller, when tracing.
    ``trace_sink``: what takes Triton's timestamps of a traced request (see :meth:`traced`).

    The native submit reads these fields itself (``request_spec_read`` in submit.c).
    """

    __slots__ = (
        "inputs", "outputs", "request_id", "priority", "timeout_us", "parameters", "sequence", "trace_parent",
        "output_device", "trace_sink",
    )  # fmt: skip

    def __init__(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | Mapping[str, Any] | None = None,
        request_id: str | None = None,
        priority: int | None = None,
        timeout_us: int | None = None,
        parameters: Mapping[str, Any] | None = None,
        sequence: tuple[int | str, int] | None = None,
        trace_parent: Any = None,
        output_device: int = -1,
        trace_sink: Any = None,
    ) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.request_id = request_id
        self.priority = priority
        self.timeout_us = timeout_us
        self.parameters = parameters
        self.sequence = sequence
        self.trace_parent = trace_parent
        self.output_device = output_device  # the GPU that outputs go to; -1: host memory
        self.trace_sink = trace_sink

    def traced(self, parameters: Mapping[str, Any] | None, sink: Any) -> InferRequest:
        """This request as traced: a copy with tracing's parameters (which carry the span's
        key) and its timestamp sink; the caller's request stays as it was."""
        traced = copy.copy(self)  # (every field, as a field added later will be too)
        traced.parameters, traced.trace_sink = parameters, sink
        return traced

    @classmethod
    def from_options(cls, inputs: Mapping[str, Any], options: Mapping[str, Any]) -> InferRequest:
        """A request from ``Model.infer``'s keyword options (see :class:`RequestOptions`)."""
        if not options:
            return cls(inputs)
        unknown = options.keys() - _OPTIONS
        if unknown:
            raise InvalidArgumentError(
                f"unknown request option(s) {sorted(unknown)}; the options are {sorted(_OPTIONS)}"
            )
        device = output_device_of(options.get("output_device", "cpu"))
        # (read here or by tracing before the native submit, which checks the others)
        parameters, request_id = options.get("parameters"), options.get("request_id")
        if type(parameters) is not dict and parameters is not None and not isinstance(parameters, Mapping):
            raise refusal("parameters", parameters)
        if type(request_id) is not str and request_id is not None and not isinstance(request_id, str):
            raise refusal("request_id", request_id)
        return cls(
            inputs,
            options.get("outputs"),
            request_id,
            options.get("priority"),
            options.get("timeout_us"),
            parameters,
            sequence_of(
                options.get("correlation_id"), options.get("sequence_start", False), options.get("sequence_end", False)
            ),
            output_device=device,
        )


def sequence_of(correlation_id: int | str | None, start: bool, end: bool) -> tuple[int | str, int] | None:
    """(correlation id, Triton's request flags) for a request of a sequence, or None. (The
    native submit checks the correlation id.)"""
    if start is not False and start is not True:
        start = _flag("sequence_start", start)
    if end is not False and end is not True:
        end = _flag("sequence_end", end)
    if correlation_id is None:
        if start or end:
            raise InvalidArgumentError("sequence_start/sequence_end need a correlation_id")
        return None
    return correlation_id, sequence_flags(start, end)


def _flag(option: str, value: Any) -> bool:
    if isinstance(value, np.bool_):
        return bool(value)
    raise refusal(option, value)


def output_device_of(device: str) -> int:
    """The GPU that outputs go to for ``output_device``: -1 for "cpu" (host numpy arrays), N for
    "gpu:N", 0 for "gpu". A GPU this process does not see is refused here."""
    if type(device) is not str and not isinstance(device, str):
        raise refusal("output_device", device)
    if device == "cpu":
        return -1
    index: int | None = None
    if device == "gpu":
        index = 0
    elif device.startswith("gpu:") and device[4:].isascii() and device[4:].isdecimal():
        index = int(device[4:])
    if index is None:
        raise refusal("output_device", device)
    require_gpu(f"output_device={device!r}", index)
    return index


def timeout_of(value: Any) -> int:
    """``timeout_us`` as an int (0 for None: no timeout), before Python computes a deadline
    from it; numpy integers are taken."""
    if type(value) is int and 0 <= value <= _UINT64_MAX:
        return value
    if value is None:
        return 0
    if not isinstance(value, bool) and hasattr(type(value), "__index__"):
        try:
            number = operator.index(value)
        except Exception:
            number = -1
        if 0 <= number <= _UINT64_MAX:
            return number
    raise refusal("timeout_us", value)


def with_deadline(parameters: Any, deadline_ns: int, name: str) -> dict[str, Any]:
    """A request's parameters with its deadline (monotonic ns) under ``name``."""
    if parameters is None:
        return {name: min(deadline_ns, _INT64_MAX)}
    if type(parameters) is not dict and not isinstance(parameters, Mapping):
        raise refusal("parameters", parameters)
    return {**parameters, name: min(deadline_ns, _INT64_MAX)}
