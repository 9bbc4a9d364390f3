"""What a model's callable is handed: :class:`Request` (one per Triton request), and
:class:`Final` (the last outputs of an iterative request)."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

# Model-to-model calls inherit what is left of the calling request's timeout: a request
# submitted with timeout_us carries its deadline (monotonic ns) in this parameter; the
# runner takes it out and sets `deadline` while the callable runs; Model.submit reads it.
DEADLINE_PARAMETER = "embedtriton.deadline_ns"
deadline: ContextVar[int | None] = ContextVar("embedtriton_deadline", default=None)


class _Deadlines:
    used = False  # a request carried a deadline: from then on, runners look for them


deadlines = _Deadlines()


def take_deadline(requests: list[Any]) -> int | None:
    """Take the deadlines out of a batch's requests' parameters: the earliest one, or None."""
    found = None
    for r in requests:
        d = r.parameters.pop(DEADLINE_PARAMETER, None) if r.parameters else None
        if d is not None and (found is None or d < found):
            found = d
    return found


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
    # (set by the backend on each request; the sequence ones on sequence models only)
    parameters: dict[str, Any]
    correlation_id: int | str
    sequence_start: bool
    sequence_end: bool
    sequence_ready: bool
    state: dict[str, Any]
    _span: Any

    @property
    def data(self) -> Request:
        """The inputs, as PyTriton's ``Request.data`` (the request itself is that mapping)."""
        return self

    @property
    def span(self) -> Any:
        """The request's OpenTelemetry span when it is traced (see ``Tracing``), else None."""
        return getattr(self, "_span", None)

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self.items()}
        return f"Request({shapes}, parameters={getattr(self, 'parameters', {})})"
