"""The KServe-v2 gRPC endpoint, driven by the stock tritonclient.grpc client."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from helpers import wait_for

grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("grpc")

from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import ModelConfig, SequenceBatcher, Server, Tensor  # noqa: E402
from embedtriton.triton.devices import cuda_devices  # noqa: E402


@pytest.fixture(scope="module", params=["native", "grpcio"])
def endpoint(request, add_sub, add_sub_tensors):
    """The same tests over both transports."""
    seen_params = []

    def echo(requests):
        seen_params.extend(dict(r.parameters) for r in requests)
        return [{"text": r["text"]} for r in requests]

    def running_sum(requests):
        out = []
        for r in requests:
            r.state["total"] = r.state.get("total", 0) + int(r["x"][0, 0])
            out.append({"total": np.array([[r.state["total"]]], np.int64)})
        return out

    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    server.bind(
        "Echo",
        echo,
        [Tensor(name="text", dtype=np.bytes_, shape=(-1,))],
        [Tensor(name="text", dtype=np.bytes_, shape=(-1,))],
    )
    server.bind(
        "Sum",
        running_sum,
        [Tensor(name="x", dtype=np.int64, shape=(1,))],
        [Tensor(name="total", dtype=np.int64, shape=(1,))],
        ModelConfig(max_batch_size=2, sequence_batcher=SequenceBatcher()),
    )
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport=request.param)
        server.seen_params = seen_params
        yield server, f"127.0.0.1:{port}"


def add_sub_inputs(a, b):
    inputs = [grpcclient.InferInput("a", list(a.shape), "FP32"), grpcclient.InferInput("b", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_health_metadata_config_statistics_index(endpoint):
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("AddSub") and not client.is_model_ready("Nope")
    meta = client.get_server_metadata()
    assert meta.name == "triton" and meta.version.startswith("2.")  # what Triton itself reports
    gpu = ["cuda_shared_memory"] if cuda_devices()[0] else []  # only where the server sees a GPU
    assert list(meta.extensions) == [  # exactly what this endpoint implements, in Triton's order
        "classification", "sequence", "model_repository", "schedule_policy", "model_configuration",
        "system_shared_memory", *gpu, "parameters", "statistics", "logging",
    ]  # fmt: skip
    meta = client.get_model_metadata("AddSub")
    assert [t.name for t in meta.inputs] == ["a", "b"] and meta.inputs[0].datatype == "FP32"
    config = client.get_model_config("AddSub").config
    assert config.max_batch_size == 8 and config.backend == "embedtriton"
    client.infer("AddSub", add_sub_inputs(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)))
    # (Triton reports a request's statistics after its answer is sent, which may reach us first)
    count = lambda: client.get_inference_statistics("AddSub").model_stats[0].inference_count  # noqa: E731
    assert wait_for(lambda: count() >= 1), count()
    assert {m.name for m in client.get_model_repository_index().models} == {"AddSub", "Echo", "Sum"}


def test_infer_raw_contents_and_requested_outputs(endpoint):
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    a, b = np.arange(4, dtype=np.float32).reshape(4, 1), np.ones((4, 1), np.float32)
    result = client.infer("AddSub", add_sub_inputs(a, b), request_id="r-1")
    np.testing.assert_array_equal(result.as_numpy("add"), a + b)
    np.testing.assert_array_equal(result.as_numpy("sub"), a - b)
    assert result.get_response().id == "r-1"
    only = client.infer("AddSub", add_sub_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("sub")])
    assert only.as_numpy("add") is None and only.as_numpy("sub") is not None


def test_typed_contents_bytes_and_parameters(endpoint):
    server, address = endpoint
    import grpc

    channel = grpc.insecure_channel(address)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = service_pb2.ModelInferRequest(model_name="Echo")
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[1, 2])
    tensor.contents.bytes_contents.extend([b"hello", b"\x00world"])
    request.parameters["mode"].string_param = "fast"
    request.parameters["k"].int64_param = 3
    response = stub.ModelInfer(request)
    assert response.outputs[0].name == "text" and list(response.outputs[0].shape) == [1, 2]
    assert response.outputs[0].datatype == "BYTES"
    assert response.raw_output_contents[0] == b"\x05\x00\x00\x00hello\x06\x00\x00\x00\x00world"
    assert server.seen_params[-1] == {"mode": "fast", "k": 3}
    channel.close()


def test_errors_map_to_grpc_status_codes(endpoint):
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    with pytest.raises(InferenceServerException) as info:
        client.infer("Nope", add_sub_inputs(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"  # as Triton answers
    assert info.value.message() == "Request for unknown model: 'Nope' is not found"
    for ask in (client.get_model_metadata, client.get_model_config, client.get_inference_statistics):
        with pytest.raises(
            InferenceServerException, match=r"^\[StatusCode.INVALID_ARGUMENT\] Request for unknown model"
        ):
            ask("Nope")
    wrong = [grpcclient.InferInput("a", [1, 1], "FP64"), grpcclient.InferInput("b", [1, 1], "FP32")]
    wrong[0].set_data_from_numpy(np.ones((1, 1), np.float64))
    wrong[1].set_data_from_numpy(np.ones((1, 1), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("AddSub", wrong)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    # Triton's words for a network client, without its "[request id: <id_unknown>]" prefix
    assert info.value.message() == "inference input 'a' data-type is 'FP64', but model 'AddSub' expects 'FP32'"
    assert client.is_server_live()  # still serving


def test_sequences_through_grpc(endpoint):
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    totals = []
    for i, value in enumerate([5, 6, 7]):
        x = grpcclient.InferInput("x", [1, 1], "INT64")
        x.set_data_from_numpy(np.array([[value]], np.int64))
        result = client.infer("Sum", [x], sequence_id=42, sequence_start=i == 0, sequence_end=i == 2)
        totals.append(int(result.as_numpy("total")[0, 0]))
    assert totals == [5, 11, 18]


def test_asyncio_client_many_in_flight(endpoint):
    _, address = endpoint
    import tritonclient.grpc.aio as aioclient

    async def main():
        client = aioclient.InferenceServerClient(address)
        calls = []
        for i in range(32):
            inputs = [aioclient.InferInput("a", [1, 1], "FP32"), aioclient.InferInput("b", [1, 1], "FP32")]
            inputs[0].set_data_from_numpy(np.full((1, 1), i, np.float32))
            inputs[1].set_data_from_numpy(np.ones((1, 1), np.float32))
            calls.append(client.infer("AddSub", inputs))
        results = await asyncio.gather(*calls)
        await client.close()
        return [float(r.as_numpy("add")[0, 0]) for r in results]

    assert asyncio.run(main()) == [i + 1.0 for i in range(32)]


def test_stop_closes_the_endpoint(add_sub, add_sub_tensors):
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors)
    server.start()
    port = server.serve_grpc("127.0.0.1:0")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    assert client.is_server_live()
    server.stop()
    with pytest.raises(InferenceServerException):
        client.is_server_live(client_timeout=2)


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_stream_infer_with_a_decoupled_model(transport, add_sub, add_sub_tensors):
    import queue

    def counter(requests):
        counts = [int(r["n"][0, 0]) for r in requests]
        for i in range(max(counts)):
            yield [{"i": np.array([[i]], np.int32)} if i < n else None for n in counts]

    server = Server()
    server.bind(
        "Count",
        counter,
        [Tensor(name="n", dtype=np.int32, shape=(1,))],
        [Tensor(name="i", dtype=np.int32, shape=(1,))],
        ModelConfig(decoupled=True),
    )
    server.bind("AddSub", add_sub, *add_sub_tensors)
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport=transport)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        n = grpcclient.InferInput("n", [1, 1], "INT32")
        n.set_data_from_numpy(np.array([[3]], np.int32))
        client.async_stream_infer("Count", [n], request_id="c", enable_empty_final_response=True)
        got, final = [], False
        while not final:
            result, error = results.get(timeout=10)
            assert error is None
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            if not final:
                got.append(int(result.as_numpy("i")[0, 0]))
        assert got == [0, 1, 2]
        # a plain model on the stream, and an error that does not end the stream
        client.async_stream_infer("AddSub", add_sub_inputs(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)))
        result, error = results.get(timeout=10)
        assert error is None and result.as_numpy("add")[0, 0] == 2
        client.async_stream_infer("Nope", [n])
        result, error = results.get(timeout=10)
        assert result is None and "Nope" in str(error)
        client.async_stream_infer("Count", [n])
        values = [int(results.get(timeout=10)[0].as_numpy("i")[0, 0]) for _ in range(3)]
        assert values == [0, 1, 2]
        client.stop_stream()


def test_metrics_endpoint(endpoint):
    import urllib.error
    import urllib.request

    server, _ = endpoint
    port = server.serve_metrics("127.0.0.1:0")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "nv_inference_request_success" in text
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    assert info.value.code == 404


def test_serve_command(tmp_path):
    import re
    import signal
    import subprocess
    import sys
    import urllib.request

    (tmp_path / "models.py").write_text(
        "import numpy as np\n"
        "from embedtriton import Tensor, batch\n"
        "def bind(server):\n"
        "    server.bind('Double', batch(lambda x: {'y': x * 2}),\n"
        "                [Tensor(name='x', dtype=np.float32, shape=(1,))], [Tensor(name='y', dtype=np.float32, shape=(1,))])\n"
    )
    command = ["serve", "models:bind", "--grpc", "127.0.0.1:0", "--metrics", "", "--max-message-bytes", "65536"]
    command += ["--http", "127.0.0.1:0"]
    process = subprocess.Popen(
        [sys.executable, "-m", "embedtriton", *command],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            lines.append(line)
            if "ready:" in line or not line:
                break
        assert any("ready: Double" in line for line in lines), lines
        port = int(re.search(r"serving gRPC on .* \(port (\d+)\)", "".join(lines)).group(1))
        http_port = int(re.search(r"serving HTTP on .* \(port (\d+)\)", "".join(lines)).group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/Double/ready") as ready:
            assert ready.status == 200
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        x = grpcclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.full((1, 1), 21, np.float32))
        assert client.infer("Double", [x]).as_numpy("y")[0, 0] == 42
        big = grpcclient.InferInput("x", [32768, 1], "FP32")  # 128 KiB > the 64 KiB cap
        big.set_data_from_numpy(np.zeros((32768, 1), np.float32))
        with pytest.raises(InferenceServerException, match="RESOURCE_EXHAUSTED|larger than"):
            client.infer("Double", [big])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()


def test_model_version_is_honoured(endpoint):
    """A version that is not loaded is Triton's NOT_FOUND, a malformed one INVALID_ARGUMENT, on
    every RPC; never an answer from another version."""
    _, address = endpoint
    client = grpcclient.InferenceServerClient(address)
    inputs = add_sub_inputs(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32))
    assert client.infer("AddSub", inputs, model_version="1").as_numpy("add").tolist() == [[2.0]]
    assert client.is_model_ready("AddSub", "1") and not client.is_model_ready("AddSub", "2")
    not_loaded = "[StatusCode.NOT_FOUND] Request for unknown model: 'AddSub' version 2 is not found"
    for ask in (
        lambda v: client.infer("AddSub", inputs, model_version=v),
        lambda v: client.get_model_metadata("AddSub", v),
        lambda v: client.get_model_config("AddSub", v),
    ):
        with pytest.raises(InferenceServerException) as info:
            ask("2")
        assert str(info.value) == not_loaded
        with pytest.raises(InferenceServerException, match=r"^\[StatusCode.INVALID_ARGUMENT\] failed to get model"):
            ask("x")
        with pytest.raises(InferenceServerException, match=r"^\[StatusCode.INVALID_ARGUMENT\] invalid model version"):
            ask("-3")
    with pytest.raises(InferenceServerException, match="requested model version is not available"):
        client.get_inference_statistics("AddSub", "2")


def test_serve_command_errors_are_one_line(tmp_path):
    """--version; a target that is no bind function; a bad declaration; a port in use: one line
    that says what to fix, never a traceback."""
    import socket
    import subprocess
    import sys

    (tmp_path / "targets.py").write_text(
        "import numpy as np\n"
        "from embedtriton import Tensor, batch\n"
        "NOT_A_FUNCTION = 3\n"
        "def no_arguments():\n    pass\n"
        "def needs_batch(server):\n"
        "    server.bind('X', lambda a, b: a, [Tensor(name='a', dtype=np.float32, shape=(1,))],"
        " [Tensor(name='y', dtype=np.float32, shape=(1,))])\n"
        "def good(server):\n"
        "    server.bind('Double', batch(lambda x: {'y': x * 2}), [Tensor(name='x', dtype=np.float32, shape=(1,))],"
        " [Tensor(name='y', dtype=np.float32, shape=(1,))])\n"
    )

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "embedtriton", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )

    done = run("--version")
    assert done.returncode == 0 and done.stdout.strip() == "embedtriton 0.1.0"
    done = run("serve", "targets:NOT_A_FUNCTION")
    assert done.returncode == 2 and "targets:NOT_A_FUNCTION is a int, not a function" in done.stderr
    assert "def bind(server):" in done.stderr and "Traceback" not in done.stderr
    done = run("serve", "targets:no_arguments")
    assert done.returncode == 2 and "takes (), not one argument (the Server)" in done.stderr
    done = run("serve", "targets:needs_batch", "--grpc", "", "--metrics", "")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "embedtriton serve: targets:needs_batch: model 'X': infer_func(a, b)" in done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("serve", "targets:good", "--grpc", f"127.0.0.1:{port}", "--metrics", "")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"embedtriton serve: cannot serve gRPC on 127.0.0.1:{port}" in done.stderr


def test_serve_from_a_source_checkout_says_so(tmp_path):
    """`python -m embedtriton` inside a source folder imports the unbuilt package: one line
    that says why and what to do, not an ImportError traceback."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    source = Path(__file__).resolve().parents[2] / "embedtriton"
    shutil.copytree(source, tmp_path / "embedtriton", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (tmp_path / "targets.py").write_text("def bind(server):\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "embedtriton", "serve", "targets:bind"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "native module is not built in" in done.stderr and "Run from another folder" in done.stderr


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_stock_asyncio_client_stream_kept_open(transport):
    """tritonclient.grpc.aio's stream_infer with a request iterator that stays open (long-lived
    streams): the responses arrive meanwhile, not only once the client half-closes."""
    aio = pytest.importorskip("tritonclient.grpc.aio")

    def counter(requests):
        for i in range(int(requests[0]["n"][0, 0])):
            yield [{"i": np.array([[i]], np.int32)}]

    server = Server()
    server.bind(
        "Count",
        counter,
        [Tensor(name="n", dtype=np.int32, shape=(1,))],
        [Tensor(name="i", dtype=np.int32, shape=(1,))],
        ModelConfig(max_batch_size=1, decoupled=True),
    )
    with server:
        port = server.serve_grpc("127.0.0.1:0", transport=transport)

        async def main() -> list[int]:
            client = aio.InferenceServerClient(f"127.0.0.1:{port}")
            hold = asyncio.Event()

            async def requests():
                n = aio.InferInput("n", [1, 1], "INT32")
                n.set_data_from_numpy(np.array([[3]], np.int32))
                yield {"model_name": "Count", "inputs": [n]}
                await hold.wait()  # the request stream stays open

            got: list[int] = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                got.append(int(result.as_numpy("i")[0, 0]))
                if len(got) == 3:
                    break
            hold.set()
            await client.close()
            return got

        assert asyncio.run(asyncio.wait_for(main(), 30)) == [0, 1, 2]


def test_metrics_endpoint_on_ipv6():
    """``--metrics [::]:8002`` as the gRPC and HTTP endpoints take it (IPv6-only clusters)."""
    import socket
    import urllib.request

    from embedtriton import Server

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    with Server() as server:
        port = server.serve_metrics("[::1]:0")
        text = urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=10).read().decode()
        assert "nv_" in text
