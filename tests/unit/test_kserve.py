"""KServe-v2 semantics shared by the network frontends (``embedtriton.frontends.kserve``):
request parameters, shared-memory references, shapes, and tensor data from bytes or typed values.
No server: ``Decoded(model)`` only keeps its model, so a stand-in object does."""

from __future__ import annotations

import os

import numpy as np
import pytest

from embedtriton import InvalidArgumentError
from embedtriton.config import MAX_DIMS
from embedtriton.core.request import SEQUENCE_END, SEQUENCE_START, InferRequest
from embedtriton.frontends import kserve
from embedtriton.frontends.shared_memory import Region

MODEL = object()  # stands for the Model a frontend looks up


def decoded_with(params: dict, request_id: str = "") -> kserve.Decoded:
    decoded = kserve.Decoded(MODEL)
    kserve.apply_parameters(decoded, params, request_id)
    return decoded


def test_decoded_starts_empty():
    decoded = kserve.Decoded(MODEL)
    assert decoded.model is MODEL
    assert isinstance(decoded.request, InferRequest) and decoded.request.inputs == {}
    assert decoded.in_shm == set() and decoded.regions == []


# -- request parameters ----------------------------------------------------------------------------


def test_no_parameters():
    request = decoded_with({}).request
    assert (request.request_id, request.priority, request.timeout_us) == (None, None, None)
    assert request.sequence is None and request.parameters is None  # empty -> None, not {}


def test_request_id():
    assert decoded_with({}, "req-7").request.request_id == "req-7"
    assert decoded_with({}, "").request.request_id is None


def test_priority_and_timeout_become_options_not_parameters():
    request = decoded_with({"priority": 2, "timeout": 5000}).request
    assert request.priority == 2 and request.timeout_us == 5000
    assert request.parameters is None


def test_leftover_parameters_reach_the_model():
    params = {"priority": 1, "temperature": 0.5, "mode": "fast", "greedy": True}
    request = decoded_with(params).request
    assert request.parameters == {"temperature": 0.5, "mode": "fast", "greedy": True}
    assert request.priority == 1


def test_empty_final_response_flag_is_the_frontends_own():
    assert kserve.EMPTY_FINAL_RESPONSE == "triton_enable_empty_final_response"
    assert decoded_with({"triton_enable_empty_final_response": True}).request.parameters is None
    request = decoded_with({"triton_enable_empty_final_response": True, "k": 1}).request
    assert request.parameters == {"k": 1}


@pytest.mark.parametrize(
    "start, end, flags",
    [(False, False, 0), (True, False, SEQUENCE_START), (False, True, SEQUENCE_END), (True, True, 3)],
)
@pytest.mark.parametrize("sequence_id", [42, "session-a"])
def test_sequence_parameters(sequence_id, start, end, flags):
    params = {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end, "other": 1}
    request = decoded_with(params).request
    assert request.sequence == (sequence_id, flags)
    assert request.parameters == {"other": 1}  # the sequence parameters are consumed


@pytest.mark.parametrize("sequence_id", [0, "", None])
def test_no_sequence_without_a_sequence_id(sequence_id):
    """0 and "" are KServe's "no correlation id"; the flags alone make no sequence."""
    request = decoded_with({"sequence_id": sequence_id, "sequence_start": True, "sequence_end": True}).request
    assert request.sequence is None and request.parameters is None


# -- shared-memory references ----------------------------------------------------------------------


def test_shm_reference():
    assert kserve.shm_reference("x", {}) is None
    assert kserve.shm_reference("x", {"binary_data_size": 4}) is None
    assert kserve.shm_reference("x", {"shared_memory_region": "r", "shared_memory_byte_size": 64}) == ("r", 0, 64)
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 64, "shared_memory_offset": 16}
    assert kserve.shm_reference("x", params) == ("r", 16, 64)


@pytest.mark.parametrize(
    "params",
    [
        {"shared_memory_region": "r"},  # no byte size
        {"shared_memory_region": 3, "shared_memory_byte_size": 64},
        {"shared_memory_region": "r", "shared_memory_byte_size": "64"},
        {"shared_memory_region": "r", "shared_memory_byte_size": 64.0},
        {"shared_memory_region": "r", "shared_memory_byte_size": 64, "shared_memory_offset": "0"},
        {"shared_memory_region": None, "shared_memory_byte_size": 64},
    ],
)
def test_shm_reference_refusals(params):
    with pytest.raises(InvalidArgumentError) as info:
        kserve.shm_reference("in0", params)
    assert str(info.value) == (
        "tensor 'in0': shared memory needs string shared_memory_region and integer "
        "shared_memory_byte_size (and optional shared_memory_offset) parameters"
    )


class FakeMapping(bytearray):
    truncated = False


@pytest.fixture
def region(tmp_path):
    """A 64-byte region at offset 16 of a 128-byte file, mapped by a stand-in for _native's mapping."""
    path = tmp_path / "shm"
    path.write_bytes(bytes(range(128)))
    fd = os.open(path, os.O_RDONLY)
    mapping = FakeMapping(path.read_bytes()[: 16 + 64])
    yield Region("r", "/shm", 16, 64, mapping, fd)
    os.close(fd)


def test_region_view_is_inside_the_region(region):
    assert bytes(region.view(0, 4, "input 'x'")) == bytes([16, 17, 18, 19])
    assert bytes(region.view(60, 4, "input 'x'")) == bytes([76, 77, 78, 79])
    assert len(region.view(0, 64, "input 'x'")) == 64


@pytest.mark.parametrize("offset, size", [(0, 65), (61, 4), (-1, 4), (0, -1), (64, 1)])
def test_region_view_bounds(region, offset, size):
    with pytest.raises(InvalidArgumentError) as info:
        region.view(offset, size, "input 'x'")
    assert str(info.value) == (
        f"input 'x': {size} bytes at offset {offset} do not fit shared-memory region 'r' of 64 bytes"
    )


def test_region_shrunk_by_its_owner(region, tmp_path):
    os.truncate(tmp_path / "shm", 40)
    with pytest.raises(InvalidArgumentError, match=r"its owner shrank '/shm' to 40 bytes, .*offset 16 \+ byte_size 64"):
        region.view(0, 4, "input 'x'")
    region.mapping.truncated = True
    with pytest.raises(InvalidArgumentError, match="was shrunk by its owner while a request used it"):
        region.check()


class FakeShm:
    def __init__(self, region):
        self.region = region

    def get(self, name):
        if name != "r":
            raise InvalidArgumentError(f"Unable to find shared memory region: '{name}'")
        return self.region


def test_requested_outputs_by_name_and_into_shared_memory(region):
    decoded = kserve.Decoded(MODEL)
    kserve.requested_outputs(decoded, FakeShm(region), [])
    assert decoded.request.outputs is None  # none named: all of them

    kserve.requested_outputs(decoded, FakeShm(region), [("y", {}), ("z", {})])
    assert decoded.request.outputs == ("y", "z") and decoded.in_shm == set()

    shm_params = {"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": 4}
    kserve.requested_outputs(decoded, FakeShm(region), [("y", {}), ("z", shm_params)])
    outputs = decoded.request.outputs
    assert list(outputs) == ["y", "z"] and outputs["y"] is None
    assert bytes(outputs["z"]) == bytes(range(20, 28))  # offset 4 in the region = 20 in the file
    assert decoded.in_shm == {"z"} and decoded.regions == [region]


# -- shapes and data -------------------------------------------------------------------------------


def test_check_shape_bounds():
    assert MAX_DIMS == 32
    kserve.check_shape("x", (1,) * 32)
    kserve.check_shape("x", (0, 5))
    kserve.check_shape("x", ())
    with pytest.raises(InvalidArgumentError) as info:
        kserve.check_shape("x", (1,) * 33)
    assert str(info.value) == "input 'x' has 33 dimensions; at most 32 are supported"
    for shape in [(1, -1), (-1,), (-2, -3)]:
        with pytest.raises(InvalidArgumentError) as info:
            kserve.check_shape("x", shape)
        assert str(info.value) == f"input 'x': shape {list(shape)} has a negative dimension"


@pytest.mark.parametrize(
    "datatype, dtype",
    [("FP32", np.float32), ("FP16", np.float16), ("INT64", np.int64), ("UINT8", np.uint8), ("BOOL", np.bool_)],
)
def test_array_from_bytes_is_a_view_of_the_bytes(datatype, dtype):
    expected = np.arange(6).astype(dtype).reshape(2, 3)
    buffer = bytearray(expected.tobytes())
    array = kserve.array_from_bytes("x", datatype, (2, 3), buffer)
    assert array.dtype == dtype and array.shape == (2, 3)
    np.testing.assert_array_equal(array, expected)
    assert np.shares_memory(array, np.frombuffer(buffer, np.uint8))  # no copy
    buffer[: array.itemsize] = np.array([1], dtype).tobytes()
    assert array[0, 0] == 1  # the same memory


def test_array_from_bytes_of_immutable_bytes_is_read_only():
    array = kserve.array_from_bytes("x", "INT32", (2,), np.array([5, 6], np.int32).tobytes())
    assert array.tolist() == [5, 6] and not array.flags.writeable


@pytest.mark.parametrize(
    "datatype, shape, size",
    [("FP32", (2, 3), 20), ("FP32", (2, 3), 28), ("INT8", (4,), 0), ("FP64", (0,), 8), ("UINT16", (), 1)],
)
def test_array_from_bytes_size_mismatch(datatype, shape, size):
    with pytest.raises(InvalidArgumentError) as info:
        kserve.array_from_bytes("in0", datatype, shape, b"\0" * size)
    assert str(info.value) == f"input 'in0': {size} bytes do not fill shape {list(shape)} of {datatype}"


def test_array_from_bytes_bytes_tensor():
    data = b"\x02\x00\x00\x00hi\x00\x00\x00\x00"
    assert kserve.array_from_bytes("t", "BYTES", (1, 2), data).tolist() == [[b"hi", b""]]
    with pytest.raises(InvalidArgumentError, match=r"^input 't': BYTES tensor of shape \[3\] holds 3 elements"):
        kserve.array_from_bytes("t", "BYTES", (3,), data)


@pytest.mark.parametrize("datatype", ["BF16", "FP8", "fp32", ""])
def test_array_from_bytes_unsupported_datatypes(datatype):
    with pytest.raises(InvalidArgumentError) as info:
        kserve.array_from_bytes("x", datatype, (1,), b"\0\0")
    assert str(info.value) == f"input 'x': datatype {datatype} is not supported"


def test_array_from_values():
    array = kserve.array_from_values("x", "INT16", (2, 2), [1, -2, 3, -4])
    assert array.dtype == np.int16 and array.tolist() == [[1, -2], [3, -4]]
    array = kserve.array_from_values("x", "FP64", (3,), [0.5, 1.5, 2.5])
    assert array.dtype == np.float64 and array.tolist() == [0.5, 1.5, 2.5]
    array = kserve.array_from_values("x", "BOOL", (1, 2), [True, False])
    assert array.dtype == np.bool_ and array.tolist() == [[True, False]]
    array = kserve.array_from_values("s", "BYTES", (2, 1), [b"a", b"bc"])
    assert array.dtype == object and array.tolist() == [[b"a"], [b"bc"]]
    assert kserve.array_from_values("x", "FP32", (0, 4), []).shape == (0, 4)


def test_array_from_values_count_mismatch():
    with pytest.raises(InvalidArgumentError) as info:
        kserve.array_from_values("x", "FP32", (2, 2), [1.0, 2.0, 3.0])
    assert str(info.value) == "input 'x': 3 values do not fill shape [2, 2]"
    with pytest.raises(InvalidArgumentError, match="1 values do not fill shape"):
        kserve.array_from_values("s", "BYTES", (2,), [b"a"])


@pytest.mark.parametrize(
    "datatype, values, bad",
    [("INT8", [1, 300], 300), ("INT16", [-40000], -40000), ("UINT8", [256], 256), ("UINT16", [7, 70000], 70000)],
)
def test_array_from_values_out_of_range_integers_are_refused(datatype, values, bad):
    """int_contents (int32) also carries INT8/INT16, uint_contents UINT8/16: values that do not fit
    are refused on every numpy (numpy 1.x would wrap 300 to 44 as INT8)."""
    with pytest.raises(InvalidArgumentError) as info:
        kserve.array_from_values("x", datatype, (len(values),), values)
    assert str(info.value) == f"input 'x': {bad} is out of range for {datatype}"
    assert kserve.array_from_values("x", datatype, (1,), [values[0] if values[0] != bad else 0]).dtype.kind in "iu"


@pytest.mark.parametrize(
    "datatype, field",
    [
        ("BOOL", "bool_contents"),
        ("INT8", "int_contents"),
        ("INT32", "int_contents"),
        ("INT64", "int64_contents"),
        ("UINT16", "uint_contents"),
        ("UINT64", "uint64_contents"),
        ("FP32", "fp32_contents"),
        ("FP64", "fp64_contents"),
        ("BYTES", "bytes_contents"),
    ],
)
def test_contents_field(datatype, field):
    assert kserve.contents_field("x", datatype) == field


@pytest.mark.parametrize("datatype", ["FP16", "BF16", "FP8"])
def test_no_contents_field(datatype):
    with pytest.raises(InvalidArgumentError) as info:
        kserve.contents_field("x", datatype)
    assert str(info.value) == f"input 'x': datatype {datatype} has no typed contents"


def test_output_bytes():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert kserve.output_bytes(array.T, "FP32") == np.ascontiguousarray(array.T).tobytes()  # C order on the wire
    strings = np.array([b"a", b"bc"], dtype=object)
    assert kserve.output_bytes(strings, "BYTES") == b"\x01\x00\x00\x00a\x02\x00\x00\x00bc"


@pytest.mark.parametrize("given, expected", [("", -1), ("1", 1), ("0", 0), (" 7", 7), ("+3", 3), ("12abc", 12)])
def test_model_version_is_read_as_triton_reads_it(given, expected):
    assert kserve.model_version(given) == expected  # like C's stol, a leading integer


@pytest.mark.parametrize(
    "given, message",
    [
        ("x", "failed to get model version from specified version string 'x' (details: stol), "),
        ("99999999999999999999", "failed to get model version from specified version string"),
        ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
    ],
)
def test_malformed_model_versions_are_refused(given, message):
    with pytest.raises(InvalidArgumentError) as info:
        kserve.model_version(given)
    assert str(info.value).startswith(message)


# -- classification --------------------------------------------------------------------------------


def test_classify_unbatched_floats_with_labels():
    scores = np.array([0.25, 0.5, 0.125], dtype=np.float64)
    top = kserve.classify(scores, "FP64", 2, False, ["a", "b", "c"])
    assert top.shape == (2,) and top.tolist() == [b"0.500000:1:b", b"0.250000:0:a"]


def test_classify_batched_ints_without_labels_caps_k():
    scores = np.array([[3, -1], [0, 7]], dtype=np.int32)
    top = kserve.classify(scores, "INT32", 5, True, None)
    assert top.shape == (2, 2) and top.tolist() == [[b"3:0", b"-1:1"], [b"7:1", b"0:0"]]


def test_classify_unsigned_and_labels_shorter_than_the_classes():
    top = kserve.classify(np.array([1, 200, 200], dtype=np.uint8), "UINT8", 3, False, ["x"])
    assert top.tolist() == [b"200:1", b"200:2", b"1:0:x"]  # ties: lower index first; no label past the list


@pytest.mark.parametrize("datatype", ["BOOL", "FP16", "BF16", "BYTES"])
def test_classify_refuses_types_triton_does_not_rank(datatype):
    with pytest.raises(InvalidArgumentError, match=f"unsupported type '{datatype}'"):
        kserve.classify(np.zeros(2, dtype=np.float16), datatype, 1, False, None)


@pytest.mark.parametrize(
    "params, message",
    [({"classification": 0}, "expected >= 0"), ({"classification": True}, "expected int64_param")],
)
def test_classification_parameter_is_checked(params, message):
    with pytest.raises(InvalidArgumentError, match=message):
        kserve.requested_outputs(kserve.Decoded(MODEL), None, [("y", params)])


def test_requested_outputs_named_twice_are_returned_once():
    decoded = kserve.Decoded(MODEL)
    kserve.requested_outputs(decoded, None, [("y", {}), ("z", {"classification": 2}), ("y", {})])
    assert decoded.request.outputs == ("y", "z") and decoded.classify == {"z": 2}
    with pytest.raises(InvalidArgumentError, match="requested twice with different parameters"):
        kserve.requested_outputs(kserve.Decoded(MODEL), None, [("y", {}), ("y", {"classification": 1})])
