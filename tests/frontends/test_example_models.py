"""examples/triton_example_models.py served over gRPC: the flows of Triton's example clients
(simple_grpc_*_client.py), replayed with the stock tritonclient.grpc."""

from __future__ import annotations

import importlib.util
import os
import queue
import uuid
from pathlib import Path

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import Server  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "triton_example_models.py"
IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
IN1 = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module")
def url():
    spec = importlib.util.spec_from_file_location("triton_example_models", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    server = Server()
    module.bind(server)
    with server:
        yield f"127.0.0.1:{server.serve_grpc('127.0.0.1:0')}"


@pytest.fixture
def client(url):
    with grpcclient.InferenceServerClient(url) as c:
        yield c


def simple_inputs(a=IN0, b=IN1, datatype="INT32"):
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), datatype),
        grpcclient.InferInput("INPUT1", list(b.shape), datatype),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_health_and_metadata(client):
    assert client.is_server_live(headers={"test": "1"}) and client.is_server_ready()
    names = {m.name for m in client.get_model_repository_index().models}
    assert {"simple", "simple_string", "simple_sequence", "repeat_int32", "square_int32"} <= names
    assert all(client.is_model_ready(name) for name in names)
    assert client.get_server_metadata().name == "triton"
    meta = client.get_model_metadata("simple")
    assert meta.name == "simple"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    assert [t.name for t in meta.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert client.get_model_config("simple").config.max_batch_size == 8
    assert client.get_model_config("repeat_int32").config.model_transaction_policy.decoupled
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        client.get_model_metadata("wrong_model_name")


def test_simple_sync_and_async(client):
    requested = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", simple_inputs(), outputs=requested, headers={"test": "1"})
    assert (result.as_numpy("OUTPUT0") == IN0 + IN1).all() and (result.as_numpy("OUTPUT1") == IN0 - IN1).all()
    result = client.infer("simple", simple_inputs())  # no outputs named: all of them
    assert (result.as_numpy("OUTPUT1") == IN0 - IN1).all()
    assert len(client.get_inference_statistics("simple").model_stats) == 1

    done = queue.Queue()
    client.async_infer("simple", simple_inputs(), lambda result, error: done.put((result, error)), outputs=requested)
    result, error = done.get(timeout=10)
    assert error is None and (result.as_numpy("OUTPUT0") == IN0 + IN1).all()


def test_int8_in_explicit_contents(url):
    """grpc_explicit_int8_content_client: the generated stub, values in int_contents."""
    request = service_pb2.ModelInferRequest(model_name="simple_int8")
    for name, values in (("INPUT0", range(16)), ("INPUT1", [1] * 16)):
        tensor = request.inputs.add(name=name, datatype="INT8", shape=[1, 16])
        tensor.contents.int_contents[:] = list(values)
    with grpc.insecure_channel(url) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    sums = np.frombuffer(response.raw_output_contents[0], dtype=np.int8)
    assert sums.tolist() == list(range(1, 17))


def test_strings_and_identity(client):
    to_text = np.vectorize(lambda v: str(v).encode(), otypes=[object])
    result = client.infer("simple_string", simple_inputs(to_text(IN0), to_text(IN1), "BYTES"))
    assert result.as_numpy("OUTPUT0").astype(np.int64).tolist() == (IN0 + IN1).tolist()
    assert result.as_numpy("OUTPUT1").astype(np.int64).tolist() == (IN0 - IN1).tolist()

    blobs = np.array([[b"he\x00llo", b"\x00\x01\x02\x03"] * 8], dtype=np.object_)
    tensor = grpcclient.InferInput("INPUT0", list(blobs.shape), "BYTES")
    tensor.set_data_from_numpy(blobs)
    assert (client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0") == blobs).all()


def run_sequence(client, model, sequence_id, values):
    answers = []
    for i, value in enumerate(values):
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
        result = client.infer(
            model, [tensor], sequence_id=sequence_id, sequence_start=i == 0, sequence_end=i == len(values) - 1
        )
        answers.append(int(result.as_numpy("OUTPUT")[0, 0]))
    return answers


def test_sequences(client):
    values = [0, 11, 7, 5, 3, 2, 0, 1]
    # simple_sequence: INPUT + START, whatever the correlation id's type
    assert run_sequence(client, "simple_sequence", 1000, values) == [1, 11, 7, 5, 3, 2, 0, 1]
    assert run_sequence(client, "simple_sequence", str(uuid.uuid4()), [20, -11, -7]) == [21, -11, -7]
    # simple_dyna_sequence: the correlation id is added on the last request
    assert run_sequence(client, "simple_dyna_sequence", 1001, [100, -11, -1]) == [101, -11, -1 + 1001]
    # simple_string_dyna_sequence: a running sum, plus the decimal string id at the end
    assert run_sequence(client, "simple_string_dyna_sequence", "1002", [20, -11, -7]) == [20, 9, 2 + 1002]


def test_decoupled_stream(client):
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put(error or result))
    try:
        inputs = [
            grpcclient.InferInput("IN", [4], "INT32"),
            grpcclient.InferInput("DELAY", [4], "UINT32"),
            grpcclient.InferInput("WAIT", [1], "UINT32"),
        ]
        inputs[0].set_data_from_numpy(np.arange(100, 104, dtype=np.int32))
        inputs[1].set_data_from_numpy(np.ones(4, np.uint32))
        inputs[2].set_data_from_numpy(np.ones(1, np.uint32))
        client.async_stream_infer("repeat_int32", inputs, outputs=[grpcclient.InferRequestedOutput("OUT")])
        outs = [responses.get(timeout=10) for _ in range(4)]
        assert [int(r.as_numpy("OUT")[0]) for r in outs] == [100, 101, 102, 103]

        square = grpcclient.InferInput("IN", [1], "INT32")
        square.set_data_from_numpy(np.array([3], np.int32))
        client.async_stream_infer("square_int32", [square])
        assert [int(responses.get(timeout=10).as_numpy("OUT")[0]) for _ in range(3)] == [3, 3, 3]
    finally:
        client.stop_stream()
    assert responses.empty()


def test_system_shared_memory_flow(client):
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    client.unregister_system_shared_memory()
    size = IN0.nbytes
    tag = f"et{os.getpid()}"
    regions = {}
    try:
        for name in ("input0", "input1", "output0", "output1"):
            regions[name] = shm.create_shared_memory_region(f"{tag}_{name}", f"/{tag}_{name}", size)
            client.register_system_shared_memory(f"{tag}_{name}", f"/{tag}_{name}", size)
        shm.set_shared_memory_region(regions["input0"], [IN0])
        shm.set_shared_memory_region(regions["input1"], [IN1])
        status = client.get_system_shared_memory_status()
        assert {r.name for r in status.regions.values()} == {f"{tag}_{n}" for n in regions}

        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory(f"{tag}_input0", size)
        inputs[1].set_shared_memory(f"{tag}_input1", size)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory(f"{tag}_output0", size)
        outputs[1].set_shared_memory(f"{tag}_output1", size)
        result = client.infer("simple", inputs, outputs=outputs)
        out0 = result.get_output("OUTPUT0")  # shape and datatype only: the data is in the region
        assert out0.datatype == "INT32" and list(out0.shape) == [1, 16]
        sums = shm.get_contents_as_numpy(regions["output0"], np.int32, [1, 16])
        diffs = shm.get_contents_as_numpy(regions["output1"], np.int32, [1, 16])
        assert (sums == IN0 + IN1).all() and (diffs == IN0 - IN1).all()

        client.unregister_system_shared_memory(f"{tag}_input0")
        assert len(client.get_system_shared_memory_status().regions) == 3
        client.unregister_system_shared_memory()
        assert len(client.get_system_shared_memory_status().regions) == 0
    finally:
        for handle in regions.values():
            shm.destroy_shared_memory_region(handle)


def test_stand_in_classifier_tensors(client):
    image = grpcclient.InferInput("input", [1, 299, 299, 3], "FP32")
    image.set_data_from_numpy(np.full((1, 299, 299, 3), 0.5, np.float32))
    scores = client.infer("inception_graphdef", [image]).as_numpy("InceptionV3/Predictions/Softmax")
    assert scores.shape == (1, 1001) and abs(float(scores.sum()) - 1) < 1e-3


@pytest.mark.parametrize(
    ("model", "batch", "layout"), [("densenet_onnx", 1, "FORMAT_NCHW"), ("inception_graphdef", 2, "FORMAT_NHWC")]
)
def test_tritons_image_client_reads_the_input_format_and_classifies(url, client, tmp_path, model, batch, layout):
    """Triton's own image_client.py (tests/upstream/client, unchanged) reads the input's format
    from the model config to lay out the image (it refuses FORMAT_NONE), and prints the top 3
    classes as 'value (index) = label'."""
    image_module = pytest.importorskip("PIL.Image")
    import subprocess
    import sys

    assert client.get_model_config(model).config.input[0].format == model_config_pb2.ModelInput.Format.Value(layout)
    picture = tmp_path / "picture.jpg"
    image_module.fromarray(np.arange(64 * 48 * 3, dtype=np.uint8).reshape(64, 48, 3)).save(picture)
    script = Path(__file__).resolve().parents[1] / "upstream" / "client" / "image_client.py"
    done = subprocess.run(
        [sys.executable, str(script), "-m", model, "-c", "3", "-s", "INCEPTION", "-b", str(batch), "-i", "grpc",
         "-u", url, str(picture)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line.strip() for line in done.stdout.splitlines() if " = CLASS_" in line]
    assert len(lines) == 3 * batch, done.stdout
    assert "PASS" in done.stdout, done.stdout
