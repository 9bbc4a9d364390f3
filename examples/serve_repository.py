"""Serve a Triton model repository next to a bound callable, then watch it change (POLL).

`examples/model_repository/` holds two versions of a Python callable model (`Adder/1`, `Adder/2`,
each a `model.py`), a model in Triton's own format (`Twice/config.pbtxt`, an ensemble that
runs Adder twice) and an ONNX model (`Doubler/1/model.onnx`, y = 2x, run by the onnxruntime
package: `pip install "embedtriton[onnx]"`). The script copies it to a temporary folder, serves it in POLL mode, then
adds a version 3 and edits it while a caller keeps calling: each change is picked up without a
restart and without a failed request.

    python examples/serve_repository.py
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from embedtriton import ModelConfig, Server, ServerConfig, Tensor, batch

HERE = Path(__file__).parent / "model_repository"
X = {"x": np.ones((1, 1), np.float32)}


def answer(server: Server, name: str = "Adder", version: int = -1) -> float:
    key, out = ("IN", "OUT") if name == "Twice" else ("x", "y")
    return float(server.model(name, version).infer({key: X["x"]})[out][0, 0])


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    repository = Path(tempfile.mkdtemp(prefix="repository-"))
    shutil.copytree(HERE, repository, dirs_exist_ok=True)
    server = Server(
        ServerConfig(model_repository=[str(repository)], model_control_mode="poll", repository_poll_secs=0.5)
    )
    server.bind(
        "Scale",
        batch(lambda x: {"y": x * 10}),
        [Tensor(name="x", dtype=np.float32, shape=(1,))],
        [Tensor(name="y", dtype=np.float32, shape=(1,))],
        ModelConfig(max_batch_size=8),
    )
    failures = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            try:
                answer(server)
            except Exception as exc:  # printed below: there should be none
                failures.append(exc)

    with server:
        print("models:", ", ".join(sorted(m.name for m in server.models())))
        served = {v: server.model("Adder", v).ready for v in server.versions("Adder")}
        print(f"Adder versions bound: {server.versions('Adder')}; served: {served}")
        print(
            f"Adder(1) = {answer(server)}  Twice(1) = {answer(server, 'Twice')}  "
            f"Doubler(1) = {answer(server, 'Doubler')}  Scale(1) = {answer(server, 'Scale')}"
        )
        thread = threading.Thread(target=caller)
        thread.start()
        try:
            version3 = repository / "Adder" / "3"
            version3.mkdir()
            (version3 / "model.py").write_text(
                (repository / "Adder" / "2" / "model.py").read_text().replace("x + 2", "x + 30")
            )
            wait_until(lambda: answer(server) == 31)
            print(f"a version 3 folder appeared: Adder(1) = {answer(server)}")
            (version3 / "model.py").write_text((version3 / "model.py").read_text().replace("x + 30", "x + 300"))
            wait_until(lambda: answer(server) == 301)
            print(f"its model.py was edited:     Adder(1) = {answer(server)}")
        finally:
            stop.set()
            thread.join()
        print(f"failed requests while the repository changed: {len(failures)}")
    shutil.rmtree(repository, ignore_errors=True)


if __name__ == "__main__":
    main()
