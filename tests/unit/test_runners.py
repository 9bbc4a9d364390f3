"""The runners (``embedtriton.backend.runners``): how each execution mode calls the model's
callable with a batch of requests and what it hands back to the native backend.

A runner never raises for the callable: an exception becomes the caller's error message (a
str), which the backend sends as the requests' error. Requests are built here as the backend
builds them (``build_request`` in ``native/_native/batch_io.c``): ``Request()``, one read-only
array per input, then ``.parameters``; on sequence models also ``sequence_start/end/ready``
and ``correlation_id``.
"""

from __future__ import annotations

import asyncio
import logging
import re

import numpy as np
import pytest
from model_side import make_request

from embedtriton import InvalidArgumentError, ModelConfig, SequenceBatcher, Tensor
from embedtriton.backend import runners
from embedtriton.backend.binding import Binding
from embedtriton.backend.request import DEADLINE_PARAMETER, Final, deadline, deadlines

F32 = np.float32


def sequence_request(cid, start=False, end=False, ready=True, **inputs):
    request = make_request(**inputs)
    request.sequence_start, request.sequence_end, request.sequence_ready = start, end, ready
    request.correlation_id = cid
    return request


def double(requests):
    return [{"y": r["x"] * 2} for r in requests]


def boom(requests):
    raise ValueError("boom")


@pytest.fixture
def clock(monkeypatch):
    """runners' time.monotonic, set by the test (failure logging and sequence idleness)."""

    class Clock:
        now = 1000.0

        def monotonic(self):
            return self.now

    fake = Clock()
    monkeypatch.setattr(runners, "time", fake)
    return fake


# -- Plain ---------------------------------------------------------------------------------------


def test_plain_calls_the_callable_once_with_the_batch_and_returns_its_list():
    seen = []
    answer = [{"y": 1}, {"y": 2}]

    def func(requests):
        seen.append(requests)
        return answer

    batch = [make_request(x=[1.0]), make_request(x=[2.0, 3.0])]
    result = runners.Plain("M", func).execute(batch)
    assert result is answer  # a list goes back untouched
    assert len(seen) == 1 and seen[0] is batch
    assert all(a is b for a, b in zip(seen[0], batch, strict=True))  # the Request objects themselves


def test_plain_hands_over_read_only_arrays_and_parameters():
    got = {}

    def func(requests):
        (r,) = requests
        got.update(writeable=r["x"].flags.writeable, parameters=r.parameters, data=r.data)
        return [{}]

    r = make_request({"scale": 2, "tag": "a"}, x=[1.0])
    runners.Plain("M", func).execute([r])
    assert got["writeable"] is False
    assert got["parameters"] == {"scale": 2, "tag": "a"}
    assert got["data"] is r


def test_plain_turns_a_tuple_into_a_list():
    result = runners.Plain("M", lambda requests: ({"y": 1}, {"y": 2})).execute([make_request(), make_request()])
    assert type(result) is list and result == [{"y": 1}, {"y": 2}]


def test_plain_passes_on_a_list_subclass_as_a_list():
    class Answers(list):
        pass

    result = runners.Plain("M", lambda requests: Answers([{"y": 1}])).execute([make_request()])
    assert type(result) is list and result == [{"y": 1}]


@pytest.mark.parametrize(
    "returned, kind", [({"y": 1}, "dict"), (None, "NoneType"), (np.zeros(2), "ndarray"), ("text", "str")]
)
def test_plain_refuses_anything_but_a_list_of_outputs(returned, kind):
    result = runners.Plain("Doubler", lambda requests: returned).execute([make_request(x=[1.0])])
    assert result == (
        f"model 'Doubler' must return a list with one dict of outputs per request; "
        f"it returned {kind} (use @batch for a function of batched arrays)"
    )


def test_plain_does_not_check_the_number_of_answers():
    """The count is the backend's to check (it answers each request from the list)."""
    assert runners.Plain("M", lambda requests: []).execute([make_request(), make_request()]) == []


def test_plain_with_an_empty_batch_still_calls_the_callable():
    calls = []
    assert runners.Plain("M", lambda requests: calls.append(requests) or []).execute([]) == []
    assert calls == [[]]


def test_an_exception_becomes_the_callers_error_naming_type_message_and_place(caplog):
    def infer(requests):
        return helper()

    def helper():
        raise KeyError("missing input")

    with caplog.at_level(logging.ERROR, logger="embedtriton"):
        message = runners.Plain("Broken", infer).execute([make_request(x=[1.0])])
    assert isinstance(message, str)
    assert message.startswith("model 'Broken' raised KeyError: 'missing input' (at test_runners.py:")
    # innermost frame first, embedtriton's own frames left out
    assert re.fullmatch(
        r"model 'Broken' raised KeyError: 'missing input' "
        r"\(at test_runners\.py:\d+ in helper < test_runners\.py:\d+ in infer\)",
        message,
    )
    assert "model 'Broken' raised:" in caplog.text and "KeyError" in caplog.text


def test_only_the_three_innermost_frames_are_named():
    def f1(requests):
        return f2()

    def f2():
        return f3()

    def f3():
        return f4()

    def f4():
        raise RuntimeError("deep")

    message = runners.Plain("M", f1).execute([make_request()])
    where = message.split(" (at ", 1)[1].rstrip(")").split(" < ")
    assert [w.rsplit(" in ", 1)[1] for w in where] == ["f4", "f3", "f2"]


def test_base_exceptions_are_not_turned_into_messages():
    def interrupted(requests):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runners.Plain("M", interrupted).execute([make_request()])


def test_failures_are_logged_at_most_once_per_interval_and_counted(clock, caplog):
    runner = runners.Plain("Flaky", boom)
    with caplog.at_level(logging.ERROR, logger="embedtriton"):
        for _ in range(3):
            assert runner.execute([make_request()]).startswith("model 'Flaky' raised ValueError: boom")
            clock.now += 1.0
        assert len(caplog.records) == 1  # the first one only
        clock.now += runners.LOG_EVERY_S
        runner.execute([make_request()])
    assert len(caplog.records) == 2
    assert "(2 more failures since the last one logged)" in caplog.records[1].getMessage()


def test_the_earliest_deadline_of_a_batch_is_set_while_the_callable_runs(monkeypatch):
    monkeypatch.setattr(deadlines, "used", True)
    seen = []

    def func(requests):
        seen.append((deadline.get(), [dict(r.parameters) for r in requests]))
        return [{} for _ in requests]

    batch = [
        make_request({DEADLINE_PARAMETER: 500, "k": 1}),
        make_request({DEADLINE_PARAMETER: 300}),
        make_request(),
    ]
    runners.Plain("M", func).execute(batch)
    assert seen == [(300, [{"k": 1}, {}, {}])]  # the parameter is taken out of the requests
    assert deadline.get() is None  # reset afterwards
    runners.Plain("M", boom).execute([make_request({DEADLINE_PARAMETER: 7})])
    assert deadline.get() is None  # also after a failure


# -- Decoupled -----------------------------------------------------------------------------------


def test_decoupled_hands_back_each_step_as_it_comes():
    progress = []

    def stream(requests):
        for i in range(3):
            progress.append(i)
            yield [{"i": i} for _ in requests]

    steps = runners.Decoupled("S", stream).execute([make_request(), make_request()])
    assert progress == []  # nothing runs before the backend asks for the first step
    assert next(steps) == [{"i": 0}, {"i": 0}] and progress == [0]
    assert list(steps) == [[{"i": 1}, {"i": 1}], [{"i": 2}, {"i": 2}]]


def test_decoupled_steps_may_be_tuples_and_hold_none():
    def stream(requests):
        yield ({"y": 1}, None)
        yield [None, {"y": 2}]

    steps = list(runners.Decoupled("S", stream).execute([make_request(), make_request()]))
    assert steps == [[{"y": 1}, None], [None, {"y": 2}]]
    assert type(steps[0]) is list


def test_decoupled_ends_with_the_error_when_the_generator_raises():
    def stream(requests):
        yield [{"y": 1}]
        raise RuntimeError("midway")

    steps = list(runners.Decoupled("S", stream).execute([make_request()]))
    assert steps[0] == [{"y": 1}]
    assert len(steps) == 2 and steps[1].startswith("model 'S' raised RuntimeError: midway (at test_runners.py:")


def test_decoupled_callable_that_raises_before_its_generator_gives_a_message():
    assert runners.Decoupled("S", boom).execute([make_request()]).startswith("model 'S' raised ValueError: boom")


@pytest.mark.parametrize("returned, kind", [([{"y": 1}], "list"), ({"y": 1}, "dict"), (None, "NoneType")])
def test_decoupled_refuses_a_callable_that_is_not_a_generator(returned, kind):
    steps = list(runners.Decoupled("S", lambda requests: returned).execute([make_request()]))
    assert steps == [
        f"model 'S' is decoupled: its function must be a generator that yields "
        f"one list of outputs (or None) per request at each step, not {kind}"
    ]


def test_decoupled_closes_the_generator_when_the_backend_stops_early():
    closed = []

    def stream(requests):
        try:
            while True:
                yield [{}]
        finally:
            closed.append(True)

    gen = stream([])  # held here too: only an explicit close() ends it, not garbage collection
    steps = runners.Decoupled("S", lambda requests: gen).execute([make_request()])
    next(steps)
    steps.close()
    assert closed == [True]


def test_decoupled_drives_an_async_generator_on_its_own_thread():
    async def stream(requests):
        for i in range(2):
            await asyncio.sleep(0)
            yield [{"i": i}]

    assert list(runners.Decoupled("S", stream).execute([make_request()])) == [[{"i": 0}], [{"i": 1}]]


def test_decoupled_async_generator_errors_become_the_last_step():
    async def stream(requests):
        yield [{"i": 0}]
        raise ValueError("async boom")

    steps = list(runners.Decoupled("S", stream).execute([make_request()]))
    assert steps[0] == [{"i": 0}] and steps[1].startswith("model 'S' raised ValueError: async boom")


# -- Sequence ------------------------------------------------------------------------------------


def test_sequence_state_lives_from_start_to_end():
    states = []

    def accumulate(requests):
        for r in requests:
            r.state["total"] = r.state.get("total", 0) + int(r["x"][0])
            states.append(r.state)
        return [{"total": r.state["total"]} for r in requests]

    runner = runners.Sequence("Acc", accumulate, idle_us=1_000_000, decoupled=False)
    assert runner.execute([sequence_request(7, start=True, x=[1])]) == [{"total": 1}]
    assert runner.execute([sequence_request(7, x=[2]), sequence_request(8, start=True, x=[10])]) == [
        {"total": 3},
        {"total": 10},
    ]
    assert runner.execute([sequence_request(7, end=True, x=[3])]) == [{"total": 6}]
    assert states[0] is states[1] is states[3]  # one dict per sequence
    assert states[2] is not states[0]
    # after its end, the same id starts from an empty state
    assert runner.execute([sequence_request(7, x=[5])]) == [{"total": 5}]


def test_sequence_start_resets_the_state_of_a_reused_id():
    def count(requests):
        for r in requests:
            r.state["n"] = r.state.get("n", 0) + 1
        return [{"n": r.state["n"]} for r in requests]

    runner = runners.Sequence("C", count, idle_us=1_000_000, decoupled=False)
    runner.execute([sequence_request("s", start=True)])
    assert runner.execute([sequence_request("s")]) == [{"n": 2}]
    assert runner.execute([sequence_request("s", start=True)]) == [{"n": 1}]


def test_sequence_padding_requests_skip_the_callable_and_get_none():
    seen = []

    def func(requests):
        seen.append([r.correlation_id for r in requests])
        return [{"id": r.correlation_id} for r in requests]

    runner = runners.Sequence("P", func, idle_us=1_000_000, decoupled=False)
    batch = [sequence_request(0, ready=False), sequence_request(1, start=True), sequence_request(0, ready=False)]
    assert runner.execute(batch) == [None, {"id": 1}, None]
    assert seen == [[1]]
    assert runner.execute([sequence_request(0, ready=False)]) == [None]  # all padding: no call
    assert seen == [[1]]


def test_sequence_answers_must_be_one_per_live_request():
    runner = runners.Sequence("L", lambda requests: [{}], idle_us=1_000_000, decoupled=False)
    batch = [sequence_request(1, start=True), sequence_request(2, start=True)]
    assert runner.execute(batch) == "model 'L' must return a list with one dict of outputs per request"
    assert runners.Sequence("L", lambda r: {"y": 1}, 1, False).execute(batch[:1]) == (
        "model 'L' must return a list with one dict of outputs per request"
    )


def test_sequence_failure_is_a_message_and_an_ending_sequence_is_still_dropped():
    states = []

    def func(requests):
        states.append((requests[0].state, dict(requests[0].state)))
        if requests[0].sequence_end:
            raise ValueError("at the end")
        requests[0].state["seen"] = True
        return [{}]

    runner = runners.Sequence("F", func, idle_us=1_000_000, decoupled=False)
    runner.execute([sequence_request(3, start=True)])
    message = runner.execute([sequence_request(3, end=True)])
    assert message.startswith("model 'F' raised ValueError: at the end")
    runner.execute([sequence_request(3)])
    assert states[1][1] == {"seen": True}  # the sequence's state at its end
    assert states[2][1] == {} and states[2][0] is not states[0][0]  # then a fresh one


def test_sequence_state_of_an_idle_sequence_is_dropped(clock):
    runner = runners.Sequence("I", lambda rs: [{"n": len(r.state)} for r in rs], idle_us=2_000_000, decoupled=False)

    def touch(cid, **flags):
        request = sequence_request(cid, **flags)
        runner.execute([request])
        request.state["x"] = 1
        return request.state

    first = touch(1, start=True)
    clock.now += 1.5
    assert touch(1) is first  # still within the idle time
    clock.now += 2.5
    assert touch(1) is not first  # Triton ended it meanwhile: a fresh state


def test_decoupled_sequence_streams_its_steps():
    def stream(requests):
        requests[0].state["n"] = 1
        yield [{"a": 1}]
        yield [{"a": 2}]

    runner = runners.Sequence("DS", stream, idle_us=1_000_000, decoupled=True)
    assert list(runner.execute([sequence_request(1, start=True)])) == [[{"a": 1}], [{"a": 2}]]


# -- Iterative (generator form) ------------------------------------------------------------------


def test_iterative_advances_one_generator_per_request_one_step_per_iteration():
    started = []

    def generate(request):
        started.append(request)
        for i in range(int(request["n"][0])):
            yield {"token": i}

    runner = runners.Iterative("G", generate)
    a, b = make_request(n=[2]), make_request(n=[1])
    assert runner.iterate([(1, a), (2, b)]) == [({"token": 0}, False), ({"token": 0}, False)]
    assert started == [a, b] and runner.knows(1) and runner.knows(2)
    # later iterations may hand the request over again or not (None): the key is what counts
    assert runner.iterate([(1, None), (2, b)]) == [({"token": 1}, False), (None, True)]
    assert runner.knows(1) and not runner.knows(2)
    assert runner.iterate([(1, None)]) == [(None, True)]
    assert not runner.knows(1) and started == [a, b]


def test_iterative_padding_lost_requests_and_failures():
    def generate(request):
        yield {"ok": 1}
        raise RuntimeError("second step")

    runner = runners.Iterative("G", generate)
    results = runner.iterate([(None, None), (5, None), (6, make_request())])
    assert results[0] == (None, True)  # padding of the sequence batcher
    assert results[1] == ("model 'G' lost track of a request", True)
    assert results[2] == ({"ok": 1}, False)
    ((message, done),) = runner.iterate([(6, None)])
    assert done and message.startswith("model 'G' raised RuntimeError: second step")
    assert not runner.knows(6)


def test_iterative_callable_must_be_a_generator_and_may_fail_to_start():
    not_gen = runners.Iterative("N", lambda request: {"y": 1})
    assert not_gen.iterate([(1, make_request())]) == [
        ("model 'N' is iterative: its function must be a generator of one request's outputs, not dict", True)
    ]
    ((message, done),) = runners.Iterative("B", lambda request: 1 / 0).iterate([(1, make_request())])
    assert done and message.startswith("model 'B' raised ZeroDivisionError: division by zero")


def test_iterative_execute_is_refused():
    assert runners.Iterative("G", lambda request: iter(())).execute([make_request()]) == (
        "model 'G' is iterative: its requests are run by iterate()"
    )


def test_request_done_closes_the_generator_of_a_released_request():
    closed = []

    def generate(request):
        try:
            while True:
                yield {}
        finally:
            closed.append(True)

    runner = runners.Iterative("G", generate)
    runner.iterate([(41, make_request())])
    runners.request_done(41)
    assert closed == [True] and not runner.knows(41)
    runners.request_done(41)  # twice, or an unknown key: nothing happens
    runner.forget(12345)


# -- IterativeBatch (batch-step form) ------------------------------------------------------------


def test_iterative_batch_keeps_requests_and_state_until_final():
    calls = []

    def step(requests):
        calls.append([id(r) for r in requests])
        answers = []
        for r in requests:
            r.state["steps"] = r.state.get("steps", 0) + 1
            if r.state["steps"] == int(r["n"][0]):
                answers.append(Final({"steps": r.state["steps"]}))
            else:
                answers.append({"steps": r.state["steps"]})
        return answers

    runner = runners.IterativeBatch("B", step)
    a, b = make_request(n=[1]), make_request(n=[3])
    assert runner.iterate([(1, a), (2, b)]) == [({"steps": 1}, True), ({"steps": 1}, False)]
    assert not runner.knows(1) and runner.knows(2)
    assert runner.iterate([(2, None)]) == [({"steps": 2}, False)]
    assert runner.iterate([(2, None), (None, None)]) == [({"steps": 3}, True), (None, True)]
    assert calls == [[id(a), id(b)], [id(b)], [id(b)]]  # the same Request each iteration
    assert not runner.knows(2)


def test_iterative_batch_final_without_outputs_and_empty_iterations():
    runner = runners.IterativeBatch("B", lambda requests: [Final() for _ in requests])
    assert runner.iterate([(1, make_request())]) == [(None, True)]
    calls = []
    idle = runners.IterativeBatch("I", lambda requests: calls.append(requests) or [])
    assert idle.iterate([(None, None), (9, None)]) == [(None, True), (None, True)]  # unknown key, no request
    assert calls == []  # nothing live: the callable is not called


@pytest.mark.parametrize("returned", [[{}], {"y": 1}, None])
def test_iterative_batch_wrong_answers_end_every_request(returned):
    runner = runners.IterativeBatch("W", lambda requests: returned)
    results = runner.iterate([(1, make_request()), (None, None), (2, make_request())])
    message = "model 'W' raised TypeError: must return a list with one entry per request (2)"
    assert [done for _, done in results] == [True, True, True]
    assert results[1] == (None, True)
    assert results[0][0].startswith(message) and results[2][0].startswith(message)
    assert not runner.knows(1) and not runner.knows(2)


def test_iterative_batch_failure_and_forget():
    runner = runners.IterativeBatch("F", boom)
    ((message, done),) = runner.iterate([(1, make_request())])
    assert done and message.startswith("model 'F' raised ValueError: boom")
    keeper = runners.IterativeBatch("K", lambda requests: [{} for _ in requests])
    keeper.iterate([(3, make_request())])
    runners.request_done(3)
    assert not keeper.knows(3)


# -- Async ---------------------------------------------------------------------------------------


def test_async_execute_returns_a_coroutine_that_answers_the_batch():
    async def infer(requests):
        await asyncio.sleep(0)
        return [{"y": r["x"] + 1} for r in requests]

    coroutine = runners.Async("A", infer).execute([make_request(x=[1.0])])
    assert asyncio.iscoroutine(coroutine)
    (answer,) = asyncio.run(coroutine)
    np.testing.assert_array_equal(answer["y"], [2.0])


def test_async_errors_and_wrong_returns_are_messages():
    async def broken(requests):
        raise LookupError("async failure")

    async def wrong(requests):
        return {"y": 1}

    assert asyncio.run(runners.Async("A", broken).execute([make_request()])).startswith(
        "model 'A' raised LookupError: async failure (at test_runners.py:"
    )
    assert asyncio.run(runners.Async("A", wrong).execute([make_request()])) == (
        "model 'A' must return a list with one dict of outputs per request; "
        "it returned dict (use @batch for a function of batched arrays)"
    )


# -- which runner a bound model gets -------------------------------------------------------------

X = [Tensor(name="x", dtype=F32, shape=(-1,))]
Y = [Tensor(name="y", dtype=F32, shape=(-1,))]


def _gen(requests):
    yield [{}]


def _gen_one(request):
    yield {}


async def _coro(requests):
    return []


@pytest.mark.parametrize(
    "func, config, kind",
    [
        (double, ModelConfig(), runners.Plain),
        (_gen, ModelConfig(decoupled=True), runners.Decoupled),
        (_coro, ModelConfig(), runners.Async),
        (double, ModelConfig(sequence_batcher=SequenceBatcher()), runners.Sequence),
        (_gen_one, ModelConfig(decoupled=True, sequence_batcher=SequenceBatcher(iterative=True)), runners.Iterative),
        (double, ModelConfig(decoupled=True, sequence_batcher=SequenceBatcher(iterative=True)), runners.IterativeBatch),
    ],
)
def test_a_binding_chooses_its_runner_once_by_execution_mode(func, config, kind):
    binding = Binding("M", func, X, Y, config)
    assert type(binding.runner) is kind
    assert binding.execute == binding.runner.execute
    assert hasattr(binding, "_iterate") == isinstance(binding.runner, runners.Iterative)


@pytest.mark.parametrize(
    "config", [ModelConfig(decoupled=True), ModelConfig(sequence_batcher=SequenceBatcher())], ids=["decoupled", "seq"]
)
def test_an_async_def_callable_is_refused_on_decoupled_and_sequence_models(config):
    with pytest.raises(InvalidArgumentError, match="model 'M': an async def callable answers each request once"):
        Binding("M", _coro, X, Y, config)


def test_a_batch_rule_that_raises_lets_the_request_in(caplog):
    def rule(candidate, batch):
        if batch:
            raise RuntimeError("rule bug")
        return candidate["x"][0] > 0

    binding = Binding("R", double, X, Y, ModelConfig(batch_rule=rule))
    formed = []
    assert binding._include(formed, make_request(x=[-1.0])) is False and formed == []
    first = make_request(x=[1.0])
    assert binding._include(formed, first) is True and formed == [first]
    with caplog.at_level(logging.ERROR, logger="embedtriton"):
        assert binding._include(formed, make_request(x=[-1.0])) is True
    assert len(formed) == 2 and "batch_rule of model 'R' raised" in caplog.text


def test_async_sets_the_batch_deadline_in_its_own_task(monkeypatch):
    monkeypatch.setattr(deadlines, "used", True)
    seen = []

    async def infer(requests):
        seen.append(deadline.get())
        return [{} for _ in requests]

    asyncio.run(runners.Async("A", infer).execute([make_request({DEADLINE_PARAMETER: 9}), make_request()]))
    assert seen == [9] and deadline.get() is None


def test_the_event_loop_wrapper_answers_the_batch_with_the_result_or_a_message():
    """``aio._run`` (the task on the library's loop) hands the runner's result to finish_batch;
    if the coroutine itself fails (a bug of ours, or cancelled), the batch still gets an answer."""
    from embedtriton.backend import aio

    finished = []

    async def answers():
        return [{"y": 1}]

    async def broken():
        raise RuntimeError("ours")

    asyncio.run(aio._run(answers(), "batch-1", lambda b, r: finished.append((b, r))))
    asyncio.run(aio._run(broken(), "batch-2", lambda b, r: finished.append((b, r))))
    assert finished == [("batch-1", [{"y": 1}]), ("batch-2", "the async model failed: RuntimeError: ours")]


def test_a_request_shows_its_shapes_and_parameters():
    request = make_request({"p": 1}, x=np.zeros((2, 3), F32))
    assert repr(request) == "Request({'x': (2, 3)}, parameters={'p': 1})"
    assert request.span is None and request.data is request
    with pytest.raises(AttributeError):
        request.anything = 1  # __slots__: no attribute but the declared ones
