"""Our decorators against PyTriton 0.7.0's own (``pytriton.decorators`` from the nvidia-pytriton
wheel), on the same requests: every error they raise (type and message), and the order in which
``@group_by_values`` and ``@group_by_keys`` hand their groups to the function.

Ours read the served model's configuration from the model being served (set here as a bound
model sets it); PyTriton's read it from the callable's ``__triton_context__``, which its
``Triton.bind`` attaches and which is attached here the same way. Where PyTriton's wheel is not
installed, each case still checks our side against the expected text."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from embedtriton import Request
from embedtriton.pytriton import _serving
from embedtriton.pytriton import decorators as ours
from embedtriton.pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig

F32 = np.float32


@pytest.fixture(scope="module")
def theirs(stock_pytriton) -> Any:
    """PyTriton's decorators module, or None (then each case checks ours alone)."""
    return stock_pytriton("decorators")


def config_of(batching: bool = True, inputs: tuple[str, ...] = ("a", "b"), outputs: tuple[str, ...] = ("y",)) -> Any:
    return dict(
        model_name="M",
        max_batch_size=8 if batching else 0,
        batching=batching,
        inputs=[TensorSpec(n, (1,), np.float32) for n in inputs],
        outputs=[TensorSpec(n, (1,), np.float32) for n in outputs],
    )


@contextlib.contextmanager
def serving(config: dict[str, Any]) -> Iterator[None]:
    """Our decorators see ``config`` as the served model's (what a bound model's call sets)."""
    token = _serving._current.set(_serving.Served(TritonModelConfig(**config), _serving.TritonContext()))
    try:
        yield
    finally:
        _serving._current.reset(token)


def bound_theirs(module: Any, func: Callable[..., Any], config: dict[str, Any]) -> None:
    """PyTriton's decorators see ``config`` as ``func``'s (what its Triton.bind attaches)."""
    from pytriton.model_config.triton_model_config import TensorSpec as Spec
    from pytriton.model_config.triton_model_config import TritonModelConfig as Config

    theirs_config = dict(config)
    theirs_config["inputs"] = [Spec(s.name, s.shape, s.dtype) for s in config["inputs"]]
    theirs_config["outputs"] = [Spec(s.name, s.shape, s.dtype) for s in config["outputs"]]
    context = module.TritonContext()
    context.model_configs[func] = Config(**theirs_config)
    func.__triton_context__ = context


def requests_for(module: Any, *rows: dict[str, np.ndarray]) -> list[Any]:
    if module is ours:
        return [Request(**{k: np.asarray(v) for k, v in row.items()}) for row in rows]
    from pytriton.proxy.types import Request as TheirRequest

    return [TheirRequest(data={k: np.asarray(v) for k, v in row.items()}) for row in rows]


def raised(call: Callable[[], Any]) -> tuple[str, str]:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    raise AssertionError("nothing was raised")


def compare(case: Callable[[Any], tuple[str, str]], expected: tuple[str, str], theirs: Any) -> None:
    """``case(module)`` raises the same for ours and PyTriton's, and that is ``expected``."""
    assert case(ours) == expected
    if theirs is not None:
        assert case(theirs) == expected


def with_config(
    module: Any,
    make: Callable[[Callable[..., Any]], Callable[..., Any]],
    inner: Callable[..., Any],
    config: dict[str, Any],
    rows: list[dict[str, Any]],
) -> tuple[str, str]:
    """Decorate ``inner`` with ``make`` (given the module), serve it as ``config``'s model, call it."""
    decorated = make(inner)
    requests = requests_for(module, *rows)
    if module is ours:
        with serving(config):
            return raised(lambda: decorated(requests))
    bound_theirs(module, inner, config)
    return raised(lambda: decorated(requests))


ONE = {"a": np.ones((1, 1), F32), "b": np.ones((1, 1), F32)}


def test_batch_errors(theirs):
    compare(
        lambda m: raised(lambda: m.batch(lambda **kw: kw)(requests_for(m, ONE, {"a": np.ones((1, 1), F32)}))),
        ("PyTritonValidationError", "Cannot batch requests with different set of inputs keys"),
        theirs,
    )
    compare(
        lambda m: raised(
            lambda: m.batch(lambda a, b: {"y": np.ones((3, 1)), "z": np.ones((2, 1))})(requests_for(m, ONE, ONE))
        ),
        ("ValueError", "Received output tensors with different batch sizes: y: (3, 1). Expected batch size: 2. "),
        theirs,
    )


def test_output_conversion_errors(theirs):
    def case(module: Any, returned: Any) -> tuple[str, str]:
        def inner(a, b):
            return returned

        return with_config(module, lambda f: module.batch(f), inner, config_of(), [ONE])

    compare(
        lambda m: case(m, [np.ones((1, 1)), np.ones((1, 1))]),
        ("PyTritonValidationError", "Outputs length different than config outputs length"),
        theirs,
    )
    compare(lambda m: case(m, 5), ("PyTritonValidationError", "Unsupported output type <class 'int'>."), theirs)


def test_a_decorator_outside_a_bound_model(theirs):
    compare(
        lambda m: raised(lambda: m.triton_context(lambda requests, **kw: kw)(requests_for(m, ONE))),
        ("PyTritonValidationError", "Wrapped function or object must bound with triton to get  __triton_context__"),
        theirs,
    )


def test_group_by_values_above_batch_is_refused(theirs):
    def case(module: Any) -> tuple[str, str]:
        decorated = module.group_by_values("a")(module.batch(lambda a, b: {"y": a}))
        return raised(lambda: decorated(requests_for(module, ONE)))

    compare(
        case,
        ("PyTritonRuntimeError", "The @group_by_values decorator must be used after the @batch decorator."),
        theirs,
    )


def test_constant_padder_refuses_mixed_dtypes(theirs):
    compare(
        lambda m: raised(lambda: m.ConstantPadder()([{"y": np.ones((1, 2), F32)}, {"y": np.ones((1, 3), np.int32)}])),
        ("PyTritonRuntimeError", "All input arrays for given input name must have the same dtype."),
        theirs,
    )


@pytest.mark.parametrize(
    ("defaults", "expected"),
    [
        ({"c": np.ones(1, F32)}, "Could not found c inputs"),
        ({"b": [1.0]}, "Could not use b=[1.0] defaults as they are not NumPy arrays"),
        (
            {"b": np.ones(1, np.float64)},
            "Could not use b: dtype=float64 expected_dtype=<class 'numpy.float32'> defaults as they have different "
            "than input signature dtypes",
        ),
        (
            {"b": np.ones(2, F32)},
            "Could not use b: shape=(2,) expected_shape=(1,) defaults as they have different than input signature "
            "shapes",
        ),
    ],
)
def test_fill_optionals_errors(defaults, expected, theirs):
    def case(module: Any) -> tuple[str, str]:
        return with_config(
            module,
            lambda f: module.fill_optionals(**defaults)(module.batch(f)),
            lambda a, b: {"y": a},
            config_of(),
            [{"a": np.ones((1, 1), F32)}],
        )

    compare(case, ("PyTritonBadParameterError", expected), theirs)


def test_first_value_errors(theirs):
    # PyTriton's words; ours refuse triton_context too (what @triton_context adds is no input either)
    expected = (
        "The keys __triton_context__ are not allowed as keys for @first_value wrapper. The set of not allowed keys are "
    )
    assert raised(lambda: ours.first_value("a", "__triton_context__")) == (
        "PyTritonBadParameterError",
        expected + "triton_context, __triton_context__",
    )
    if theirs is not None:
        assert raised(lambda: theirs.first_value("a", "__triton_context__")) == (
            "PyTritonBadParameterError",
            expected + "__triton_context__",
        )

    def case(module: Any, batching: bool, rows: list[dict[str, Any]]) -> tuple[str, str]:
        return with_config(
            module, lambda f: module.batch(module.first_value("b")(f)), lambda a, b: {"y": a}, config_of(batching), rows
        )

    compare(
        lambda m: case(m, False, [ONE]),
        ("PyTritonRuntimeError", "The @first_value decorator can only be used with models that support batching."),
        theirs,
    )
    rows = [ONE, {"a": np.ones((1, 1), F32), "b": np.full((1, 1), 2.0, F32)}]
    compare(
        lambda m: case(m, True, rows),
        (
            "PyTritonRuntimeError",
            "The values on the 'b' input are not equal. To proceed, either disable strict mode in @first_value "
            "wrapper or ensure that the values always are consistent. The current values of 'b' are "
            "array([[1.],\n       [2.]], dtype=float32).",
        ),
        theirs,
    )


def group_order(module: Any, values: np.ndarray) -> list[list[Any]]:
    """The groups (their key values, in call order) @group_by_values hands the function."""
    seen: list[list[Any]] = []

    def inner(key, x):
        seen.append(key.tolist())
        return {"y": x}

    decorated = module.batch(module.group_by_values("key")(inner))
    rows = [{"key": values[i : i + 1], "x": np.full((1, 1), i, F32)} for i in range(len(values))]
    answers = decorated(requests_for(module, *rows))
    assert [float(a["y"][0, 0]) for a in answers] == [float(i) for i in range(len(values))]  # rows back in order
    return seen


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # rows of floats are compared by their bytes: 2.0 (00 00 00 40) < 3.0 (00 00 40 40) < 1.0 (00 00 80 3f)
        (np.array([[3.0], [1.0], [2.0], [1.0]], F32), [[[2.0]], [[3.0]], [[1.0], [1.0]]]),
        (np.array([3, 1, 2, 1], np.int64), [[1, 1], [2], [3]]),  # scalar rows: by value
        # bytes by their serialization (the total length first): b"a" and b"c" before b"bb"
        (np.array([[b"bb"], [b"a"], [b"bb"], [b"c"]], dtype=object), [[[b"a"]], [[b"c"]], [[b"bb"], [b"bb"]]]),
    ],
)
def test_group_by_values_hands_groups_in_pytritons_order(values, expected, theirs):
    assert group_order(ours, values) == expected
    if theirs is not None:
        assert group_order(theirs, values) == expected


def test_group_by_keys_hands_groups_in_pytritons_order(theirs):
    def order(module: Any) -> list[list[str]]:
        seen: list[list[str]] = []

        def inner(requests):
            seen.append(sorted(requests[0].keys()))
            return [{"y": r["x"]} for r in requests]

        rows = [{"x": np.ones((1, 1))}, {"x": np.ones((1, 1)), "bias": np.ones((1, 1))}, {"x": np.ones((1, 1))}]
        assert len(module.group_by_keys(inner)(requests_for(module, *rows))) == 3
        return seen

    assert order(ours) == [["bias", "x"], ["x"]]  # sorted by the groups' input names, not by first seen
    if theirs is not None:
        assert order(theirs) == [["bias", "x"], ["x"]]
