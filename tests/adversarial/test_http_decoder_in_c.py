"""The C decoder of HTTP/REST inference bodies (native/_native/kserve_json.c, through
_native.kserve_json_decode) against the Python path's reading (json.loads and the REST decoder's
own conversions): whatever the C decoder takes, the Python path reads to the same values; what it
cannot read exactly it declines (the Python path then answers). tritonclient's own bodies (JSON
tensors and the binary tensor data extension) are taken; mutated and truncated bodies never
crash it, and decoding many of them leaves the memory flat. Its float text is Python's repr."""

from __future__ import annotations

import json
import math
import random
import resource
import struct

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from embedtriton import _native  # noqa: E402
from embedtriton.errors import TritonError  # noqa: E402
from embedtriton.frontends import c_path, kserve  # noqa: E402
from embedtriton.frontends.http.rest import json_input  # noqa: E402

NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "UINT16": np.uint16, "INT16": np.int16,
         "UINT32": np.uint32, "INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64, "INT64": np.int64,
         "FP64": np.float64}  # fmt: skip
# (names a client writes without escapes: the C path declines '"' and '\\', which JSON escapes)
NAMES = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), min_size=1, max_size=12
)


def python_view(body: bytes, header_len: int):
    """What the Python path reads of a body, in kserve_json_decode's terms; None when it refuses
    the body or reads it as something the C decoder does not take (shared memory, classification,
    other parameters)."""
    binary = b""
    if header_len >= 0:
        body, binary = body[:header_len], body[header_len:]
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        return None
    params = request.get("parameters", {})
    if not isinstance(params, dict) or set(params) - c_path.REQUEST_PARAMETERS["http"]:
        return None
    default = bool(params.get("binary_data_output", False))
    inputs, offset, names = [], 0, set()
    try:
        for t in request["inputs"]:
            name, datatype, shape = t["name"], t["datatype"], t["shape"]
            if name in names:
                return None
            names.add(name)
            kserve.check_shape(name, tuple(shape))
            if set(t.get("parameters") or {}) - c_path.INPUT_PARAMETERS["http"]:
                return None
            size = (t.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                if size < 0 or offset + size > len(binary):
                    return None
                array = kserve.array_from_bytes(name, datatype, tuple(shape), binary[offset : offset + size])
                offset += size
            else:
                array = json_input(name, datatype, tuple(shape), t.get("data"))
            inputs.append((name, datatype, tuple(shape), np.ascontiguousarray(array).tobytes()))
    except (TritonError, KeyError, TypeError, ValueError, OverflowError):
        return None
    if offset != len(binary):
        return None
    if any(set(o.get("parameters") or {}) - c_path.OUTPUT_PARAMETERS["http"] for o in request.get("outputs") or []):
        return None
    outputs = [(o["name"], bool((o.get("parameters") or {}).get("binary_data", default)))
               for o in request.get("outputs") or []]  # fmt: skip
    return {"id": request.get("id", ""), "inputs": inputs, "outputs": outputs, "binary_data_output": default}


def check(body: bytes, header_len: int = -1) -> bool:
    """kserve_json_decode agrees with the Python path; whether it took the body."""
    decoded = _native.kserve_json_decode(body, header_len)
    if decoded is not None:
        assert decoded == python_view(body, header_len), body
    return decoded is not None


def values(draw, datatype: str, count: int) -> np.ndarray:
    if datatype == "BOOL":
        return np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), np.bool_)
    if datatype.startswith("FP"):
        width = 32 if datatype == "FP32" else 64
        floats = st.floats(allow_nan=False, allow_infinity=False, width=width)
        return np.array(draw(st.lists(floats, min_size=count, max_size=count)), NUMPY[datatype])
    info = np.iinfo(NUMPY[datatype])
    ints = st.integers(int(info.min), int(info.max))
    return np.array(draw(st.lists(ints, min_size=count, max_size=count)), NUMPY[datatype])


@st.composite
def client_bodies(draw):
    """A body as tritonclient.http writes it: JSON tensors or binary ones, outputs asked for."""
    inputs = []
    for name in draw(st.lists(NAMES, min_size=1, max_size=4, unique=True)):
        datatype = draw(st.sampled_from(sorted(NUMPY)))
        shape = draw(st.lists(st.integers(1, 3), max_size=3))
        tensor = httpclient.InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(
            values(draw, datatype, math.prod(shape)).reshape(shape), binary_data=draw(st.booleans())
        )
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=draw(st.booleans()))
               for n in draw(st.lists(NAMES, max_size=3))]  # fmt: skip
    request_id = draw(st.sampled_from(["", "an-id"]))
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs or None, request_id)
    return body, -1 if json_size is None else json_size


@settings(max_examples=150, deadline=None)
@given(client_bodies())
def test_tritonclient_bodies_are_taken_with_the_python_paths_values(case):
    assert check(*case)


@st.composite
def any_bodies(draw):
    """Bodies with the shapes, datatypes, values and parameters a client may send, valid or not."""
    scalar = (st.integers(-(2**70), 2**70) | st.floats() | st.booleans() | st.none() | st.text(max_size=3)
              | st.sampled_from([1.5, -0.0, 1e39, 2**53 + 1, 255, 256, -129]))  # fmt: skip
    data = st.recursive(st.lists(scalar, max_size=5), lambda inner: st.lists(inner, max_size=3), max_leaves=12)
    inputs = []
    for _ in range(draw(st.integers(0, 3))):
        t = {"name": draw(NAMES | st.text(max_size=4)),
             "datatype": draw(st.sampled_from([*NUMPY, "FP16", "BYTES", "BF16", "X"])),
             "shape": draw(st.lists(st.integers(-2, 4) | st.sampled_from([2**62, 2**64, 1.0, True]), max_size=34))}  # fmt: skip
        if draw(st.booleans()):
            t["data"] = draw(data)
        if draw(st.booleans()):
            t["parameters"] = draw(st.sampled_from([{}, {"binary_data_size": 4}, {"binary_data_size": -1},
                                                    {"shared_memory_region": "r"}, None]))  # fmt: skip
        inputs.append(t)
    request = {"inputs": inputs}
    if draw(st.booleans()):
        request["id"] = draw(st.sampled_from(["x", 7, None, "é", 'q"']))
    if draw(st.booleans()):
        request["outputs"] = [{"name": draw(NAMES), "parameters": draw(st.sampled_from(
            [{}, {"binary_data": True}, {"classification": 2}, {"binary_data": 1}]))}]  # fmt: skip
    if draw(st.booleans()):
        request["parameters"] = draw(st.sampled_from([{"binary_data_output": True}, {"priority": 1}, []]))
    if draw(st.booleans()):
        request["extra"] = {"nested": [1, {"a": None}], "s": "\\u00e9\n"}
    body = json.dumps(request, indent=draw(st.sampled_from([None, 1]))).encode()
    blob = draw(st.sampled_from([None, b"", b"\x01\x00\x00\x00", b"\x00" * 7]))
    return (body, -1) if blob is None else (body + blob, len(body))


@settings(max_examples=300, deadline=None)
@given(any_bodies())
def test_what_it_takes_the_python_path_reads_the_same(case):
    check(*case)


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        what = rng.random()
        if what < 0.2 and b:
            del b[rng.randrange(len(b)) :]  # truncated
        elif what < 0.5 and b:
            b[rng.randrange(len(b))] = rng.choice(b'{}[],:"0123456789.eE-+ tfn\\x\x00\xff')
        elif what < 0.8:
            b[rng.randrange(len(b) + 1) : 0] = bytes(rng.choice(b'[]{},:"19.e-') for _ in range(rng.randint(1, 6)))
        elif b:
            del b[rng.randrange(len(b))]
    return bytes(b)


@settings(max_examples=60, deadline=None)
@given(client_bodies(), st.randoms(use_true_random=False))
def test_mutated_and_truncated_bodies_agree_with_the_python_path(case, rng):
    body, header_len = case
    for _ in range(25):
        mutated = mutate(body, rng)
        check(mutated, min(header_len, len(mutated)) if header_len >= 0 else -1)


def test_numbers_are_read_as_python_reads_them():
    body = b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [9], "data": [0.1, 1e-320, 123456789012345, 1.7976931348623157e308, -0.0, 5e-324, 2.2250738585072014e-308, 0.30000000000000004, 1E+2]}]}'
    assert check(body)
    got = np.frombuffer(_native.kserve_json_decode(body, -1)["inputs"][0][3], np.float64)
    assert got.tolist() == [0.1, 1e-320, 123456789012345.0, 1.7976931348623157e308, -0.0, 5e-324,
                            2.2250738585072014e-308, 0.30000000000000004, 100.0]  # fmt: skip
    assert math.copysign(1, got[4]) == -1
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [3.4028235e38, 1e-46, 16777217]}]}'
    assert check(body)  # (FLT_MAX rounds down, an underflow to 0, an integer rounded to float32)
    declined = [
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1e39]}]}',  # past float32
        b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [1e400]}]}',  # inf
        b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [NaN]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [9007199254740993]}]}',  # 16 digits
        b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [128]}]}',
        b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [-1]}]}',
        b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1.0]}]}',
        b'{"inputs": [{"name": "x", "datatype": "UINT64", "shape": [1], "data": [18446744073709551616]}]}',
        b'{"inputs": [{"name": "x", "datatype": "BOOL", "shape": [1], "data": [1]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [01]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [-]}]}',
    ]
    for body in declined:
        assert not check(body), body
    edges = b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [2], "data": [-9223372036854775808, 9223372036854775807]}, {"name": "y", "datatype": "UINT64", "shape": [1], "data": [18446744073709551615]}]}'
    assert check(edges)


def test_structure_is_bounded():
    deep = (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ' + b"[" * 41 + b"1" + b"]" * 41 + b"}]}"
    )
    assert _native.kserve_json_decode(deep, -1) is None  # nested past KJ_MAX_DEPTH
    skipped = b'{"x": ' + b"[" * 100000 + b"]" * 100000 + b', "inputs": []}'
    assert _native.kserve_json_decode(skipped, -1) is None  # (no recursion past the bound)
    dims = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [' + b",".join([b"1"] * 33) + b'], "data": [1]}]}'
    assert _native.kserve_json_decode(dims, -1) is None  # over MAX_DIMS
    huge = b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [4611686018427387904, 4], "data": []}]}'
    assert _native.kserve_json_decode(huge, -1) is None  # the count overflows: nothing allocated
    claim = b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [100000000], "data": [1]}]}'
    assert _native.kserve_json_decode(claim, -1) is None  # a shape the values do not fill
    many = json.dumps({"inputs": [{"name": f"x{i}", "datatype": "FP32", "shape": [1], "data": [1]} for i in range(65)]})
    assert _native.kserve_json_decode(many.encode(), -1) is None  # over KS_MAX_TENSORS
    header = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]}'
    assert check(header + b"\0\0\x80?", len(header))
    assert _native.kserve_json_decode(header + b"\0\0\x80", len(header)) is None  # fewer bytes than claimed
    assert _native.kserve_json_decode(header + b"\0\0\x80?", len(header) + 5) is None  # header past the body
    assert _native.kserve_json_decode(b"\xef\xbb\xbf" + header, -1) is None  # a BOM, non-ASCII: Python's


@settings(max_examples=2000, deadline=None)
@given(st.floats() | st.floats(width=32).map(float) | st.integers(-(2**60), 2**60).map(float))
def test_floats_are_written_as_pythons_repr(x):
    assert _native.kserve_json_double(x) == json.dumps(x)


def test_float_text_edges():
    for x in (0.0, -0.0, 1e15, 1e16, 9999999999999998.0, 1e-4, 1e-5, 0.1, 5e-324, 1.7976931348623157e308,
              float("inf"), float("-inf"), float("nan"), 123456789012345.6, 2.0**63, 1e22, 1e21):  # fmt: skip
        assert _native.kserve_json_double(x) == json.dumps(x)
    bits = random.Random(3)
    for _ in range(100000):
        x = struct.unpack("d", struct.pack("Q", bits.getrandbits(64)))[0]
        assert _native.kserve_json_double(x) == json.dumps(x), x


def test_memory_stays_flat_over_many_mutated_bodies():
    rng = random.Random(7)
    seeds = []
    for i in range(20):
        a = httpclient.InferInput("a", [i + 1, 3], "FP32")
        a.set_data_from_numpy(np.full((i + 1, 3), 0.5, np.float32), binary_data=bool(i % 2))
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            [a], [httpclient.InferRequestedOutput("y")], "x" * i
        )
        seeds.append((body, -1 if json_size is None else json_size))

    def run(n):
        for _ in range(n):
            body, header_len = rng.choice(seeds)
            mutated = mutate(body, rng)
            _native.kserve_json_decode(mutated, min(header_len, len(mutated)))

    run(20000)  # warm up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(100000)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 4096, grown_kib


def test_an_endpoint_answers_mutated_bodies_as_the_python_path(add_sub, add_sub_tensors):
    """Mutated inference bodies to a running endpoint: with the C path and without it, the same
    status, header fields and answer bytes; the server survives them all."""
    import http.client

    from embedtriton import ModelConfig, Server

    inputs = []
    for name, binary in (("a", False), ("b", True)):
        t = httpclient.InferInput(name, [2, 1], "FP32")
        t.set_data_from_numpy(np.array([[1.5], [-2.25]], np.float32), binary_data=binary)
        inputs.append(t)
    seed, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, [httpclient.InferRequestedOutput("add", binary_data=False)], "i"
    )
    rng = random.Random(11)
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    with server:
        port = server.serve_http("127.0.0.1:0")
        endpoint = server.endpoint("http")

        def ask(body: bytes, header_len: int):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request("POST", "/v2/models/AddSub/infer", body,
                             {"Inference-Header-Content-Length": str(header_len)})  # fmt: skip
                r = conn.getresponse()
                return r.status, sorted((k, v) for k, v in r.getheaders() if k != "Date"), r.read()
            finally:
                conn.close()

        taken = _native.http_stats()[0]
        for _ in range(150):
            body = mutate(seed, rng)
            header_len = min(json_size, len(body))
            in_c = ask(body, header_len)
            endpoint.use_c_path(False)
            try:
                assert ask(body, header_len) == in_c, body
            finally:
                endpoint.use_c_path(True)
        assert _native.http_stats()[0] > taken  # (some mutations leave a plain request)
        assert ask(seed, json_size)[0] == 200
