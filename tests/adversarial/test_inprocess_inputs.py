"""Property-based inputs to the in-process API: whatever a caller passes, the answer is the
right result or a TritonError subclass, and the next good request works."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedtriton import InvalidArgumentError, ModelConfig, Server, Tensor, TritonError, batch

F32 = np.float32
DTYPES = [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16, np.float32, np.float64, object, np.complex64]


@pytest.fixture(scope="module")
def models():
    server = Server()
    server.bind(
        "AddSub",
        batch(lambda a, b: {"add": a + b, "sub": a - b}),
        [Tensor(name="a", dtype=F32, shape=(-1,)), Tensor(name="b", dtype=F32, shape=(-1,))],
        [Tensor(name="add", dtype=F32, shape=(-1,)), Tensor(name="sub", dtype=F32, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )
    server.bind(
        "Swapped",
        lambda requests: [{"y": r["x"].astype(">i8")} for r in requests],  # big-endian out
        [Tensor(name="x", dtype=np.int64, shape=(-1,))],
        [Tensor(name="y", dtype=np.int64, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )
    with server:
        yield server


def good_request_works(server: Server) -> None:
    one = np.ones((1, 2), F32)
    out = server.model("AddSub").infer({"a": one, "b": one})
    np.testing.assert_array_equal(out["add"], 2 * one)


arrays = st.builds(
    lambda dtype, shape: np.zeros(shape, dtype=dtype),
    st.sampled_from(DTYPES),
    st.lists(st.integers(0, 3), min_size=0, max_size=4).map(tuple),
)
values = st.one_of(
    arrays,
    st.lists(st.lists(st.floats(allow_nan=False, width=32), max_size=3), max_size=3),  # ragged lists
    st.lists(st.one_of(st.integers(), st.text(max_size=3), st.none()), max_size=4),  # mixed objects
    st.none(),
    st.integers(),
    st.text(max_size=5),
    st.binary(max_size=8),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
names = st.sampled_from(["a", "b", "c", "", "add"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    inputs=st.dictionaries(names, values, max_size=3),
    outputs=st.one_of(st.none(), st.lists(st.one_of(names, st.integers(), st.none()), max_size=3)),
    parameters=st.one_of(
        st.none(),
        st.dictionaries(st.text(max_size=3), st.one_of(st.integers(), st.text(), st.lists(st.integers())), max_size=2),
    ),
)
def test_any_input_gives_a_result_or_a_triton_error(models, inputs, outputs, parameters):
    try:
        out = models.model("AddSub").infer(inputs, outputs=outputs, parameters=parameters)
    except TritonError:
        pass
    else:
        assert set(out) <= {"add", "sub"}
    good_request_works(models)


def _deep(ndim: int) -> np.ndarray:
    if ndim > 32 and int(np.__version__.split(".")[0]) < 2:
        pytest.skip("numpy 1 arrays have at most 32 dimensions: the case cannot arise there")
    return np.ones((1,) * ndim, F32)


@pytest.mark.parametrize(
    "make,outputs,match",
    [
        (lambda: {"a": [[1.0, 2.0], [3.0]], "b": np.ones((2, 1), F32)}, None, "cannot turn input 'a'"),  # ragged
        (lambda: {"a": np.ones((1, 1), F32), "b": np.ones((1, 1), F32)}, [1], r"outputs\[0\] must be an output name"),
        (lambda: {"a": _deep(33), "b": _deep(33)}, None, "33 dimensions; at most 32"),
        (lambda: {"a": np.ones((1, 1), np.complex64), "b": np.ones((1, 1), F32)}, None, "complex64"),
        (lambda: [("a", 1)], None, "mapping"),
    ],
    ids=["ragged", "output-not-a-name", "33-dims", "complex", "not-a-mapping"],
)
def test_bad_inputs_name_what_to_fix(models, make, outputs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        models.model("AddSub").infer(make(), outputs=outputs)
    good_request_works(models)


def test_outputs_in_a_foreign_byte_order_are_converted(models):
    x = np.array([[3, -2, 1 << 40]], np.int64)
    y = models.model("Swapped").infer({"x": x})["y"]
    np.testing.assert_array_equal(y, x)  # not 216172782113783808 for 3
    assert y.dtype == np.int64 and y.dtype.isnative


def test_too_many_dimensions_in_a_declaration():
    with pytest.raises(InvalidArgumentError, match="at most 31"):
        Tensor(name="y", dtype=F32, shape=(1,) * 32)
