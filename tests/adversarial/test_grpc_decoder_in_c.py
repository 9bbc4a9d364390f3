"""The C decoder of ModelInferRequest (native/_native/kserve.c, through _native.kserve_decode)
against protobuf's own parser: whatever it takes, protobuf parses to the same values; what it
cannot read exactly it declines (the Python path then answers). Mutated and truncated messages
never crash it, and decoding many of them leaves the memory flat."""

from __future__ import annotations

import random
import resource

import pytest

pytest.importorskip("tritonclient.grpc")
hypothesis = pytest.importorskip("hypothesis")

from google.protobuf.message import DecodeError  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402

from embedtriton import _native  # noqa: E402
from embedtriton.frontends import c_path  # noqa: E402

SIZES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "UINT32": 4, "INT32": 4,
         "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}  # fmt: skip
NAMES = st.text(st.characters(min_codepoint=1, max_codepoint=0x7F), min_size=1, max_size=12)
ANY_TEXT = st.text(max_size=12)
TAKEN = c_path.REQUEST_PARAMETERS["grpc"]  # (triton_enable_empty_final_response: perf_analyzer sends it)
EMPTY_FINAL = "triton_enable_empty_final_response"


def parsed_view(data: bytes):
    """What kserve_decode would say of a message that protobuf parses, were it plain; None when
    protobuf refuses it or it is not plain (parameters, typed contents)."""
    try:
        m = service_pb2.ModelInferRequest.FromString(data)
    except DecodeError:
        return None
    inputs_taken, outputs_taken = c_path.INPUT_PARAMETERS["grpc"], c_path.OUTPUT_PARAMETERS["grpc"]
    if set(m.parameters) - TAKEN or any(set(t.parameters) - inputs_taken or t.HasField("contents") for t in m.inputs):
        return None
    if any(set(o.parameters) - outputs_taken for o in m.outputs) or len(m.raw_input_contents) < len(m.inputs):
        return None
    return {
        "model_name": m.model_name,
        "model_version": m.model_version,
        "id": m.id,
        "inputs": [(t.name, t.datatype, tuple(t.shape), m.raw_input_contents[i]) for i, t in enumerate(m.inputs)],
        "outputs": [o.name for o in m.outputs],
    }


def check(data: bytes) -> bool:
    """kserve_decode(data) agrees with protobuf; whether it took the message."""
    decoded = _native.kserve_decode(data)
    if decoded is not None:
        assert decoded == parsed_view(data)
    return decoded is not None


@st.composite
def plain_requests(draw):
    m = service_pb2.ModelInferRequest(model_name=draw(NAMES), model_version=draw(st.sampled_from(["", "1", "02"])))
    m.id = draw(st.sampled_from(["", "an-id"]))
    names = draw(st.lists(NAMES, max_size=4, unique=True))
    for name in names:
        datatype = draw(st.sampled_from(sorted(SIZES)))
        shape = draw(st.lists(st.integers(1, 3), max_size=4))
        m.inputs.add(name=name, datatype=datatype, shape=shape)
        count = 1
        for d in shape:
            count *= d
        m.raw_input_contents.append(draw(st.binary(min_size=count * SIZES[datatype], max_size=count * SIZES[datatype])))
    for name in draw(st.lists(NAMES, max_size=3)):
        m.outputs.add(name=name)
    if draw(st.booleans()):
        m.parameters[EMPTY_FINAL].bool_param = draw(st.booleans())
    return m.SerializeToString()


@st.composite
def any_requests(draw):
    m = service_pb2.ModelInferRequest(model_name=draw(ANY_TEXT), model_version=draw(ANY_TEXT), id=draw(ANY_TEXT))
    for _ in range(draw(st.integers(0, 3))):
        t = m.inputs.add(name=draw(ANY_TEXT), datatype=draw(st.sampled_from([*SIZES, "BYTES", "BF16", "X", ""])))
        t.shape.extend(draw(st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 4), max_size=40)))
        if draw(st.booleans()):
            t.parameters["shared_memory_region"].string_param = "r"
        if draw(st.booleans()):
            t.contents.fp32_contents.extend([1.0])
    for _ in range(draw(st.integers(0, 3))):
        m.raw_input_contents.append(draw(st.binary(max_size=40)))
    for _ in range(draw(st.integers(0, 2))):
        o = m.outputs.add(name=draw(ANY_TEXT))
        if draw(st.booleans()):
            o.parameters["classification"].int64_param = 2
    if draw(st.booleans()):
        m.parameters["priority"].int64_param = 1
    if draw(st.booleans()):
        value = m.parameters[EMPTY_FINAL]
        kind = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"]))
        setattr(value, kind, {"bool_param": True, "string_param": draw(ANY_TEXT), "double_param": 0.5}.get(kind, 3))
    return m.SerializeToString()


@settings(max_examples=100, deadline=None)
@given(plain_requests())
def test_plain_requests_are_taken_with_protobufs_values(data):
    assert check(data)


@settings(max_examples=100, deadline=None)
@given(any_requests())
def test_what_it_takes_protobuf_reads_the_same(data):
    check(data)


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        what = rng.random()
        if what < 0.3 and b:
            del b[rng.randrange(len(b)) :]  # truncated
        elif what < 0.6 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif what < 0.8:
            b[rng.randrange(len(b) + 1) : 0] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 11)))
        elif b:
            del b[rng.randrange(len(b))]
    return bytes(b)


@settings(max_examples=60, deadline=None)
@given(plain_requests(), st.randoms(use_true_random=False))
def test_mutated_and_truncated_messages_agree_with_protobuf(data, rng):
    for _ in range(20):
        check(mutate(data, rng))


def test_absent_fields_read_as_protobuf_reads_them():
    nameless = service_pb2.ModelInferRequest(model_name="m")
    nameless.inputs.add(datatype="BOOL")  # no name: "" (hypothesis found the C side reading None)
    nameless.raw_input_contents.append(b"\0")
    assert check(nameless.SerializeToString())
    typeless = service_pb2.ModelInferRequest(model_name="m")
    typeless.inputs.add(name="x")  # no datatype: not a numeric one, declined
    typeless.raw_input_contents.append(b"\0")
    assert not check(typeless.SerializeToString())


def test_varints_and_lengths_are_bounded():
    assert _native.kserve_decode(b"\x0a\xff\xff\xff\xff\x0f") is None  # a length past the end
    assert _native.kserve_decode(b"\x0a" + b"\xff" * 11) is None  # an 11-byte varint
    assert _native.kserve_decode(b"\x2a\x04\x1a\x02\x01") is None  # a packed shape cut short
    assert _native.kserve_decode(b"\x00\x00") is None  # field 0
    assert _native.kserve_decode(b"\x0b\x0c") is None  # a group
    many = service_pb2.ModelInferRequest(model_name="m")
    many.inputs.add(name="x", datatype="FP32", shape=[1] * 33)  # over MAX_DIMS
    many.raw_input_contents.append(b"\0" * 4)
    assert _native.kserve_decode(many.SerializeToString()) is None
    huge = service_pb2.ModelInferRequest(model_name="m")
    huge.inputs.add(name="x", datatype="FP64", shape=[2**62, 2**62])  # the byte size overflows
    huge.raw_input_contents.append(b"")
    assert _native.kserve_decode(huge.SerializeToString()) is None


def test_memory_stays_flat_over_many_mutated_messages():
    rng = random.Random(7)
    seeds = []
    for i in range(20):
        m = service_pb2.ModelInferRequest(model_name=f"m{i}", id="x" * i)
        m.inputs.add(name="a", datatype="FP32", shape=[i + 1, 3])
        m.raw_input_contents.append(b"\1" * 12 * (i + 1))
        m.outputs.add(name="y")
        seeds.append(m.SerializeToString())

    def run(n):
        for _ in range(n):
            _native.kserve_decode(mutate(rng.choice(seeds), rng))

    run(10000)  # warm up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(50000)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 4096, grown_kib


def test_an_endpoint_answers_mutated_messages_as_the_python_path(add_sub, add_sub_tensors, monkeypatch):
    """Mutated ModelInfer messages to a running endpoint: with the C path and without it, the same
    status, words and response; the server survives them all."""
    import grpc
    import numpy as np

    from embedtriton import ModelConfig, Server
    from embedtriton.frontends.grpc.service import Service

    m = service_pb2.ModelInferRequest(model_name="AddSub", id="i")
    for name in ("a", "b"):
        m.inputs.add(name=name, datatype="FP32", shape=[2, 1])
        m.raw_input_contents.append(np.ones((2, 1), np.float32).tobytes())
    m.outputs.add(name="add")
    seed = m.SerializeToString()
    rng = random.Random(11)
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport="native")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

            def ask(data):
                try:
                    return 0, "", infer(data, timeout=30)
                except grpc.RpcError as exc:
                    return exc.code(), exc.details(), b""

            taken = _native.grpc_stats()[0]
            for _ in range(150):
                data = mutate(seed, rng)
                in_c = ask(data)
                with monkeypatch.context() as p:
                    p.setattr(Service, "infer_in_c", False)
                    assert ask(data) == in_c, service_pb2.ModelInferRequest.FromString(data) if check(data) else data
            assert _native.grpc_stats()[0] > taken  # (some mutations leave a plain request)
            assert ask(seed)[0] == 0


def test_memory_stays_flat_over_many_calls_answered_in_c(add_sub, add_sub_tensors):
    """Each call answered in C lets go of its message, its _h2 call and its Triton request and
    response: 2,000 calls of 64 KiB leave the resident size where it was."""
    import grpc
    import numpy as np

    from embedtriton import ModelConfig, Server

    m = service_pb2.ModelInferRequest(model_name="AddSub")
    for name in ("a", "b"):
        m.inputs.add(name=name, datatype="FP32", shape=[8, 1])
        m.raw_input_contents.append(np.ones((8, 1), np.float32).tobytes())
    data = m.SerializeToString() + b"\x9a\x06\x80\x80\x04" + bytes(65536)  # and an unknown field 99 of 64 KiB

    def resident_kib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4

    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport="native")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            for _ in range(300):
                infer(data, timeout=30)
            taken, before = _native.grpc_stats()[0], resident_kib()
            for _ in range(2000):
                infer(data, timeout=30)
            grown = resident_kib() - before
    assert _native.grpc_stats()[0] - taken == 2000
    assert grown < 32 * 1024, grown  # (a leak of the messages alone would be 125 MiB)
