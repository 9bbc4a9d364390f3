"""OpenTelemetry spans built from Triton's own trace timestamps.

Triton's trace manager lives in its server binary, not in the library, so embedtriton
asks the C API for a trace per sampled request (``TRITONSERVER_InferenceTraceNew``, level
TIMESTAMPS) and turns its activities into spans when Triton releases the request:

- one span per request, named after the model, parented by the caller's current context
  (in-process ``infer``) or by the W3C ``traceparent`` of a gRPC call, with attributes
  ``triton.model.name``, ``triton.model.version``, ``triton.request.id``,
  ``triton.batch_size`` and ``triton.trace.id``;
- two children timed by Triton's clock: ``queue`` (QUEUE_START .. COMPUTE_START) and
  ``compute`` (COMPUTE_START .. COMPUTE_END, with events ``compute_input_end`` and
  ``compute_output_start``); the request span ends at REQUEST_END.

While the model runs, the request's span is the current span of the callable (for a batch,
the first traced request's; each traced request also has ``request.span``).

Enable with ``ServerConfig(tracing=Tracing(...))``; nothing is traced, and nothing costs,
when it is off. Needs ``opentelemetry-api`` (spans reach an exporter through the
application's ``TracerProvider`` from ``opentelemetry-sdk``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError

SPAN_PARAMETER = "embedtriton.span"  # carries a traced request's span key to the model side

# TRITONSERVER_InferenceTraceActivity: the order of the timestamps the native module hands over
_REQUEST_START, _QUEUE_START, _COMPUTE_START, _INPUT_END, _OUTPUT_START, _COMPUTE_END, _REQUEST_END = range(7)

# Spans of the traced requests now in Triton, by key; the model side looks them up
# (only when this is not empty: no cost when nothing is traced).
live_spans: dict[int, Any] = {}
_keys = itertools.count(1)


@dataclass
class Tracing:
    """Tracing settings (also changed at run time by gRPC ``TraceSetting``).

    ``rate``: trace one request in every ``rate`` (Triton's ``trace_rate``).
    ``count``: stop after this many traces; -1 for no limit (Triton's ``trace_count``).
    ``level``: ``"TIMESTAMPS"`` to trace, ``"OFF"`` to stop.
    ``tracer_provider``: an OpenTelemetry ``TracerProvider``; the global one by default.
    """

    rate: int = 1
    count: int = -1
    level: str = "TIMESTAMPS"
    tracer_provider: Any = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`InvalidArgumentError` for a rate or count Triton would refuse."""
        if not isinstance(self.rate, int) or self.rate < 1:
            raise InvalidArgumentError(f"tracing rate must be an integer >= 1, not {self.rate!r}")
        if not isinstance(self.count, int) or self.count < -1:
            raise InvalidArgumentError(f"tracing count must be -1 (no limit) or >= 0, not {self.count!r}")
        if self.level not in ("TIMESTAMPS", "OFF"):
            raise InvalidArgumentError(f"tracing level must be 'TIMESTAMPS' or 'OFF', not {self.level!r}")


class Tracer:
    """Samples requests and builds their spans (one per server with tracing on)."""

    def __init__(self, settings: Tracing) -> None:
        try:
            from opentelemetry import context as otel_context
            from opentelemetry import trace as otel_trace
        except ImportError as exc:  # pragma: no cover - only without the extra
            raise InvalidArgumentError(
                'tracing needs OpenTelemetry: pip install "embedtriton[tracing]" (opentelemetry-api and -sdk)'
            ) from exc
        self._context = otel_context
        self._trace = otel_trace
        self.settings = settings
        provider = settings.tracer_provider or otel_trace.get_tracer_provider()
        self._tracer = provider.get_tracer("embedtriton")
        self._lock = threading.Lock()
        self._seen = 0

    def update(self, **changes: Any) -> Tracing:
        """Change settings (``rate``, ``count``, ``level``); returns the settings now in force."""
        with self._lock:
            candidate = Tracing(**{**self.settings.__dict__, **changes})
            self.settings = candidate
            self._seen = 0
        return candidate

    def _sampled(self) -> bool:
        with self._lock:
            s = self.settings
            if s.level == "OFF" or s.count == 0:
                return False
            self._seen += 1
            if (self._seen - 1) % s.rate:
                return False
            if s.count > 0:
                s.count -= 1
            return True

    def begin(
        self,
        model: str,
        version: int,
        inputs: Mapping[str, Any],
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        parent: Any = None,
        remote: bool = False,
    ) -> tuple[Any, Any, dict[str, Any] | None]:
        """Start a request's span if sampled: (span, timestamp sink, parameters) or Nones."""
        if not self._sampled():
            return None, None, None
        # Triton's timestamps are steady-clock (CLOCK_MONOTONIC) nanoseconds: this request's spans
        # put them on the wall clock as it reads now. (One offset for the server's life would drift
        # from the wall clock as NTP adjusts it: a child span then started before its parent.)
        steady = time.monotonic_ns()
        offset = time.time_ns() - steady
        span = self._tracer.start_span(
            model,
            context=parent,  # None: the caller's current context
            kind=self._trace.SpanKind.SERVER if remote else self._trace.SpanKind.INTERNAL,
            start_time=steady + offset,  # (Triton's stamps for it come later on the same clock)
        )
        if not span.is_recording():
            return None, None, None
        first = next(iter(inputs.values()), None)
        span.set_attribute("triton.model.name", model)
        span.set_attribute("triton.model.version", str(version if version > 0 else 1))
        if request_id:
            span.set_attribute("triton.request.id", request_id)
        shape = getattr(first, "shape", None)
        if shape:
            span.set_attribute("triton.batch_size", int(shape[0]))
        key = next(_keys)
        live_spans[key] = span
        params = dict(parameters or {})
        params[SPAN_PARAMETER] = key

        def sink(trace_id: int, stamps: tuple[int, ...], children: list[tuple[str, int, int, tuple[int, ...]]]) -> None:
            live_spans.pop(key, None)
            self._finish(span, trace_id, stamps, children, offset)

        return span, sink, params

    def _finish(
        self,
        span: Any,
        trace_id: int,
        stamps: tuple[int, ...],
        children: list[tuple[str, int, int, tuple[int, ...]]],
        offset: int,
    ) -> None:
        span.set_attribute("triton.trace.id", trace_id)
        if not any(stamps):
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, "Triton did not run the request"))
        self._phases(span, stamps, offset)
        # An ensemble's step requests (children of its trace; nested ensembles nest): a span each.
        spans = {trace_id: span}
        for model, child_id, parent_id, child_stamps in sorted(children, key=lambda c: c[3][_REQUEST_START]):
            parent = self._trace.set_span_in_context(spans.get(parent_id, span))
            start = child_stamps[_REQUEST_START] or child_stamps[_QUEUE_START]
            child = self._tracer.start_span(model, context=parent, start_time=start + offset if start else None)
            child.set_attribute("triton.model.name", model)
            child.set_attribute("triton.trace.id", child_id)
            self._phases(child, child_stamps, offset)
            spans[child_id] = child
            end = child_stamps[_REQUEST_END] or child_stamps[_COMPUTE_END]
            child.end(end_time=end + offset if end else None)
        span.end(end_time=(stamps[_REQUEST_END] or time.monotonic_ns()) + offset)

    def _phases(self, span: Any, stamps: tuple[int, ...], offset: int) -> None:
        """The ``queue`` and ``compute`` children of a request's span, timed by Triton's clock
        (``offset``: from it to the wall clock, as the request began)."""

        def at(i: int) -> int | None:
            return stamps[i] + offset if stamps[i] else None

        parent = self._trace.set_span_in_context(span)
        queue, start, end = at(_QUEUE_START), at(_COMPUTE_START), at(_COMPUTE_END)
        if queue and start:
            self._tracer.start_span("queue", context=parent, start_time=queue).end(end_time=start)
        if start and end:
            compute = self._tracer.start_span("compute", context=parent, start_time=start)
            for name, index in (("compute_input_end", _INPUT_END), ("compute_output_start", _OUTPUT_START)):
                if at(index):
                    compute.add_event(name, timestamp=at(index))
            compute.end(end_time=end)

    def abandon(self, span: Any, params: Mapping[str, Any] | None, exc: BaseException) -> None:
        """A request refused before Triton saw it (no timestamps will come): fail and end its span."""
        key = params.get(SPAN_PARAMETER) if params is not None else None
        if key is not None and live_spans.pop(key, None) is not None:
            _fail(span, exc)
            span.end()

    def context_from_metadata(self, metadata: Mapping[str, str]) -> Any:
        """The parent context carried by W3C ``traceparent``/``tracestate`` headers, or None."""
        if "traceparent" not in metadata:
            return None
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        return TraceContextTextMapPropagator().extract(carrier=dict(metadata))


def spans_of(requests: list[Any]) -> Any:
    """Model side: give each traced request its ``span`` (taking the span key out of its
    parameters); returns a context manager that makes the first one current, or None."""
    first = None
    for request in requests:
        key = request.parameters.pop(SPAN_PARAMETER, None)
        span = live_spans.get(key) if key is not None else None
        if span is not None:
            request._span = span
            first = first or span
    if first is None:
        return None
    from opentelemetry import trace as otel_trace

    return otel_trace.use_span(first, end_on_exit=False)


def _fail(span: Any, exc: BaseException) -> None:
    """Mark a span as failed (its end still comes from Triton's timestamps)."""
    from opentelemetry import trace as otel_trace

    span.record_exception(exc)
    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, str(exc)))


def mark_failed(requests: list[Any], exc: BaseException) -> None:
    """Model side: the callable raised; mark the traced requests' spans as failed."""
    for request in requests:
        span = getattr(request, "_span", None)
        if span is not None:
            _fail(span, exc)
