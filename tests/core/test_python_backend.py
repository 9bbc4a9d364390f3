"""Repository models of Triton's python backend, in process: what they are is read from the
config Triton loaded (decoupled, batching, auto-completed tensors), BLS calls from them reach
bound callables, and a model that cannot load fails alone, at once, leaving no stub behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import (
    InvalidArgumentError,
    ModelConfig,
    Server,
    ServerConfig,
    Tensor,
    UnsupportedError,
    batch,
)

CALLS_BOUND = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BLS to two bound callables: Twice (plain) and Count (decoupled, n responses)."""

    def initialize(self, args):
        self.family = pb_utils.MetricFamily(
            name="calls_bound_total", description="requests seen", kind=pb_utils.MetricFamily.COUNTER
        )
        self.calls = self.family.Metric(labels={"model": "CallsBound"})

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x")
            twice = pb_utils.InferenceRequest(
                model_name="Twice", requested_output_names=["y"], inputs=[pb_utils.Tensor("x", x.as_numpy()[None])]
            ).exec()
            if twice.has_error():
                raise pb_utils.TritonModelException(twice.error().message())
            n = pb_utils.Tensor("n", np.array([3], dtype=np.int32))
            parts = pb_utils.InferenceRequest(
                model_name="Count", requested_output_names=["i"], inputs=[n]
            ).exec(decoupled=True)
            seen = [int(pb_utils.get_output_tensor_by_name(p, "i").as_numpy()[0]) for p in parts if p.output_tensors()]
            y = pb_utils.get_output_tensor_by_name(twice, "y").as_numpy()[0]  # (Twice batches)
            self.calls.increment(1)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("y", y), pb_utils.Tensor("parts", np.array(seen, dtype=np.int32))
            ]))
        return responses
'''
CALLS_BOUND_CONFIG = """
backend: "python"
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "parts" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


def python_model(root: Path, name: str, source: str, config: str | None) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)


@pytest.fixture
def stub_path(stub_python, monkeypatch):
    """The python backend's stubs run on the test stub environment (first on PATH)."""
    monkeypatch.setenv("PATH", f"{stub_python['bin']}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture(scope="module")
def repository_server(tmp_path_factory, stub_python, python_backend_example):
    root = tmp_path_factory.mktemp("python_backend")
    python_backend_example(root, "square_int32", "decoupled/square_model.py", "decoupled/square_config.pbtxt")
    python_backend_example(root, "batch_auto_complete", "auto_complete/batch_model.py")
    python_model(root, "CallsBound", CALLS_BOUND, CALLS_BOUND_CONFIG)
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{stub_python['bin']}{os.pathsep}{path}"
    server = Server(ServerConfig(model_repository=[str(root)], model_control_mode="none"))
    server.bind(
        "Twice",
        batch(lambda x: {"y": x * 2}),
        [Tensor(name="x", dtype=np.float32, shape=(2,))],
        [Tensor(name="y", dtype=np.float32, shape=(2,))],
        ModelConfig(max_batch_size=8),
    )

    def count(requests):
        n = int(requests[0]["n"][0])
        for i in range(n):
            yield [{"i": np.array([i], dtype=np.int32)}]

    server.bind(
        "Count",
        count,
        [Tensor(name="n", dtype=np.int32, shape=(1,))],
        [Tensor(name="i", dtype=np.int32, shape=(1,))],
        ModelConfig(batching=False, decoupled=True),
    )
    try:
        with server:
            yield server
    finally:
        os.environ["PATH"] = path


def test_a_decoupled_repository_model_streams_every_response(repository_server):
    model = repository_server.model("square_int32")
    assert model.decoupled and not model.batched  # read from what Triton loaded
    parts = list(model.stream({"IN": np.array([4], dtype=np.int32)}))
    assert [int(p["OUT"][0]) for p in parts] == [4, 4, 4, 4]
    # IN = 0: the model answers with the final flag alone: an empty stream, not an error
    assert list(model.stream({"IN": np.array([0], dtype=np.int32)})) == []
    with pytest.raises(InvalidArgumentError, match="'square_int32' is decoupled: call stream"):
        model.infer({"IN": np.array([1], dtype=np.int32)})


def test_a_folder_without_config_is_auto_completed_by_its_model(repository_server):
    model = repository_server.model("batch_auto_complete")
    config = model.config()  # what its auto_complete_config set: batching, tensors
    assert config["max_batch_size"] == 4 and model.batched and not model.decoupled
    assert [t["name"] for t in config["input"]] == ["INPUT0", "INPUT1"]
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    out = model.infer({"INPUT0": x, "INPUT1": x})
    assert np.allclose(out["OUTPUT0"], x + x) and np.allclose(out["OUTPUT1"], x - x)


def test_bls_and_custom_metrics_from_a_python_backend_model(repository_server):
    model = repository_server.model("CallsBound")
    for _ in range(2):
        out = model.infer({"x": np.array([1.5, -2.0], dtype=np.float32)})
        assert np.allclose(out["y"], [3.0, -4.0])  # from the bound callable Twice
        assert out["parts"].tolist() == [0, 1, 2]  # every response of the bound decoupled Count
    assert 'calls_bound_total{model="CallsBound"} 2' in repository_server.metrics()


def test_a_model_that_cannot_load_fails_at_once_naming_its_format(tmp_path, stub_path):
    python_model(
        tmp_path,
        "NeedsFramework",
        """
        import a_framework_that_is_not_installed  # e.g. torch in an environment without it
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def execute(self, requests):
                return []
        """,
        'backend: "python"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
    )
    python_model(tmp_path, "Callable", "import numpy as np\nraise RuntimeError('broken at import')\n", None)
    server = Server(ServerConfig(model_repository=[str(tmp_path)], model_control_mode="explicit"))
    with server:
        started = time.monotonic()
        with pytest.raises(  # (Triton's code for a failed load)
            InvalidArgumentError,
            match=r"(?s)read as a model of Triton's python backend.*No module named 'a_framework_that",
        ):
            server.load("NeedsFramework")
        assert time.monotonic() - started < 20  # one try, not reloaded forever (Triton's retry count unset)
        with pytest.raises(InvalidArgumentError, match=r"read as an embedtriton callable model .*broken at import"):
            server.load("Callable")
        index = {e["name"]: e for e in server.repository_index()}
        assert index["NeedsFramework"]["state"] == "UNAVAILABLE"
        assert "a_framework_that_is_not_installed" in index["NeedsFramework"]["reason"]
        assert index["Callable"]["state"] == "UNAVAILABLE" and "broken at import" in index["Callable"]["reason"]


def test_the_stub_needs_numpy_below_2_and_the_error_says_what_to_install_where(
    tmp_path, monkeypatch, stub_python, python_backend_example
):
    """The test session's own environment has numpy 2: first on PATH, it is what the stub would
    run, and the load is refused with the command that fixes it (Triton 2.51's stub reads numpy 2
    arrays wrongly)."""
    import numpy

    venv = Path(sys.prefix)
    if int(numpy.__version__.split(".")[0]) < 2 or not (venv / "pyvenv.cfg").is_file():
        pytest.skip("this test session's Python is not a virtual environment with numpy 2")
    monkeypatch.setenv("PATH", f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    python_backend_example(tmp_path, "add_sub", "add_sub/model.py", "add_sub/config.pbtxt")
    server = Server(ServerConfig(model_repository=[str(tmp_path)], model_control_mode="explicit"))
    with server, pytest.raises(UnsupportedError) as caught:
        server.load("add_sub")
    message = str(caught.value)
    assert f"would run the virtual environment {venv}" in message and f"numpy {numpy.__version__}" in message
    assert f'Fix: {venv}/bin/pip install "numpy<2"' in message


def stubs_of(pid: int) -> list[int]:
    """Running python-backend stubs of the server process ``pid`` (by their shared-memory name)."""
    from embedtriton.triton.stubs import prefix, stubs_of

    return stubs_of(prefix(pid))


def test_start_returns_with_the_others_serving_and_no_stub_outlives_a_sigkill(
    tmp_path, stub_python, python_backend_example
):
    """A repository with one model that cannot load and two that can: the server starts in
    seconds and serves the two, the index says why the third failed, and after SIGKILL (its
    parent not even reaping it, which keeps the stubs' parent-alive check true) no stub and no
    shared memory of the server stays behind."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    python_model(
        tmp_path / "models",
        "broken",
        "import a_framework_that_is_not_installed\n\n\nclass TritonPythonModel:\n    pass\n",
        'backend: "python"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
    )
    python_backend_example(tmp_path / "models", "add_sub", "add_sub/model.py", "add_sub/config.pbtxt")
    python_model(
        tmp_path / "models",
        "Doubler",
        """
        import numpy as np
        from embedtriton import ModelConfig, Tensor, batch

        infer_func = batch(lambda x: {"y": x * 2})
        inputs = [Tensor(name="x", dtype=np.float32, shape=(1,))]
        outputs = [Tensor(name="y", dtype=np.float32, shape=(1,))]
        config = ModelConfig(max_batch_size=4)
        """,
        None,
    )
    log = tmp_path / "serve.log"
    env = {**os.environ, "PATH": f"{stub_python['bin']}{os.pathsep}{os.environ['PATH']}"}
    command = [sys.executable, "-m", "embedtriton", "serve", "--model-repository", str(tmp_path / "models")]
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*command, "--grpc", "127.0.0.1:0", "--metrics", ""], cwd=tmp_path, env=env, stdout=out, stderr=out
        )
    try:
        up = wait_for(lambda: " ready: " in log.read_text(errors="replace") or process.poll() is not None, 60, 0.1)
        assert up and process.poll() is None, log.read_text(errors="replace")
        text = log.read_text(errors="replace")
        assert "model 'broken' of the repository failed to load" in text and "a_framework_that_is_not" in text
        port = int(text.split("serving gRPC on 127.0.0.1:0 (port ")[1].split(")")[0])
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["broken"].state == "UNAVAILABLE" and "a_framework_that_is_not_installed" in index["broken"].reason
        assert index["add_sub"].state == "READY" and index["Doubler"].state == "READY"
        x = grpcclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[4.0]], dtype=np.float32))
        assert client.infer("Doubler", [x]).as_numpy("y")[0, 0] == 8.0
        a = grpcclient.InferInput("INPUT0", [4], "FP32")
        a.set_data_from_numpy(np.ones(4, dtype=np.float32))
        b = grpcclient.InferInput("INPUT1", [4], "FP32")
        b.set_data_from_numpy(np.ones(4, dtype=np.float32))
        assert client.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [2.0] * 4
        client.close()
        assert stubs_of(process.pid), "add_sub's stub should be running"
        process.send_signal(signal.SIGKILL)  # and not reaped until the end
        wait_for(lambda: not stubs_of(process.pid) and not shm_of(process.pid), every=0.1)  # (asserted below)
        assert stubs_of(process.pid) == [] and shm_of(process.pid) == []
    finally:
        process.kill()
        process.wait()


def shm_of(pid: int) -> list[str]:
    """The /dev/shm regions of the server process ``pid``'s stubs."""
    from embedtriton.triton.stubs import prefix, regions_of

    return regions_of(prefix(pid))


SLOW_TO_FINALIZE = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", np.ones(1, np.float32))]) for _ in requests]

    def finalize(self):
        time.sleep(2)
"""


def test_stop_unloads_the_repositories_models_together(tmp_path, stub_path):
    """As Triton's own stop does: three models that each take 2 s to finalize stop in about 2 s,
    not 6 (one by one, a repository of 11 python-backend models took 16 s to stop)."""
    config = 'backend: "python"\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    for name in ("SlowA", "SlowB", "SlowC"):
        python_model(tmp_path, name, SLOW_TO_FINALIZE, config)
    server = Server(ServerConfig(model_repository=[str(tmp_path)], model_control_mode="none"))
    server.start()
    try:
        assert server.model("SlowB").infer({})["y"].tolist() == [1.0]
    finally:
        started = time.monotonic()
        server.stop()
    took = time.monotonic() - started
    assert 2 <= took < 5, took
