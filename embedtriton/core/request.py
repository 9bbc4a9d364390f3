"""One inference request, as every caller hands it to :meth:`Model.submit`: ``Model.infer``
and friends build it from keyword options, the gRPC frontend from a ModelInferRequest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from ..errors import InvalidArgumentError, UnsupportedError
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
    - ``output_device``: where outputs come back, ``"cpu"`` (host numpy arrays).
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
    ) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.request_id = request_id
        self.priority = priority
        self.timeout_us = timeout_us
        self.parameters = parameters
        self.sequence = sequence
        self.trace_parent = trace_parent

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
        check_output_device(options.get("output_device", "cpu"))
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
        )


def sequence_of(correlation_id: int | str | None, start: bool, end: bool) -> tuple[int | str, int] | None:
    """(correlation id, Triton's request flags) for a request of a sequence, or None."""
    if correlation_id is None:
        if start or end:
            raise InvalidArgumentError("sequence_start/sequence_end need a correlation_id")
        return None
    return correlation_id, (SEQUENCE_START if start else 0) | (SEQUENCE_END if end else 0)


def check_output_device(device: str) -> None:
    """Outputs come back as host numpy arrays ("cpu"); "gpu" needs a CUDA GPU."""
    if device == "cpu":
        return
    if device != "gpu":
        raise InvalidArgumentError(f"output_device must be 'cpu' or 'gpu', not {device!r}")
    require_gpu("output_device='gpu'")
    raise UnsupportedError(
        "output_device='gpu' (outputs allocated in GPU memory) is not in this build yet: it still "
        "needs its run on a GPU machine; use output_device='cpu'"
    )
