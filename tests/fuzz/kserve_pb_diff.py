"""atheris target: the gRPC C path's ModelInferRequest decoder (_native.kserve_decode: ks_decode
and ks_plain) against the protobuf library, on the same bytes.

What our decoder takes, protobuf must parse, to the same model, version, id, inputs (name,
datatype, shape, raw contents) and outputs, with no request parameter but the one the C path
ignores and no input parameters or typed contents (those go to the Python path). What protobuf
refuses, ours must refuse. (Ours refuses more: non-ASCII strings, negative dimensions, anything
the Python path words; that is not a difference.) protobuf's pure-Python implementation is used and
instrumented, so that atheris is guided by the paths it takes through the reference decoder; the
C decoder's own coverage guides kserve_pb.c.

    python tests/fuzz/kserve_pb_diff.py [libFuzzer flags] [corpus folders]
"""

import os
import sys

os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"  # (before protobuf is imported)

import atheris  # noqa: E402

with atheris.instrument_imports():
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2

from embedtriton import _native  # noqa: E402

IGNORED = {"triton_enable_empty_final_response"}  # the request parameter the C path ignores


def test_one_input(data: bytes) -> None:
    ours = _native.kserve_decode(data)
    try:
        ref = service_pb2.ModelInferRequest.FromString(data)
    except (DecodeError, RecursionError, ValueError):
        assert ours is None, f"protobuf refuses what ours takes: {ours}"
        return
    if ours is None:
        return
    assert ours["model_name"] == ref.model_name, (ours["model_name"], ref.model_name)
    assert ours["model_version"] == ref.model_version, (ours["model_version"], ref.model_version)
    assert ours["id"] == ref.id, (ours["id"], ref.id)
    assert set(ref.parameters) <= IGNORED, f"taken with request parameters {set(ref.parameters)}"
    assert len(ours["inputs"]) == len(ref.inputs), (len(ours["inputs"]), len(ref.inputs))
    for i, (name, datatype, shape, raw) in enumerate(ours["inputs"]):
        tensor = ref.inputs[i]
        assert (name, datatype) == (tensor.name, tensor.datatype), (i, name, datatype, tensor)
        assert list(shape) == list(tensor.shape), (i, shape, list(tensor.shape))
        assert not tensor.parameters and not tensor.HasField("contents"), f"input {i} taken with more than data"
        assert raw == ref.raw_input_contents[i], f"input {i}: raw contents differ"
    assert ours["outputs"] == [o.name for o in ref.outputs], (ours["outputs"], [o.name for o in ref.outputs])
    assert all(not o.parameters for o in ref.outputs), "outputs taken with parameters"


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
