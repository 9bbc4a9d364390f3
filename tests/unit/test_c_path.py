"""The C path's contract (embedtriton/frontends/c_path.py): every option field, every InferRequest
field and every KServe parameter the C decoders take is classified there, a field nobody
classified sends every call to the Python path, and the C decoders take exactly the parameters
the tables list (the rest are declined, for the Python path to read)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from embedtriton import _native
from embedtriton.core import InferRequest
from embedtriton.frontends import c_path
from embedtriton.frontends.grpc.options import GrpcOptions
from embedtriton.frontends.http.options import HttpOptions

pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2  # noqa: E402


def field_names(cls: type, prefix: str = "") -> set[str]:
    names = set()
    for f in dataclasses.fields(cls):
        names.add(prefix + f.name)
        kind = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            names |= field_names(kind, f"{prefix}{f.name}.")
    return names


@pytest.mark.parametrize(("options", "table"), [(HttpOptions, c_path.HTTP_OPTIONS), (GrpcOptions, c_path.GRPC_OPTIONS)])
def test_every_option_field_is_classified(options, table):
    assert field_names(options) == set(table)  # (a new field, or one gone: classify it in c_path.py)
    assert c_path.options_declining(options(), table) == []  # the defaults let C take plain calls


def test_a_field_nobody_classified_sends_every_call_to_the_python_path():
    @dataclasses.dataclass(frozen=True)
    class Newer(HttpOptions):
        new_option: int = 1

    assert c_path.options_declining(Newer(), c_path.HTTP_OPTIONS) == [
        "new_option (not classified in embedtriton/frontends/c_path.py)"
    ]


@pytest.mark.parametrize(
    ("options", "table", "declined"),
    [
        (HttpOptions(header_forward_pattern="^x-"), c_path.HTTP_OPTIONS, ["forward"]),
        (HttpOptions(restricted_api="inference:key=secret"), c_path.HTTP_OPTIONS, ["restrictions"]),
        (HttpOptions(restricted_api="health:key=secret"), c_path.HTTP_OPTIONS, []),
        (GrpcOptions(header_forward_pattern="^x-"), c_path.GRPC_OPTIONS, ["forward"]),
        (GrpcOptions(transport="grpcio"), c_path.GRPC_OPTIONS, ["transport"]),
        (GrpcOptions(restricted_protocol="inference:key=secret"), c_path.GRPC_OPTIONS, []),
        (GrpcOptions(infer_response_compression_level="high"), c_path.GRPC_OPTIONS, []),
    ],
)
def test_the_options_that_decline(options, table, declined):
    assert c_path.options_declining(options, table) == declined


def test_every_infer_request_field_is_classified():
    assert set(InferRequest.__slots__) == set(c_path.INFER_REQUEST)


class Binding:
    decoupled = False
    output_specs = [("y", 8, (1,))]  # (INT32)


@pytest.mark.parametrize(
    ("attribute", "value"),
    [("decoupled", True), ("required_inputs", ("x",)), ("batch_rule", object()), ("step_models", set())],
)
def test_the_model_attributes_that_decline(attribute, value):
    binding = Binding()
    assert c_path.model_declines(binding) == []
    setattr(binding, attribute, value)
    assert c_path.model_declines(binding) == [attribute]


# -- the decoders against the tables -------------------------------------------------------------

INPUT = np.arange(3, dtype=np.int32)


def grpc_message(parameters=None, input_parameters=None, output_parameters=None) -> bytes:
    m = service_pb2.ModelInferRequest(model_name="m", id="one")
    t = m.inputs.add(name="x", datatype="INT32", shape=[3])
    m.raw_input_contents.append(INPUT.tobytes())
    o = m.outputs.add(name="y")
    for target, values in (
        (m.parameters, parameters),
        (t.parameters, input_parameters),
        (o.parameters, output_parameters),
    ):
        for key, value in (values or {}).items():
            if isinstance(value, bool):
                target[key].bool_param = value
            elif isinstance(value, int):
                target[key].int64_param = value
            else:
                target[key].string_param = value
    return m.SerializeToString()


def http_body(parameters=None, input_parameters=None, output_parameters=None) -> bytes:
    tensor = {"name": "x", "datatype": "INT32", "shape": [3], "data": INPUT.tolist()}
    if input_parameters:
        tensor["parameters"] = input_parameters
    output = {"name": "y", **({"parameters": output_parameters} if output_parameters else {})}
    request = {"id": "one", "inputs": [tensor], "outputs": [output]}
    if parameters:
        request["parameters"] = parameters
    return json.dumps(request).encode()


def taken(transport: str, **parameters) -> bool:
    if transport == "grpc":
        return _native.kserve_decode(grpc_message(**parameters)) is not None
    return _native.kserve_json_decode(http_body(**parameters), -1) is not None


VALUES = {"binary_data_output": True, "binary_data": True, "triton_enable_empty_final_response": True}


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_the_decoders_take_the_parameters_listed_and_decline_the_others(transport):
    assert taken(transport)  # (a plain request)
    for name in c_path.REQUEST_PARAMETERS[transport]:
        assert taken(transport, parameters={name: VALUES[name]}), name
    for name in c_path.OUTPUT_PARAMETERS[transport]:
        assert taken(transport, output_parameters={name: VALUES[name]}), name
    # what sets an InferRequest field the C path leaves alone, and what the Python path reads
    parameters = [v for v in c_path.INFER_REQUEST.values() if v is not None and " " not in v]
    assert {"priority", "timeout", "sequence_id"} <= set(parameters)
    for name in [
        *parameters,
        *c_path.SEQUENCE_PARAMETERS,
        "any_other",
        "binary_data_output" if transport == "grpc" else "",
    ]:
        if name and name not in c_path.REQUEST_PARAMETERS[transport]:
            assert not taken(transport, parameters={name: 1}), name
    for name in ("shared_memory_region", "shared_memory_byte_size", "classification", "any_other"):
        assert not taken(transport, output_parameters={name: 1}), name
        assert not taken(transport, input_parameters={name: 1}), name
