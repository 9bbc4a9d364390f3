"""``@embedtriton.batch`` (``embedtriton.backend.batch``): a function of batched arrays as a
callable of requests. The requests' inputs are concatenated along axis 0, the outputs split
back by each request's batch size; plain, generator, async and async-generator functions."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from model_side import make_request

from embedtriton import batch
from embedtriton.backend import runners
from embedtriton.backend.batch import concatenate, signature_problem, split_rows


def rows(n, start=0, width=2, dtype=np.float32):
    return (np.arange(n * width, dtype=dtype) + start).reshape(n, width)


def test_inputs_are_concatenated_and_outputs_split_by_request_sizes():
    calls = []

    @batch
    def add_sub(a, b):
        calls.append((a.copy(), b.copy()))
        return {"add": a + b, "sub": a - b}

    requests = [
        make_request(a=rows(1), b=rows(1, 100)),
        make_request(a=rows(3, 10), b=rows(3, 200)),
        make_request(a=rows(2, 20), b=rows(2, 300)),
    ]
    answers = add_sub(requests)
    assert len(calls) == 1
    a, b = calls[0]
    np.testing.assert_array_equal(a, np.concatenate([r["a"] for r in requests]))
    np.testing.assert_array_equal(b, np.concatenate([r["b"] for r in requests]))
    assert a.shape == (6, 2) and a.dtype == np.float32
    assert [len(answer["add"]) for answer in answers] == [1, 3, 2]
    for request, answer in zip(requests, answers, strict=True):
        assert set(answer) == {"add", "sub"}
        np.testing.assert_array_equal(answer["add"], request["a"] + request["b"])
        np.testing.assert_array_equal(answer["sub"], request["a"] - request["b"])


def test_one_request_is_passed_through_without_concatenation():
    seen = {}

    @batch
    def identity(x):
        seen["x"] = x
        return {"y": x}

    request = make_request(x=rows(4))
    (answer,) = identity([request])
    assert seen["x"] is request["x"]  # no copy for a batch of one
    assert answer["y"] is request["x"] and type(answer) is dict


def test_outputs_are_views_of_the_batched_output():
    out = np.arange(6.0).reshape(3, 2)

    @batch
    def func(x):
        return {"y": out}

    answers = func([make_request(x=rows(1)), make_request(x=rows(2))])
    assert all(np.shares_memory(answer["y"], out) for answer in answers)


def test_parameters_reach_a_function_that_asks_for_them():
    seen = []

    @batch
    def scaled(x, parameters):
        seen.append(parameters)
        return {"y": x}

    requests = [make_request({"scale": 2}, x=rows(1)), make_request({"scale": 3}, x=rows(2))]
    assert len(scaled(requests)) == 2
    assert seen == [[{"scale": 2}, {"scale": 3}]]  # one dict per request, in order
    assert seen[0][0] is requests[0].parameters
    scaled([make_request({"k": 1}, x=rows(1))])  # a batch of one too
    assert seen[-1] == [{"k": 1}]


def test_a_function_without_parameters_does_not_get_them():
    @batch
    def func(x):
        return {"y": x}

    func([make_request({"scale": 2}, x=rows(1)), make_request({"scale": 3}, x=rows(1))])  # no TypeError


def test_requests_with_different_inputs_cannot_be_batched():
    @batch
    def func(x, bias=None):
        return {"y": x}

    with pytest.raises(ValueError) as info:
        func([make_request(x=rows(1)), make_request(x=rows(1), bias=rows(1))])
    assert str(info.value) == (
        "@batch cannot concatenate requests that carry different inputs (['bias', 'x'], ['x']): optional "
        "inputs were left out by some; handle the requests one group at a time (a raw infer_func), or fill "
        "the missing inputs before batching"
    )


def test_a_single_request_may_leave_an_optional_input_out():
    @batch
    def func(x, bias=None):
        return {"y": x if bias is None else x + bias}

    (answer,) = func([make_request(x=rows(2))])
    np.testing.assert_array_equal(answer["y"], rows(2))


def test_requests_whose_rows_do_not_fit_raise_numpys_error():
    @batch
    def func(x):
        return {"y": x}

    with pytest.raises(ValueError, match="dimension"):
        func([make_request(x=rows(1, width=2)), make_request(x=rows(1, width=3))])


def test_a_runner_turns_the_batching_error_into_the_callers_message():
    @batch
    def func(x, bias=None):
        return {"y": x}

    message = runners.Plain("M", func).execute([make_request(x=rows(1)), make_request(x=rows(1), bias=rows(1))])
    assert message.startswith("model 'M' raised ValueError: @batch cannot concatenate requests")


def test_bytes_object_arrays_are_batched_and_split():
    @batch
    def upper(text):
        assert text.dtype == object and text.shape == (3, 1)
        return {"out": np.array([[t[0].upper()] for t in text], dtype=object)}

    requests = [
        make_request(text=np.array([[b"ab"]], dtype=object)),
        make_request(text=np.array([[b"cd"], [b""]], dtype=object)),
    ]
    answers = upper(requests)
    assert answers[0]["out"].tolist() == [[b"AB"]]
    assert answers[1]["out"].tolist() == [[b"CD"], [b""]]
    assert answers[1]["out"].dtype == object


def test_equal_dtypes_are_kept():
    @batch
    def func(x):
        return {"y": x}

    for dtype in (np.int8, np.uint64, np.float16, np.bool_):
        answers = func([make_request(x=np.zeros((1, 2), dtype)), make_request(x=np.ones((2, 2), dtype))])
        assert answers[0]["y"].dtype == dtype and answers[1]["y"].shape == (2, 2)


@pytest.mark.parametrize("returned, kind", [([1, 2], "list"), (np.zeros(2), "ndarray"), (3, "int")])
def test_a_batch_function_must_return_a_dict(returned, kind):
    @batch
    def func(x):
        return returned

    with pytest.raises(TypeError) as info:
        func([make_request(x=rows(1)), make_request(x=rows(1))])
    assert str(info.value) == (
        f"a @batch function must return a dict of arrays (output name -> batched array), not {kind}"
    )


def test_a_batch_function_returning_none_answers_none_per_request():
    @batch
    def func(x):
        return None

    assert func([make_request(x=rows(1)), make_request(x=rows(2))]) == [None, None]


def test_list_outputs_are_split_as_arrays():
    @batch
    def func(x):
        return {"y": [[1], [2], [3]]}

    answers = func([make_request(x=rows(1)), make_request(x=rows(2))])
    assert [a["y"].tolist() for a in answers] == [[[1]], [[2], [3]]]


def test_a_generator_is_split_at_every_step():
    @batch
    def stream(x):
        for i in range(3):
            yield {"y": x + i}

    steps = list(stream([make_request(x=rows(1)), make_request(x=rows(2, 10))]))
    assert len(steps) == 3
    for i, (first, second) in enumerate(steps):
        np.testing.assert_array_equal(first["y"], rows(1) + i)
        np.testing.assert_array_equal(second["y"], rows(2, 10) + i)
    assert stream.batched is True


def test_a_generator_step_may_be_none():
    @batch
    def stream(x):
        yield None
        yield {"y": x}

    steps = list(stream([make_request(x=rows(1)), make_request(x=rows(1))]))
    assert steps[0] == [None, None] and len(steps[1]) == 2


def test_async_functions_and_async_generators():
    @batch
    async def coro(x):
        await asyncio.sleep(0)
        return {"y": x * 2}

    @batch
    async def agen(x):
        for i in range(2):
            yield {"y": x + i}

    requests = [make_request(x=rows(1)), make_request(x=rows(2, 4))]
    answers = asyncio.run(coro(requests))
    np.testing.assert_array_equal(answers[1]["y"], rows(2, 4) * 2)

    async def collect():
        return [step async for step in agen(requests)]

    steps = asyncio.run(collect())
    assert len(steps) == 2 and steps[1][0]["y"].tolist() == (rows(1) + 1).tolist()
    assert coro.batched and agen.batched
    assert asyncio.iscoroutinefunction(coro)


def test_batch_keeps_the_functions_name_and_marks_it_batched():
    @batch
    def my_model(x):
        """Doc."""
        return {"y": x}

    assert my_model.__name__ == "my_model" and my_model.__doc__ == "Doc."
    assert my_model.batched is True
    assert signature_problem(my_model) is None


def test_the_runners_use_batch_functions_as_any_callable():
    @batch
    def double(x):
        return {"y": x * 2}

    answers = runners.Plain("D", double).execute([make_request(x=rows(1)), make_request(x=rows(3))])
    assert [a["y"].shape for a in answers] == [(1, 2), (3, 2)]


def test_concatenate_and_split_rows_helpers():
    joined = concatenate([rows(1), rows(2, 5)])
    assert joined.shape == (3, 2)
    parts = split_rows(joined, [1])
    assert [p.shape for p in parts] == [(1, 2), (2, 2)]
    assert [p.tolist() for p in split_rows([1, 2, 3], [1, 1])] == [[1], [], [2, 3]]


def test_output_rows_are_split_by_input_sizes_without_a_check():
    """A batch function that returns the wrong number of rows is not caught here (the backend's
    output shape check refuses the parts whose batch size is wrong): the last request gets the
    surplus, or the requests beyond the rows get empty arrays."""

    @batch
    def short(x):
        return {"y": x[:-1]}

    answers = short([make_request(x=rows(1)), make_request(x=rows(1)), make_request(x=rows(1))])
    assert [len(a["y"]) for a in answers] == [1, 1, 0]


def signature_of(func):
    return signature_problem(func)


def test_signature_problem_spots_a_function_of_arrays_without_batch():
    def arrays(a, b):
        return {}

    assert signature_of(arrays) == (
        "infer_func(a, b) is called with one argument, the list of requests; for a function "
        "of batched arrays (one keyword argument per input), decorate it with @embedtriton.batch"
    )

    def keywords_only(*, a):
        return {}

    assert signature_of(keywords_only).startswith("infer_func(a) is called with one argument")


@pytest.mark.parametrize(
    "func",
    [
        lambda requests: requests,
        lambda requests, extra=1: requests,
        lambda *args: args,
        lambda requests, **kwargs: requests,
        print,
    ],
    ids=["one", "one-and-default", "varargs", "one-and-kwargs", "builtin"],
)
def test_signature_problem_accepts_one_argument_callables(func):
    assert signature_of(func) is None
