"""One inference request, as every caller hands it to :meth:`Model.submit`: ``Model.infer``
and friends build it from keyword options, the gRPC frontend from a ModelInferRequest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from ..errors import InvalidArgumentError
from ..triton.devices import require_gpu

SEQUENCE_START, SEQUENCE_END = 1, 2  # TRITONSERVER_RequestFlag


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
    """

    __slots__ = (
        "inputs", "outputs", "request_id", "priority", "timeout_us", "parameters", "sequence", "trace_parent",
        "output_device",
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
        return cls(
            inputs,
            options.get("outputs"),
            options.get("request_id"),
            options.get("priority"),
            options.get("timeout_us"),
            options.get("parameters"),
            sequence_of(
                options.get("correlation_id"), options.get("sequence_start", False), options.get("sequence_end", False)
            ),
            output_device=device,
        )


def sequence_of(correlation_id: int | str | None, start: bool, end: bool) -> tuple[int | str, int] | None:
    """(correlation id, Triton's request flags) for a request of a sequence, or None."""
    if correlation_id is None:
        if start or end:
            raise InvalidArgumentError("sequence_start/sequence_end need a correlation_id")
        return None
    return correlation_id, (SEQUENCE_START if start else 0) | (SEQUENCE_END if end else 0)


def output_device_of(device: str) -> int:
    """The GPU that outputs go to for ``output_device``: -1 for "cpu" (host numpy arrays), N for
    "gpu:N", 0 for "gpu". A GPU this process does not see is refused here."""
    if device == "cpu":
        return -1
    index: int | None = None
    if isinstance(device, str) and device == "gpu":
        index = 0
    elif isinstance(device, str) and device.startswith("gpu:") and device[4:].isdigit():
        index = int(device[4:])
    if index is None:
        raise InvalidArgumentError(f"output_device must be 'cpu', 'gpu' or 'gpu:N', not {device!r}")
    require_gpu(f"output_device={device!r}", index)
    return index
