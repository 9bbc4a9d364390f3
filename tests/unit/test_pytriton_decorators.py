"""PyTriton's decorators on embedtriton (``embedtriton.pytriton.decorators``), without Triton:
the semantics PyTriton documents (and its own unit tests pin), checked on plain requests.

Decorators that read the served model's configuration find it through the model being served
(``_serving.current()``); the tests make a model current the way the bound callable does
(``_serving.serving``), or set it directly with the ``serve`` fixture.
"""

from __future__ import annotations

import numpy as np
import pytest
from model_side import make_request

from embedtriton.pytriton import _serving
from embedtriton.pytriton.decorators import (
    TRITON_CONTEXT_FIELD_NAME,
    ConstantPadder,
    batch,
    convert_output,
    fill_optionals,
    first_value,
    get_inference_request_batch_size,
    get_model_config,
    get_triton_context,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from embedtriton.pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonRuntimeError,
    PyTritonUnrecoverableError,
    PyTritonValidationError,
)
from embedtriton.pytriton.model_config.common import DynamicBatcher
from embedtriton.pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig

I64 = np.int64
AB_CONFIG = TritonModelConfig(
    model_name="AB",
    inputs=[TensorSpec("a", (1,), I64), TensorSpec("b", (2,), I64)],
    outputs=[TensorSpec("a", (1,), I64), TensorSpec("b", (2,), I64)],
)


@pytest.fixture
def serve():
    """serve(config): make a model with ``config`` the one being served until the test ends."""
    tokens = []

    def start(config, context=None):
        served = _serving.Served(config, context or _serving.TritonContext())
        tokens.append(_serving._current.set(served))
        return served

    yield start
    for token in reversed(tokens):
        _serving._current.reset(token)


def three_requests():
    return [
        make_request(a=[[1], [2]], b=[[1, 2], [3, 4]]),
        make_request(a=[[3]], b=[[5, 6]]),
        make_request(a=[[4], [5], [6]], b=[[7, 8], [9, 10], [11, 12]]),
    ]


# -- helpers -------------------------------------------------------------------------------------


def test_batch_size_is_the_first_dimension_of_the_first_input():
    assert get_inference_request_batch_size({"a": np.zeros((3, 2)), "b": np.zeros((5,))}) == 3
    assert type(get_inference_request_batch_size({"a": np.zeros((7,))})) is int


def test_the_model_config_is_only_known_while_a_model_is_served(serve):
    with pytest.raises(PyTritonValidationError, match="must bound with triton to get  __triton_context__"):
        get_model_config()
    served = serve(AB_CONFIG)
    assert get_model_config() is AB_CONFIG
    assert get_triton_context() is served.context
    assert served.context.model_config is AB_CONFIG


def test_convert_output_matches_a_list_to_the_declared_outputs(serve):
    a, b = np.zeros(1), np.ones(2)
    assert convert_output({"x": a}) == {"x": a}  # a dict as it is, no config needed
    serve(AB_CONFIG)
    converted = convert_output([a, b])
    assert list(converted) == ["a", "b"] and converted["a"] is a and converted["b"] is b
    with pytest.raises(PyTritonValidationError, match="Outputs length different than config outputs length"):
        convert_output((a,))
    with pytest.raises(PyTritonValidationError, match="Unsupported output type <class 'numpy.ndarray'>"):
        convert_output(a)


# -- @batch --------------------------------------------------------------------------------------


def test_batch_concatenates_and_splits_back_by_request_sizes():
    calls = []

    @batch
    def model(a, b):
        calls.append((a, b))
        return {"a": a * 10, "b": b + 1}

    requests = three_requests()
    answers = model(requests)
    ((a, b),) = calls
    assert a.tolist() == [[1], [2], [3], [4], [5], [6]] and b.shape == (6, 2)
    assert [answer["a"].tolist() for answer in answers] == [[[10], [20]], [[30]], [[40], [50], [60]]]
    for request, answer in zip(requests, answers, strict=True):
        np.testing.assert_array_equal(answer["b"], request["b"] + 1)


def test_batch_accepts_outputs_as_a_list_in_the_declared_order(serve):
    serve(AB_CONFIG)

    @batch
    def model(a, b):
        return [a, b]

    answers = model(three_requests())
    assert [sorted(answer) for answer in answers] == [["a", "b"]] * 3
    assert answers[2]["b"].tolist() == [[7, 8], [9, 10], [11, 12]]


def test_batch_refuses_outputs_of_another_batch_size():
    @batch
    def model(a, b):
        return {"a": a[:-1], "b": b}

    with pytest.raises(ValueError) as info:
        model(three_requests())
    assert str(info.value) == (
        "Received output tensors with different batch sizes: a: (5, 1). Expected batch size: 6. "
    )


def test_batch_refuses_requests_with_different_inputs():
    @batch
    def model(**inputs):
        return inputs

    with pytest.raises(PyTritonValidationError, match="Cannot batch requests with different set of inputs keys"):
        model([make_request(a=[[1]]), make_request(a=[[1]], b=[[1, 2]])])


def test_batch_on_a_method_and_with_keyword_arguments_passed_on():
    class Model:
        factor = 3

        @batch
        def __call__(self, a, extra=None, **_):
            return {"a": a * self.factor + (extra or 0)}

    answers = Model()([make_request(a=[[1]]), make_request(a=[[2]])])
    assert [answer["a"].tolist() for answer in answers] == [[[3]], [[6]]]


def test_batch_splits_every_step_of_a_generator():
    @batch
    def stream(a, b):
        for i in range(2):
            yield {"a": a + i}

    steps = list(stream(three_requests()))
    assert len(steps) == 2
    assert [answer["a"].tolist() for answer in steps[1]] == [[[2], [3]], [[4]], [[5], [6], [7]]]


def test_batch_of_an_async_function():
    import asyncio

    @batch
    async def model(a, b):
        return {"a": -a}

    answers = asyncio.run(model(three_requests()))
    assert answers[1]["a"].tolist() == [[-3]]


def test_batch_of_bytes_inputs():
    @batch
    def model(s):
        return {"n": np.array([[len(x[0])] for x in s])}

    answers = model(
        [make_request(s=np.array([[b"ab"]], dtype=object)), make_request(s=np.array([[b"xyz"]], dtype=object))]
    )
    assert [answer["n"].tolist() for answer in answers] == [[[2]], [[3]]]


# -- @sample -------------------------------------------------------------------------------------


def test_sample_calls_with_the_first_requests_inputs(serve):
    seen = []

    @sample
    def model(a, b):
        seen.append((a, b))
        return {"a": a * 2, "b": b * 3}

    requests = three_requests()
    answers = model(requests)
    assert len(seen) == 1 and seen[0][0] is requests[0]["a"]
    assert len(answers) == 1
    np.testing.assert_array_equal(answers[0]["b"], requests[0]["b"] * 3)

    serve(AB_CONFIG)

    @sample
    def as_list(a, b):
        return [a * 2, b * 3]

    (answer,) = as_list(requests[:1])
    np.testing.assert_array_equal(answer["a"], requests[0]["a"] * 2)


def test_sample_of_a_generator_answers_each_step():
    @sample
    def stream(a):
        yield {"a": a}
        yield {"a": a + 1}

    steps = list(stream([make_request(a=[1])]))
    assert [[s["a"].tolist() for s in step] for step in steps] == [[[1]], [[2]]]


# -- @group_by_keys ------------------------------------------------------------------------------


def test_group_by_keys_calls_once_per_set_of_inputs_and_answers_in_order():
    calls = []

    @group_by_keys
    def model(requests):
        calls.append(sorted(requests[0]))
        assert all(r.keys() == requests[0].keys() for r in requests)
        return [{"n": np.array([len(r)])} for r in requests]

    requests = [
        make_request(b=[[3, 4]]),
        make_request(a=[[1]]),
        make_request(a=[[1]], b=[[1, 2]]),
        make_request(a=[[2]]),
    ]
    answers = model(requests)
    assert [answer["n"].tolist() for answer in answers] == [[1], [1], [2], [1]]
    assert calls == [["a"], ["a", "b"], ["b"]]  # sorted by the groups' sorted input names


def test_group_by_keys_with_one_group_passes_the_batch_through():
    seen = []

    @group_by_keys
    def model(requests):
        seen.append(requests)
        return "untouched"

    requests = three_requests()
    assert model(requests) == "untouched" and seen == [requests]


def test_group_by_keys_above_batch_lets_optional_inputs_batch():
    @group_by_keys
    @batch
    def model(a, b=None):
        return {"y": a + (0 if b is None else b[:, :1])}

    answers = model([make_request(a=[[1]]), make_request(a=[[1]], b=[[10, 0]]), make_request(a=[[2]])])
    assert [answer["y"].tolist() for answer in answers] == [[[1]], [[11]], [[2]]]


def test_group_by_keys_refuses_a_generator_over_several_groups():
    @group_by_keys
    def stream(requests):
        yield [{} for _ in requests]

    with pytest.raises(PyTritonRuntimeError, match="cannot answer several groups in one batch"):
        stream([make_request(a=[[1]]), make_request(b=[[1, 2]])])


# -- @group_by_values ----------------------------------------------------------------------------


def test_group_by_values_calls_once_per_value_and_merges_in_row_order():
    calls = []

    @group_by_values("a")
    def model(a, b):
        calls.append((a.ravel().tolist(), b.tolist()))
        return {"y": b * a}

    a = np.array([[2], [1], [2], [1], [3]])
    b = np.arange(10).reshape(5, 2)
    result = model(a=a, b=b)
    assert calls == [
        ([1, 1], [[2, 3], [6, 7]]),
        ([2, 2], [[0, 1], [4, 5]]),
        ([3], [[8, 9]]),
    ]  # groups sorted by the key's bytes, rows in order within a group
    np.testing.assert_array_equal(result["y"], b * a)


def test_group_by_values_with_one_value_calls_once_unchanged():
    seen = []

    @group_by_values("a")
    def model(**inputs):
        seen.append(inputs)
        return "as returned"

    a = np.array([[1], [1]])
    assert model(a=a) == "as returned" and seen[0]["a"] is a


def test_group_by_values_of_strings_and_of_two_keys():
    calls = []

    @group_by_values("a", "s")
    def model(a, s):
        calls.append((a.ravel().tolist(), s.tolist()))
        return {"a": a}

    a = np.array([[1], [1], [1], [2]])
    s = np.array([["t2"], ["t1"], ["t2"], ["t1"]], dtype=object)
    result = model(a=a, s=s)
    assert calls == [([1], [["t1"]]), ([1, 1], [["t2"], ["t2"]]), ([2], [["t1"]])]
    np.testing.assert_array_equal(result["a"], a)


def test_group_by_values_ignores_keys_the_batch_does_not_carry():
    calls = []

    @group_by_values("a", "missing")
    def model(a):
        calls.append(a.ravel().tolist())
        return {"a": a}

    model(a=np.array([[1], [2], [1]]))
    assert calls == [[1, 1], [2]]


def test_group_by_values_must_be_below_batch():
    @group_by_values("a")
    def model(requests):
        return requests

    with pytest.raises(PyTritonRuntimeError, match="must be used after the @batch decorator"):
        model([make_request(a=[[1]])])


def test_group_by_values_passes_the_triton_context_on_to_each_group():
    seen = []

    @group_by_values("a")
    def model(a, triton_context):
        seen.append(triton_context)
        return {"a": a}

    context = object()
    model(a=np.array([[1], [2]]), triton_context=context)
    assert seen == [context, context]


def test_group_by_values_outputs_of_different_widths_need_a_padder():
    def ragged(a):
        width = int(a[0, 0])
        return {"y": np.full((len(a), width), width, dtype=np.int32)}

    a = np.array([[2], [1], [2]])
    with pytest.raises(ValueError):
        group_by_values("a")(ragged)(a=a)
    result = group_by_values("a", pad_fn=ConstantPadder(-1))(ragged)(a=a)
    assert result["y"].tolist() == [[2, 2], [1, -1], [2, 2]]
    assert result["y"].dtype == np.int32


def test_constant_padder_pads_bytes_with_empty_strings():
    padded = ConstantPadder(0)(
        [
            {"s": np.array([[b"ab", b"c"]])},
            {"s": np.array([[b"abcdef"]])},
        ]
    )
    assert padded[0]["s"].tolist() == [[b"ab", b"c"]]
    assert padded[1]["s"].tolist() == [[b"abcdef", b""]]
    assert padded[0]["s"].dtype == padded[1]["s"].dtype == np.dtype("S6")


def test_constant_padder_refuses_different_dtypes():
    with pytest.raises(PyTritonRuntimeError, match="must have the same dtype"):
        ConstantPadder()([{"y": np.zeros((1, 1), np.int32)}, {"y": np.zeros((1, 2), np.float32)}])


# -- @fill_optionals -----------------------------------------------------------------------------


def test_fill_optionals_fills_what_a_request_left_out_one_row_each(serve):
    serve(AB_CONFIG)
    seen = []

    @fill_optionals(a=np.array([-1]), b=np.array([-5, -6]))
    def model(requests):
        seen.extend(requests)
        return requests

    requests = [make_request(a=[[7], [8]]), make_request(b=[[1, 2], [3, 4], [5, 6]])]
    model(requests)
    assert seen[0]["b"].tolist() == [[-5, -6], [-5, -6]]
    assert seen[0]["a"].tolist() == [[7], [8]]  # given inputs are kept
    assert seen[1]["a"].tolist() == [[-1], [-1], [-1]]
    assert seen[0] is requests[0]  # the same Request (parameters kept)


def test_fill_optionals_on_a_model_without_batching_uses_the_default_as_it_is(serve):
    serve(TritonModelConfig(model_name="NB", batching=False, inputs=[TensorSpec("a", (2,), I64)], outputs=[]))
    default = np.array([-1, -2])

    @fill_optionals(a=default)
    def model(requests):
        return requests

    (request,) = model([make_request()])
    assert request["a"] is default


@pytest.mark.parametrize(
    "defaults, message",
    [
        ({"c": np.array([1])}, "Could not found c inputs"),
        ({"a": 1}, "Could not use a=1 defaults as they are not NumPy arrays"),
        (
            {"a": np.array([1.0])},
            "Could not use a: dtype=float64 expected_dtype=<class 'numpy.int64'> defaults as they have different "
            "than input signature dtypes",
        ),
        (
            {"b": np.array([1, 2, 3])},
            "Could not use b: shape=(3,) expected_shape=(2,) defaults as they have different than input "
            "signature shapes",
        ),
    ],
)
def test_fill_optionals_checks_its_defaults_against_the_inputs(serve, defaults, message):
    serve(AB_CONFIG)

    @fill_optionals(**defaults)
    def model(requests):
        return requests

    with pytest.raises(PyTritonBadParameterError) as info:
        model([make_request(a=[[1]], b=[[1, 2]])])
    assert str(info.value) == message


def test_fill_optionals_takes_any_bytes_default_for_a_bytes_input(serve):
    serve(TritonModelConfig(model_name="S", inputs=[TensorSpec("s", (-1,), np.bytes_)], outputs=[]))

    @fill_optionals(s=np.array(["x", "yz"]))  # a unicode array for a bytes input
    def model(requests):
        return requests

    (request,) = model([make_request(other=[[0]])])
    assert request["s"].tolist() == [["x", "yz"]]


# -- @triton_context, @pad_batch, @first_value ---------------------------------------------------


def test_triton_context_adds_the_keyword_argument(serve):
    context = _serving.TritonContext()
    served = serve(AB_CONFIG, context)

    @triton_context
    def model(requests, **kwargs):
        return kwargs

    kwargs = model([])
    assert list(kwargs) == [TRITON_CONTEXT_FIELD_NAME] and kwargs["triton_context"] is served.context
    assert kwargs["triton_context"].model_config is AB_CONFIG


def test_triton_context_outside_a_served_model_says_so():
    @triton_context
    def model(requests, triton_context):
        return triton_context

    with pytest.raises(PyTritonValidationError, match="must bound with triton"):
        model([])


def test_model_configs_look_up_a_bound_call_method_by_its_object():
    class Model:
        def __call__(self, requests):
            return []

    instance, config = Model(), TritonModelConfig(model_name="M")
    configs = _serving.ModelConfigs()
    configs[instance.__call__] = config
    assert configs[instance] is config and instance.__call__ in configs and instance in configs


@pytest.mark.parametrize(
    "preferred, size, padded_to",
    [([2, 4, 6], 3, 4), ([2, 4, 6], 4, 4), ([2, 4, 6], 7, 8), (None, 3, 8), (None, 8, 8), ([2], 1, 2)],
)
def test_pad_batch_repeats_the_last_row_up_to_the_next_preferred_size(serve, preferred, size, padded_to):
    serve(TritonModelConfig(model_name="P", max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=preferred)))
    seen = []

    @pad_batch
    def model(a, b):
        seen.append((a, b))
        return {"a": a, "b": b, "fixed": np.zeros(3)}

    a = np.arange(size).reshape(size, 1)
    b = np.arange(size * 2).reshape(size, 2)
    result = model(a=a, b=b)
    padded_a, padded_b = seen[0]
    assert len(padded_a) == len(padded_b) == padded_to
    assert (padded_a[size:] == a[-1]).all() and (padded_b[size:] == b[-1]).all()
    np.testing.assert_array_equal(padded_a[:size], a)
    # outputs of the padded size are cut back to the rows that came in; others are kept
    np.testing.assert_array_equal(result["a"], a)
    assert result["fixed"].shape == (3,)


def test_pad_batch_without_a_batcher_pads_to_max_batch_size(serve):
    serve(TritonModelConfig(model_name="P", max_batch_size=4))

    @pad_batch
    def model(a):
        return {"n": np.full(len(a), len(a))}

    assert model(a=np.zeros((1, 1)))["n"].tolist() == [4]


def test_first_value_below_batch_takes_the_first_row(serve):
    serve(AB_CONFIG)
    seen = []

    @first_value("b", "c")  # c: an optional input left out
    def model(**inputs):
        seen.append(inputs)
        return inputs

    model(a=np.array([1, 2, 3]), b=np.array([[[1]], [[1]], [[1]]]))
    assert seen[0]["b"] == 1 and not isinstance(seen[0]["b"], np.ndarray)
    assert seen[0]["a"].tolist() == [1, 2, 3]
    model(a=np.array([1]), b=np.array([[[1], [2]], [[1], [2]]]))
    assert seen[1]["b"].tolist() == [[1], [2]]  # a row with several elements stays an array
    model(a=np.array([1]), b=np.array(["v", "v"], dtype=object))
    assert seen[2]["b"] == "v"


def test_first_value_strictness_and_squeezing(serve):
    serve(AB_CONFIG)

    @first_value("a")
    def strict(**inputs):
        return inputs

    with pytest.raises(PyTritonRuntimeError, match="The values on the 'a' input are not equal"):
        strict(a=np.array([[1], [2], [2]]))

    @first_value("a", strict=False, squeeze_single_values=False)
    def lenient(**inputs):
        return inputs

    assert lenient(a=np.array([[1], [2]]))["a"].tolist() == [1]


def test_first_value_on_the_request_list(serve):
    serve(AB_CONFIG)

    @first_value("b", "optional")
    def model(requests):
        return requests

    requests = model([make_request(a=[[1], [2]], b=[[[7]], [[7]]]), make_request(a=[[3]], b=[[[8]]])])
    assert requests[0]["b"] == 7 and requests[1]["b"] == 8
    assert requests[0]["a"].tolist() == [[1], [2]]


def test_first_value_needs_a_batching_model_and_refuses_special_keys(serve):
    with pytest.raises(PyTritonBadParameterError, match="not allowed as keys for @first_value wrapper"):
        first_value("__triton_context__")
    serve(TritonModelConfig(model_name="NB", batching=False))

    @first_value("a")
    def model(**inputs):
        return inputs

    with pytest.raises(PyTritonRuntimeError, match="can only be used with models that support batching"):
        model(a=np.array([[1]]))


# -- the bound callable (``_serving.serving``) makes the model current ---------------------------


def test_serving_makes_the_config_current_for_a_decorator_stack():
    config = TritonModelConfig(
        model_name="Stack",
        max_batch_size=4,
        inputs=[TensorSpec("a", (1,), I64), TensorSpec("t", (1,), I64)],
        outputs=[TensorSpec("y", (1,), I64)],
    )

    @fill_optionals(t=np.array([100]))
    @batch
    @first_value("t")
    @triton_context
    def model(a, t, triton_context):
        assert triton_context.model_config is config
        return [a + t]

    infer = _serving.serving([model], _serving.Served(config, _serving.TritonContext()), lambda exc: None)
    answers = infer([make_request(a=[[1]]), make_request(a=[[2], [3]])])
    assert [answer["y"].tolist() for answer in answers] == [[[101]], [[102], [103]]]
    answers = infer([make_request(a=[[1]], t=[[5]]), make_request(a=[[2]], t=[[5]])])
    assert [answer["y"].tolist() for answer in answers] == [[[6]], [[7]]]
    # a filled default and a sent value in one batch are not equal: @first_value (strict) says so
    with pytest.raises(PyTritonRuntimeError, match="The values on the 't' input are not equal"):
        infer([make_request(a=[[1]]), make_request(a=[[2]], t=[[5]])])
    with pytest.raises(PyTritonValidationError):  # outside the call, no model is current
        get_model_config()


def test_serving_orders_inputs_as_declared_and_runs_generator_steps_in_the_model():
    config = TritonModelConfig(
        model_name="Gen",
        inputs=[TensorSpec("a", (1,), I64), TensorSpec("b", (1,), I64)],
        outputs=[TensorSpec("a", (1,), I64), TensorSpec("b", (1,), I64)],
    )

    @batch
    def stream(**inputs):
        assert list(inputs) == ["a", "b"]  # the declared order, whatever the request's
        yield [inputs["a"], inputs["b"]]  # a list: matched to the declared outputs (needs the config)

    infer = _serving.serving([stream], _serving.Served(config, _serving.TritonContext()), lambda exc: None)
    request = make_request(b=[[2]], a=[[1]])
    (step,) = list(infer([request]))
    assert step[0]["a"].tolist() == [[1]] and step[0]["b"].tolist() == [[2]]
    assert list(request) == ["a", "b"]
    with pytest.raises(PyTritonValidationError):  # outside the call, no model is current
        get_model_config()


def test_serving_reports_an_unrecoverable_error():
    reported = []

    def model(requests):
        raise PyTritonUnrecoverableError("gone")

    config = TritonModelConfig(model_name="U")
    infer = _serving.serving([model], _serving.Served(config, _serving.TritonContext()), reported.append)
    with pytest.raises(PyTritonUnrecoverableError):
        infer([make_request(a=[[1]])])
    assert len(reported) == 1 and str(reported[0]) == "gone"
