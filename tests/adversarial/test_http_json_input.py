"""An HTTP input's JSON ``data`` converts a flat list of numbers for a float datatype in one numpy
call (``rest.json_input``); the general path (``_flatten`` then ``kserve.array_from_values``)
defines what every body must give. Hypothesis throws any JSON value at both: the same array
(dtype, shape, bits) or the same error, whatever a client sends."""

from __future__ import annotations

import math
import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from embedtriton import InvalidArgumentError
from embedtriton.frontends import kserve
from embedtriton.frontends.http.rest import _flatten, json_input

SCALARS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=6),
    st.sampled_from(["1.5", "-0", "nan", "inf", "1e400", "\u0661", " 2 "]),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)
DATA = st.recursive(
    st.lists(SCALARS, max_size=8), lambda inner: st.lists(st.one_of(SCALARS, inner), max_size=4), max_leaves=20
)
DATATYPES = st.sampled_from(["FP16", "FP32", "FP64", "INT32", "INT8", "UINT64", "BOOL", "BYTES"])
SHAPES = st.lists(st.integers(0, 4), max_size=3).map(tuple)


def general(name: str, datatype: str, shape: tuple[int, ...], data) -> np.ndarray:
    return kserve.array_from_values(name, datatype, shape, _flatten(data, math.prod(shape), name))


def outcome(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (overflow to inf warns on both paths)
        try:
            array = fn(*args)
        except Exception as exc:
            return ("error", type(exc), str(exc))
    if array.dtype == object:
        return ("array", array.dtype, array.shape, array.tolist())
    return ("array", array.dtype, array.shape, array.tobytes())


@settings(max_examples=600, deadline=None)
@given(datatype=DATATYPES, shape=SHAPES, data=DATA)
def test_any_json_data_gives_what_the_general_path_gives(datatype, shape, data):
    assert outcome(json_input, "x", datatype, shape, data) == outcome(general, "x", datatype, shape, data)


@settings(max_examples=300, deadline=None)
@given(
    datatype=st.sampled_from(["FP16", "FP32", "FP64"]),
    rows=st.integers(0, 3),
    values=st.lists(st.floats(allow_nan=False, width=32), min_size=0, max_size=12),
)
def test_flat_float_lists_take_the_fast_path_and_match(datatype, rows, values):
    """What clients send: a flat list that fills the shape."""
    shape = (rows, len(values))
    data = values * rows
    assert outcome(json_input, "x", datatype, shape, data) == outcome(general, "x", datatype, shape, data)


def test_a_short_or_nested_list_still_gets_the_general_paths_words():
    for data, expected in (
        ([1.0, 2.0], "2 values do not fill shape [3]"),
        ([1.0, [2.0, 3.0, 4.0]], "more values than its shape holds (3)"),
        ("1.0", "'data' must be a JSON list"),
    ):
        try:
            json_input("x", "FP32", (3,), data)
        except InvalidArgumentError as exc:
            assert expected in str(exc)
        else:
            raise AssertionError(f"{data!r} was accepted")
    nested = json_input("x", "FP32", (2, 2), [[1, 2], [3, 4]])
    assert nested.tolist() == [[1.0, 2.0], [3.0, 4.0]] and nested.dtype == np.float32
