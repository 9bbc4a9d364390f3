"""OpenTelemetry spans built from Triton's trace timestamps (in-process and over gRPC)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import wait_for

pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from embedtriton import InvalidArgumentError, Server, ServerConfig, Tracing  # noqa: E402
from embedtriton.tracing import live_spans  # noqa: E402  (spans begun, not finished yet)


def in_memory_provider():
    """A TracerProvider whose finished spans land in an in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture(scope="module")
def traced(bind_double):
    provider, exporter = in_memory_provider()
    seen = []

    def double(requests):
        current = trace.get_current_span()
        seen.append((current.get_span_context().span_id, [r.span for r in requests]))
        if any(r.parameters.get("fail") for r in requests):
            raise ValueError("asked to fail")
        return [{"y": r["x"] * 2} for r in requests]

    server = Server(ServerConfig(tracing=Tracing(tracer_provider=provider)))
    bind_double(server, double)
    with server:
        exporter.clear()
        yield server, provider, exporter, seen


def _named(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _wait_for(exporter, name, count=1):
    assert wait_for(lambda: len(_named(exporter, name)) >= count), (
        f"no {count} finished span(s) named {name!r}: {exporter.get_finished_spans()}"
    )
    return _named(exporter, name)


def _all_finished():
    """Once every sampled request's span is finished: no more will come (sampling is decided as a
    request is submitted)."""
    assert wait_for(lambda: not live_spans), f"spans never finished: {live_spans}"


def test_in_process_request_span_has_timed_children(traced):
    server, provider, exporter, seen = traced
    exporter.clear()
    seen.clear()
    with provider.get_tracer("app").start_as_current_span("handler") as parent:
        out = server.model("Double").infer({"x": np.ones((2, 3), np.float32)}, request_id="req-7")
    assert out["y"][0, 0] == 2.0
    (request,) = _wait_for(exporter, "Double")
    (queue,) = _wait_for(exporter, "queue")
    (compute,) = _wait_for(exporter, "compute")
    # parents: app span -> request span -> queue / compute
    assert request.parent.span_id == parent.get_span_context().span_id
    assert request.context.trace_id == parent.get_span_context().trace_id
    assert queue.parent.span_id == request.context.span_id and compute.parent.span_id == request.context.span_id
    attrs = request.attributes
    assert attrs["triton.model.name"] == "Double" and attrs["triton.model.version"] == "1"
    assert attrs["triton.request.id"] == "req-7" and attrs["triton.batch_size"] == 2 and attrs["triton.trace.id"] > 0
    # Triton's own timestamps, in order
    assert request.start_time <= queue.start_time <= queue.end_time <= compute.start_time
    events = {e.name: e.timestamp for e in compute.events}
    assert compute.start_time <= events["compute_input_end"] <= events["compute_output_start"] <= compute.end_time
    assert compute.end_time <= request.end_time
    # the callable ran with the request's span current
    (current_id, spans) = seen[-1]
    assert current_id == request.context.span_id and spans[0].get_span_context().span_id == current_id


def test_spans_nest_after_the_wall_clock_is_set_forward(bind_double, monkeypatch):
    """NTP sets the wall clock forward while the server runs (here: it was 50 ms behind as the
    server was made): a request's spans still nest, its queue and compute inside it. Triton's
    steady timestamps are put on the wall clock as it reads when the request begins, not with an
    offset taken once (CI saw a child begin 0.4 ms before its parent after a few minutes)."""
    import time

    provider, exporter = in_memory_provider()
    wall = time.time_ns
    with monkeypatch.context() as behind:
        behind.setattr(time, "time_ns", lambda: wall() - 50_000_000)
        server = Server(ServerConfig(tracing=Tracing(tracer_provider=provider)))
    bind_double(server, lambda requests: [{"y": r["x"] * 2} for r in requests])
    with server:
        server.model("Double").infer({"x": np.ones((1, 3), np.float32)})
        (request,) = _wait_for(exporter, "Double")
        (queue,) = _wait_for(exporter, "queue")
        (compute,) = _wait_for(exporter, "compute")
    assert request.start_time <= queue.start_time <= queue.end_time <= compute.start_time
    assert compute.start_time <= compute.end_time <= request.end_time
    assert abs(request.start_time - wall()) < 60 * 10**9  # (on the wall clock: this minute)


def test_infer_many_traces_each_request_and_ends_a_refused_ones_span(traced):
    """infer_many hands a refill's requests to Triton together, with each one's trace: every
    request gets its own span with Triton's timestamps; one Triton refuses ends with an error."""
    server, _, exporter, _ = traced
    exporter.clear()
    items = [{"x": np.full((1, 2), i, np.float32)} for i in range(9)]
    items[4] = {"x": np.ones((1, 2), np.int64)}  # refused by Triton as it is handed over
    results = server.model("Double").infer_many(items, max_in_flight=4, return_exceptions=True)
    assert isinstance(results[4], InvalidArgumentError)
    assert [r["y"][0, 0] for i, r in enumerate(results) if i != 4] == [2.0 * i for i in range(9) if i != 4]
    requests = _wait_for(exporter, "Double", 9)
    assert len(_wait_for(exporter, "compute", 8)) == 8
    assert sorted(r.status.status_code == StatusCode.ERROR for r in requests) == [False] * 8 + [True]
    assert len({r.context.trace_id for r in requests}) == 9


def test_failed_model_marks_its_span(traced):
    server, _, exporter, _ = traced
    exporter.clear()
    with pytest.raises(Exception, match="asked to fail"):
        server.model("Double").infer({"x": np.ones((1, 1), np.float32)}, parameters={"fail": True})
    (request,) = _wait_for(exporter, "Double")
    assert request.status.status_code == StatusCode.ERROR and "asked to fail" in request.status.description


def test_bad_input_ends_its_span_with_an_error(traced):
    server, _, exporter, _ = traced
    exporter.clear()
    with pytest.raises(InvalidArgumentError):
        server.model("Double").infer({"x": np.ones((1, 1), np.int64)})
    (request,) = _wait_for(exporter, "Double")
    assert request.status.status_code == StatusCode.ERROR


def test_a_traced_submit_leaves_the_callers_request_as_it_was(traced):
    """Tracing hands the native submit a copy of the request with its parameters (the span's
    key) and its timestamp sink: the caller's InferRequest keeps its own."""
    from embedtriton.core.request import InferRequest

    server, _, exporter, _ = traced
    exporter.clear()
    request = InferRequest({"x": np.ones((1, 1), np.float32)}, parameters={"k": 1})
    assert server.model("Double").submit(request)["y"][0, 0] == 2.0
    assert request.parameters == {"k": 1} and request.trace_sink is None
    (span,) = _wait_for(exporter, "Double")
    assert span.status.status_code != StatusCode.ERROR


def test_sampling_rate_and_count(traced):
    server, _, exporter, _ = traced
    tracer = server._tracer
    try:
        tracer.update(rate=3)
        exporter.clear()
        for _ in range(9):
            server.model("Double").infer({"x": np.ones((1, 1), np.float32)})
        assert len(_wait_for(exporter, "Double", 3)) == 3
        _all_finished()
        assert len(_named(exporter, "Double")) == 3
        tracer.update(rate=1, count=2)
        exporter.clear()
        for _ in range(5):
            server.model("Double").infer({"x": np.ones((1, 1), np.float32)})
        _all_finished()
        assert len(_named(exporter, "Double")) == 2
        with pytest.raises(InvalidArgumentError, match="rate must be"):
            tracer.update(rate=0)
    finally:
        tracer.update(rate=1, count=-1, level="TIMESTAMPS")


def test_grpc_traceparent_is_the_parent_and_trace_setting_works(traced):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    server, _, exporter, _ = traced
    port = server.serve_grpc("127.0.0.1:0")
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        inp = grpcclient.InferInput("x", [1, 2], "FP32")
        inp.set_data_from_numpy(np.ones((1, 2), np.float32))
        trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        exporter.clear()
        client.infer("Double", [inp], headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
        (request,) = _wait_for(exporter, "Double")
        assert format(request.context.trace_id, "032x") == trace_id
        assert format(request.parent.span_id, "016x") == parent_id and request.parent.is_remote
        assert request.kind == trace.SpanKind.SERVER

        settings = client.update_trace_settings(settings={"trace_rate": "2"}, as_json=True)["settings"]
        assert settings["trace_rate"]["value"] == ["2"] and settings["trace_level"]["value"] == ["TIMESTAMPS"]
        client.update_trace_settings(settings={"trace_level": ["OFF"]})
        exporter.clear()
        client.infer("Double", [inp])
        _all_finished()
        assert not _named(exporter, "Double")
        with pytest.raises(Exception, match="not supported"):
            client.update_trace_settings(settings={"trace_file": "/tmp/t.json"})
    finally:
        server.tracer.update(rate=1, count=-1, level="TIMESTAMPS")
        server._stop_endpoints(1.0)


def test_no_tracing_no_spans(bind_double):
    provider, exporter = in_memory_provider()
    trace_seen = []

    def double(requests):
        trace_seen.append(requests[0].span)
        return [{"y": r["x"] * 2} for r in requests]

    server = Server()
    bind_double(server, double)
    with server, provider.get_tracer("app").start_as_current_span("handler"):
        server.model("Double").infer({"x": np.ones((1, 1), np.float32)})
    assert [s.name for s in exporter.get_finished_spans()] == ["handler"] and trace_seen == [None]


def test_an_ensemble_has_one_span_per_step_under_its_own(traced):
    """Triton spawns a child trace per step request; each becomes a span under the
    ensemble's (this crashed the process before: child traces reuse the root's callbacks)."""
    from embedtriton import ModelConfig, Step, Tensor

    server, provider, exporter, _ = traced
    steps = [Step("Double", {"x": "IN"}, {"y": "mid"}), Step("Double", {"x": "mid"}, {"y": "OUT"})]
    ensemble = server.bind_ensemble(
        "Quadruple",
        steps,
        [Tensor(name="IN", dtype=np.float32, shape=(-1,))],
        [Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        ModelConfig(max_batch_size=4),
    )
    try:
        exporter.clear()
        for _ in range(3):
            assert ensemble.infer({"IN": np.ones((1, 3), np.float32)})["OUT"][0, 0] == 4.0
        roots = _wait_for(exporter, "Quadruple", 3)
        steps_seen = _wait_for(exporter, "Double", 6)
        for root in roots:
            children = [s for s in steps_seen if s.parent.span_id == root.context.span_id]
            assert len(children) == 2  # one per step
            for child in children:
                assert child.context.trace_id == root.context.trace_id
                assert root.start_time <= child.start_time <= child.end_time <= root.end_time
                assert child.attributes["triton.model.name"] == "Double" and child.attributes["triton.trace.id"] > 0
                phases = [
                    s.name
                    for s in exporter.get_finished_spans()
                    if s.parent and s.parent.span_id == child.context.span_id
                ]
                assert sorted(phases) == ["compute", "queue"]
    finally:
        server.unbind("Quadruple")


def test_a_model_to_model_call_is_a_child_of_the_calling_request(traced):
    """BLS: the inner request's span is a child of the outer request's span (sync and async)."""
    from embedtriton import ModelConfig, Tensor, batch

    server, _, exporter, _ = traced

    @batch
    def outer_sync(x):
        return {"y": server.model("Double").infer({"x": x})["y"]}

    @batch
    async def outer_async(x):
        return {"y": (await server.model("Double").infer_async({"x": x}))["y"]}

    tensors = ([Tensor(name="x", dtype=np.float32, shape=(-1,))], [Tensor(name="y", dtype=np.float32, shape=(-1,))])
    for name, func in (("OuterSync", outer_sync), ("OuterAsync", outer_async)):
        server.bind(name, func, *tensors, ModelConfig(max_batch_size=4))
        try:
            exporter.clear()
            assert server.model(name).infer({"x": np.ones((1, 2), np.float32)})["y"][0, 0] == 2.0
            (outer,) = _wait_for(exporter, name)
            (inner,) = _wait_for(exporter, "Double")
            assert inner.parent.span_id == outer.context.span_id, name
            assert inner.context.trace_id == outer.context.trace_id
        finally:
            server.unbind(name)
