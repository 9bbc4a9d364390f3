"""Triton model repositories served next to bound callables: Python callables in version
folders, Triton's own models (an ensemble's config.pbtxt), and the control modes NONE, EXPLICIT
and POLL."""

from __future__ import annotations

import logging
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import (
    InvalidArgumentError,
    ModelConfig,
    NotFoundError,
    Server,
    ServerConfig,
    Tensor,
    UnavailableError,
    batch,
)

ONE = {"x": np.ones((1, 1), np.float32)}


def model_py(folder: Path, add: float, extra: str = "") -> None:
    """A callable model version: y = x + add."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(
        textwrap.dedent(
            f"""
            import numpy as np
            from embedtriton import ModelConfig, Tensor, batch
            {extra}
            @batch
            def infer_func(x):
                return {{"y": x + {add}}}

            inputs = [Tensor(name="x", dtype=np.float32, shape=(1,))]
            outputs = [Tensor(name="y", dtype=np.float32, shape=(1,))]
            config = ModelConfig(max_batch_size=8)
            """
        )
    )


ENSEMBLE = """
name: "Twice"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "Adder" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "mid" } },
    { model_name: "Adder" model_version: -1 input_map { key: "x" value: "mid" } output_map { key: "y" value: "OUT" } }
  ]
}
"""


@pytest.fixture
def repository(tmp_path):
    model_py(tmp_path / "Adder" / "1", 1)
    model_py(tmp_path / "Adder" / "2", 2)
    (tmp_path / "Twice" / "1").mkdir(parents=True)
    (tmp_path / "Twice" / "config.pbtxt").write_text(ENSEMBLE)
    (tmp_path / "notes").mkdir()  # not a model: ignored
    return tmp_path


def y(server: Server, name: str, version: int = -1, key: str = "x", out: str = "y") -> float:
    return float(server.model(name, version).infer({key: ONE["x"]})[out][0, 0])


def test_none_loads_every_model_at_start_next_to_bound_callables(repository):
    server = Server(ServerConfig(model_repository=[str(repository)], model_control_mode="none"))
    server.bind("Bound", batch(lambda x: {"y": x * 10}), [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))], ModelConfig(max_batch_size=8))  # fmt: skip
    with server:
        assert y(server, "Adder") == 3 and y(server, "Adder", 2) == 3  # latest(1): version 2
        assert y(server, "Twice", key="IN", out="OUT") == 5  # Triton's own model (an ensemble config.pbtxt)
        assert y(server, "Bound") == 10
        assert server.versions("Adder") == [1, 2]
        assert {m.name for m in server.models()} == {"Bound", "Adder", "Twice"}
        with pytest.raises(UnavailableError, match="explicit model load / unload is not allowed if polling is enabled"):
            server.unload("Adder")


def test_explicit_loads_and_unloads_on_request_also_over_grpc(repository):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    server = Server(ServerConfig(model_repository=[str(repository)], model_control_mode="explicit"))
    with server:
        with pytest.raises(NotFoundError):
            server.model("Adder")  # nothing is loaded at start
        server.load("Adder")
        assert y(server, "Adder") == 3
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.serve_grpc('127.0.0.1:0')}")
        client.load_model("Twice")  # RepositoryModelLoad of a repository model
        assert client.is_model_ready("Twice")
        index = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
        assert index[("Adder", "2")] == "READY" and index[("Adder", "1")] == "UNAVAILABLE"
        client.unload_model("Twice")
        server.unload("Adder")
        assert not client.is_model_ready("Adder")
        with pytest.raises(
            InferenceServerException, match="failed to load 'Nope', failed to poll from model repository"
        ):
            client.load_model("Nope")


def test_a_broken_model_py_names_its_file_and_line_and_the_old_version_keeps_serving(repository, caplog):
    server = Server(ServerConfig(model_repository=[str(repository)], model_control_mode="explicit"))
    with server:
        server.load("Adder")
        source = repository / "Adder" / "2" / "model.py"
        good = source.read_text()
        source.write_text(good.replace("return {", "return {{"))  # a syntax error
        with pytest.raises(InvalidArgumentError, match=rf"{source}:\d+: SyntaxError"):
            server.load("Adder")
        assert y(server, "Adder") == 3  # the loaded version still serves
        source.write_text("import numpy as np\nraise RuntimeError('no weights')\n")
        with pytest.raises(InvalidArgumentError, match=rf"{source}:2: importing it raised RuntimeError: no weights"):
            server.load("Adder")
        source.write_text("import numpy as np\n")
        with pytest.raises(InvalidArgumentError, match="defines no infer_func, inputs, outputs"):
            server.load("Adder")
        assert y(server, "Adder") == 3


def test_poll_picks_up_versions_edits_and_removals_without_dropping_requests(repository, caplog):
    server = Server(
        ServerConfig(model_repository=[str(repository)], model_control_mode="poll", repository_poll_secs=0.2)
    )
    errors: list[BaseException] = []
    answers: list[float] = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            try:
                answers.append(y(server, "Adder"))
            except BaseException as exc:  # noqa: BLE001 - counted
                errors.append(exc)

    def serves(value: float) -> None:
        assert wait_for(lambda: answers and answers[-1] == value, every=0.05), (answers[-1:], value)

    with server:
        assert y(server, "Adder") == 3
        threads = [threading.Thread(target=caller) for _ in range(8)]
        for thread in threads:
            thread.start()
        try:
            model_py(repository / "Adder" / "3", 30)  # a new version
            serves(31)
            model_py(repository / "Adder" / "3", 300)  # an edited model.py
            serves(301)
            with caplog.at_level(logging.ERROR, logger="embedtriton"):
                (repository / "Adder" / "3" / "model.py").write_text("def broken(:\n")
                logged = wait_for(lambda: any("SyntaxError" in r.getMessage() for r in caplog.records))
            assert logged, [r.getMessage() for r in caplog.records]
            count = len(answers)
            assert wait_for(lambda: len(answers) > count), "no answer since"
            assert answers[-1] == 301  # what served still serves
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
        assert errors == []
        import shutil

        shutil.rmtree(repository / "Twice")  # a removed model is unloaded
        assert wait_for(lambda: "Twice" not in {m.name for m in server.models()}, every=0.05), server.models()


def test_repository_settings_are_checked(tmp_path):
    with pytest.raises(InvalidArgumentError, match="model_control_mode must be"):
        ServerConfig(model_control_mode="auto").validate()
    with pytest.raises(InvalidArgumentError, match="repository_poll_secs must be > 0"):
        ServerConfig(repository_poll_secs=0).validate()
    with pytest.raises(NotFoundError, match="is not a folder"):
        Server(ServerConfig(model_repository=[str(tmp_path / "missing")], model_control_mode="none")).start()


def test_a_config_pbtxt_beside_model_py_overrides_its_config(tmp_path):
    model_py(tmp_path / "Tuned" / "1", 5)
    (tmp_path / "Tuned" / "config.pbtxt").write_text(
        "max_batch_size: 2\ndynamic_batching { max_queue_delay_microseconds: 100 }\n"
    )
    server = Server(ServerConfig(model_repository=[str(tmp_path)], model_control_mode="none"))
    with server:
        config = server.model("Tuned").config()
        assert config["max_batch_size"] == 2 and config["dynamic_batching"]["max_queue_delay_microseconds"] == 100
        assert y(server, "Tuned") == 6
    (tmp_path / "Tuned" / "config.pbtxt").write_text("max_batch_size: two\n")
    explicit = Server(ServerConfig(model_repository=[str(tmp_path)], model_control_mode="explicit"))
    with explicit, pytest.raises(InvalidArgumentError, match=r"config.pbtxt: .*max_batch_size"):
        explicit.load("Tuned")


PYTHON_BACKEND_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 3)]))
        return responses
"""


def test_a_python_backend_model_from_a_repository(tmp_path, stub_python, monkeypatch):
    """Triton's python backend runs a repository model, its stub a process of its own (on the
    stub environment, numpy<2, first on PATH); its shared memory is named per server."""
    import os

    monkeypatch.setenv("PATH", f"{stub_python['bin']}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "Triple" / "1").mkdir(parents=True)
    (tmp_path / "Triple" / "1" / "model.py").write_text(PYTHON_BACKEND_MODEL)
    (tmp_path / "Triple" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    server = Server(ServerConfig(model_repository=[str(tmp_path)], model_control_mode="explicit"))
    with server:
        server.load("Triple")
        assert y(server, "Triple") == 3
        # its shared memory is named per server (the backend's default prefix is the same for
        # every process on the host: two servers' stubs would read each other's tensors)
        assert any(name.startswith(f"embedtriton_{os.getpid()}_") for name in os.listdir("/dev/shm"))
