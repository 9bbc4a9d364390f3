"""The dtype table (``embedtriton.tensors.dtypes``) and Triton's BYTES wire format (``.bytes``)."""

from __future__ import annotations

import re
import tracemalloc
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedtriton import InvalidArgumentError, Tensor
from embedtriton.tensors import BY_NAME, DTYPES, as_numpy_dtype, decode_bytes, encode_bytes, triton_dtype

# TRITONSERVER_DataType in tritonserver.h (and DataType in model_config.proto, where BYTES is TYPE_STRING)
TRITONSERVER_DATATYPE = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}
NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
NUMERIC = [d for d in DTYPES if d.numpy is not None]


def test_the_table_has_every_triton_datatype_once_with_its_enum_value():
    assert {d.name: d.value for d in DTYPES} == TRITONSERVER_DATATYPE
    assert [d.value for d in DTYPES] == list(range(1, 15))  # in enum order, no gaps, no repeats
    assert BY_NAME == {d.name: d for d in DTYPES}


def test_enum_values_match_the_native_header():
    """The C side (native/include/triton_api.h) declares TRITONSERVER_DataType in the same order."""
    header = resources.files("embedtriton").joinpath("native/include/triton_api.h").read_text()
    body = re.search(r"TRITONSERVER_TYPE_INVALID,(.*?)}", header, re.S).group(1)
    names = re.findall(r"TRITONSERVER_TYPE_(\w+)", body)
    assert {name: i for i, name in enumerate(names, start=1)} == TRITONSERVER_DATATYPE


def test_numpy_dtypes_of_the_rows():
    assert {d.name: d.numpy for d in NUMERIC} == {name: np.dtype(t) for name, t in NUMPY.items()}
    assert BY_NAME["BYTES"].numpy is None and BY_NAME["BF16"].numpy is None  # object arrays; numpy has no bf16


@pytest.mark.parametrize("row", NUMERIC, ids=lambda d: d.name)
def test_numpy_round_trip(row):
    assert triton_dtype(row.numpy) == row.name
    assert triton_dtype(row.numpy.type) == row.name  # the scalar type works as well as the dtype
    assert BY_NAME[triton_dtype(row.numpy)].numpy == row.numpy
    assert as_numpy_dtype(row.numpy.type) == row.numpy


@pytest.mark.parametrize(
    "dtype, name",
    [
        (np.dtype(">f4"), "FP32"),  # big-endian: same kind and size
        (np.dtype(">i8"), "INT64"),
        (np.dtype("<u2"), "UINT16"),
        (np.intc, "INT32"),
        (np.longlong, "INT64"),
        (np.double, "FP64"),
        (np.half, "FP16"),
        ("float32", "FP32"),
        (bool, "BOOL"),
        (np.dtype("S7"), "BYTES"),
        (np.dtype("U3"), "BYTES"),
        (object, "BYTES"),
    ],
)
def test_aliases_and_byte_orders(dtype, name):
    assert triton_dtype(dtype) == name


@pytest.mark.parametrize("dtype", [bytes, np.bytes_, object, str])
def test_bytes_declarations_mean_object_arrays(dtype):
    assert as_numpy_dtype(dtype) == np.dtype(object)
    assert triton_dtype(as_numpy_dtype(dtype)) == "BYTES"


def test_config_type_names():
    assert {d.name: d.config_type for d in DTYPES} == {
        name: "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}" for name in TRITONSERVER_DATATYPE
    }


def test_config_types_are_model_config_proto_enum_values():
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    assert {d.config_type: d.value for d in DTYPES} == {
        name: value for name, value in model_config_pb2.DataType.items() if name != "TYPE_INVALID"
    }


def test_contents_fields():
    assert {d.name: d.contents for d in DTYPES} == {
        "BOOL": "bool_contents",
        "UINT8": "uint_contents",
        "UINT16": "uint_contents",
        "UINT32": "uint_contents",
        "UINT64": "uint64_contents",
        "INT8": "int_contents",
        "INT16": "int_contents",
        "INT32": "int_contents",
        "INT64": "int64_contents",
        "FP16": None,  # KServe has no typed contents for FP16 or BF16: raw bytes only
        "FP32": "fp32_contents",
        "FP64": "fp64_contents",
        "BYTES": "bytes_contents",
        "BF16": None,
    }


def test_contents_fields_are_tritonclients_and_wide_enough():
    """Each field exists in KServe's InferTensorContents, every field is used, and its protobuf
    type holds every value of the dtypes it carries."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    fields = service_pb2.InferTensorContents.DESCRIPTOR.fields_by_name
    assert {d.contents for d in DTYPES if d.contents} == set(fields)
    descriptor = type(fields["bool_contents"])
    carries = {
        descriptor.TYPE_BOOL: {np.dtype(np.bool_)},
        descriptor.TYPE_INT32: {np.dtype(t) for t in (np.int8, np.int16, np.int32)},
        descriptor.TYPE_INT64: {np.dtype(np.int64)},
        descriptor.TYPE_UINT32: {np.dtype(t) for t in (np.uint8, np.uint16, np.uint32)},
        descriptor.TYPE_UINT64: {np.dtype(np.uint64)},
        descriptor.TYPE_FLOAT: {np.dtype(np.float32)},
        descriptor.TYPE_DOUBLE: {np.dtype(np.float64)},
        descriptor.TYPE_BYTES: {None},
    }
    for d in DTYPES:
        if d.contents:
            assert d.numpy in carries[fields[d.contents].type], d.name


@pytest.mark.parametrize(
    "dtype", [np.complex64, np.complex128, "datetime64[ns]", "timedelta64[s]", "V8", [("a", "i4"), ("b", "f4")]]
)
def test_dtypes_triton_lacks_are_refused(dtype):
    with pytest.raises(InvalidArgumentError, match=r"input 'z': dtype .* has no Triton equivalent; use bool"):
        triton_dtype(dtype, "input 'z'")
    with pytest.raises(InvalidArgumentError, match="tensor z: dtype"):
        Tensor(name="z", dtype=dtype, shape=(1,))


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="long double is double here")
def test_extended_precision_floats_are_refused():
    with pytest.raises(InvalidArgumentError, match="no Triton equivalent"):
        triton_dtype(np.longdouble)


# -- BYTES: 4-byte little-endian length, then the bytes, per element in C order ---------------


def test_encode_layout():
    array = np.array([[b"ab", b""], [b"xyz", b"\x00"]], dtype=object)
    assert encode_bytes(array) == (
        b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00xyz" + b"\x01\x00\x00\x00\x00"
    )
    assert encode_bytes(array.T) == encode_bytes(np.array([b"ab", b"xyz", b"", b"\x00"], dtype=object))  # C order


def test_encode_element_kinds():
    assert encode_bytes(np.array(["é"])) == b"\x02\x00\x00\x00\xc3\xa9"  # str: UTF-8
    assert encode_bytes(np.array([b"hi"], dtype=np.bytes_)) == b"\x02\x00\x00\x00hi"
    buffers = np.empty(2, dtype=object)
    buffers[:] = [bytearray(b"b"), memoryview(b"m")]
    assert encode_bytes(buffers) == b"\x01\0\0\0b\x01\0\0\0m"
    assert encode_bytes(np.array([7, 1.5], dtype=object)) == b"\x01\0\0\x007\x03\0\0\x001.5"  # numbers as text
    with pytest.raises(InvalidArgumentError, match="hold bytes or str; found an element of type NoneType"):
        encode_bytes(np.array([b"ok", None], dtype=object))


def test_decode_returns_an_object_array_of_bytes_with_the_shape():
    out = decode_bytes(encode_bytes(np.array([[b"a", b"bc", b""]], dtype=object)), (1, 3))
    assert out.dtype == object and out.shape == (1, 3)
    assert out.tolist() == [[b"a", b"bc", b""]]
    assert all(type(v) is bytes for v in out.flat)


def test_decode_accepts_any_buffer():
    data = encode_bytes(np.array([b"xy", b"z"], dtype=object))
    for buffer in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert decode_bytes(buffer, (2,)).tolist() == [b"xy", b"z"]


def test_decode_empty_and_scalar():
    assert decode_bytes(b"", (0, 3)).shape == (0, 3)
    assert decode_bytes(b"\x01\x00\x00\x00s", ()).shape == ()
    assert decode_bytes(b"\x01\x00\x00\x00s", ())[()] == b"s"


@pytest.mark.parametrize(
    "data, shape, message",
    [
        (b"\x01\x00\x00\x00a", (2,), r"holds 2 elements, each with a 4-byte length, but only 5 bytes were sent"),
        (b"\x05\x00\x00\x00abc", (1,), r"element 0 declares 5 bytes, but only 3 remain"),
        (b"\x01\x00\x00\x00a\x01\x00\x00\x00bEXTRA", (2,), r"5 bytes are left after its 2 elements"),
        (b"\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00", (2,), r"2 bytes are left after its 2 elements"),
        (b"\x00\x00\x00\x00\x03\x00\x00\x00ab", (2,), r"element 1 declares 3 bytes, but only 2 remain"),
        (b"", (-1,), r"negative dimension"),
        (b"\xff\xff\xff\xff", (1,), r"element 0 declares 4294967295 bytes, but only 0 remain"),
    ],
)
def test_decode_refusals(data, shape, message):
    with pytest.raises(InvalidArgumentError, match=message):
        decode_bytes(data, shape)


def test_decode_refuses_a_declared_shape_larger_than_the_bytes_before_allocating():
    """32 bytes sent for 2**24 elements: refused without allocating the 128 MiB object array."""
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgumentError, match=r"holds 16777216 elements, .* only 32 bytes were sent"):
            decode_bytes(b"\x00" * 32, (1 << 12, 1 << 12))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_decode_refuses_two_negative_dimensions():
    data = encode_bytes(np.array([b"a"] * 6, dtype=object))
    with pytest.raises(InvalidArgumentError, match="negative dimension"):
        decode_bytes(data, (-2, -3))


SHAPES = st.lists(st.integers(0, 4), max_size=3).map(tuple)


@settings(max_examples=200, deadline=None)
@given(shape=SHAPES, data=st.data())
def test_bytes_round_trip(shape, data):
    count = int(np.prod(shape))
    items = data.draw(st.lists(st.binary(max_size=40), min_size=count, max_size=count))
    array = np.empty(count, dtype=object)
    array[:] = items
    array = array.reshape(shape)
    encoded = encode_bytes(array)
    assert len(encoded) == 4 * count + sum(map(len, items))
    decoded = decode_bytes(encoded, shape)
    assert decoded.shape == shape and decoded.tolist() == array.tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=20), min_size=1, max_size=20))
def test_str_round_trips_as_utf8(texts):
    decoded = decode_bytes(encode_bytes(np.array(texts, dtype=object)), (len(texts),))
    assert [b.decode("utf-8") for b in decoded] == texts


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.lists(st.integers(0, 5), max_size=3).map(tuple))
def test_decode_never_fails_other_than_with_invalid_argument(data, shape):
    """Arbitrary bytes either decode to the shape or are refused with InvalidArgumentError."""
    try:
        out = decode_bytes(data, shape)
    except InvalidArgumentError:
        return
    assert out.shape == shape
    assert encode_bytes(out) == data  # what decodes re-encodes to the same bytes


@pytest.mark.parametrize(
    "given, expected",
    [("FP32", np.float32), ("TYPE_FP32", np.float32), ("INT8", np.int8), ("BOOL", np.bool_), ("BYTES", object),
     ("TYPE_STRING", object), ("float32", np.float32), (np.float16, np.float16), (bytes, object)],
)  # fmt: skip
def test_triton_dtype_names_are_accepted(given, expected):
    assert as_numpy_dtype(given) == np.dtype(expected)


def test_tensor_takes_triton_dtype_names():
    assert Tensor(name="x", dtype="FP32", shape=(1,)).dtype == np.dtype(np.float32)
    with pytest.raises(InvalidArgumentError, match="numpy has no BF16"):
        Tensor(name="x", dtype="BF16", shape=(1,))
