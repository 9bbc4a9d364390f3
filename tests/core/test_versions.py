"""Model versions: several callables bound under one name, served by Triton's version policy,
and a hot swap to a new version under load without a dropped request."""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import InvalidArgumentError, ModelConfig, NotFoundError, Server, Tensor, VersionPolicy, batch

F32 = np.float32
X, Y = [Tensor(name="x", dtype=F32, shape=(1,))], [Tensor(name="y", dtype=F32, shape=(1,))]
ONE = {"x": np.ones((1, 1), F32)}


def answers(value: float):
    @batch
    def constant(x):
        time.sleep(0.0002)
        return {"y": np.full_like(x, value)}

    return constant


def test_a_new_version_takes_over_by_default_and_the_old_one_returns_when_it_goes():
    server = Server()
    server.bind("M", answers(1), X, Y, ModelConfig(max_batch_size=8))
    with server:
        assert server.model("M").infer(ONE)["y"][0, 0] == 1
        with pytest.raises(
            InvalidArgumentError, match=r"already bound; .*bind another version with version=N \(bound: \[1\]\)"
        ):
            server.bind("M", answers(9), X, Y)
        v2 = server.bind("M", answers(2), X, Y, ModelConfig(max_batch_size=8), version=2)
        assert v2.version == 2 and v2.infer(ONE)["y"][0, 0] == 2
        assert server.model("M").infer(ONE)["y"][0, 0] == 2  # latest(1): Triton serves version 2
        assert not server.model("M", 1).ready and server.versions("M") == [1, 2]
        assert server.model("M").metadata()["versions"] == ["2"]
        with pytest.raises(InvalidArgumentError, match="version 2 of model 'M' is already bound"):
            server.bind("M", answers(3), X, Y, version=2)
        server.unbind("M", version=2)
        assert server.model("M").infer(ONE)["y"][0, 0] == 1  # version 1 serves again
        with pytest.raises(NotFoundError, match=r"version 2 of model 'M' is not bound \(bound: \[1\]\)"):
            server.unbind("M", version=2)


def test_every_version_served_with_its_own_statistics():
    server = Server()
    every = ModelConfig(max_batch_size=8, version_policy=VersionPolicy.all())
    server.bind("M", answers(1), X, Y, every)
    server.bind("M", answers(2), X, Y, every, version=2)
    server.bind("M", answers(3), X, Y, every, version=3)
    with server:
        assert [server.model("M", v).infer(ONE)["y"][0, 0] for v in (1, 2, 3)] == [1, 2, 3]
        assert server.model("M").infer(ONE)["y"][0, 0] == 3  # unversioned: the highest
        assert sorted(server.model("M").metadata()["versions"]) == ["1", "2", "3"]
        server.model("M", 2).infer(ONE)
        assert server.model("M", 2).statistics()["inference_count"] == 2
        assert server.model("M", 1).statistics()["inference_count"] == 1
        wider = [Tensor(name="x", dtype=F32, shape=(2,))]
        with pytest.raises(
            InvalidArgumentError, match=r"versions 1 and 4 may be served together .* declare different tensors"
        ):
            server.bind("M", answers(4), wider, Y, every, version=4)
        assert server.versions("M") == [1, 2, 3]  # the refused version is not kept
        server.unbind("M")
        assert "M" not in [m.name for m in server.models()]


def test_specific_versions():
    server = Server()
    some = ModelConfig(max_batch_size=8, version_policy=VersionPolicy.specific(1, 3))
    for v in (1, 2, 3):
        server.bind("M", answers(v), X, Y, some, version=v)
    with server:
        assert [server.model("M", v).ready for v in (1, 2, 3)] == [True, False, True]
    with pytest.raises(InvalidArgumentError, match="VersionPolicy.specific"):
        VersionPolicy.specific()


def under_load(server: Server, swap) -> tuple[Counter, list[BaseException], int]:
    """64 callers loop on server.model("M").infer; `swap()` runs meanwhile. (answers per value,
    errors, answers before the swap)"""
    counts: Counter[float] = Counter()
    errors: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def caller() -> None:
        model = server.model("M")
        while not stop.is_set():
            try:
                value = float(model.infer(ONE)["y"][0, 0])
            except BaseException as exc:  # noqa: BLE001 - counted
                errors.append(exc)
                continue
            with lock:
                counts[value] += 1

    def answered() -> int:
        with lock:
            return sum(counts.values())

    threads = [threading.Thread(target=caller) for _ in range(64)]
    for thread in threads:
        thread.start()
    loaded = wait_for(lambda: answered() >= 64)  # under load (asserted once the callers are stopped)
    before_swap = answered()
    swap()
    after_swap = answered()
    # 128 answers after the swap: at most 64 of them (one a caller) were asked before it
    loaded_after = wait_for(lambda: answered() >= after_swap + 2 * 64)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert loaded and loaded_after, (before_swap, after_swap, counts, errors[:3])
    return counts, errors, before_swap


def test_hot_swap_under_load_drops_no_request():
    """Binding version 2 under load: traffic moves to v2, requests already on v1 finish there,
    nobody sees an error, v1 unloads."""
    server = Server()
    server.bind("M", answers(1), X, Y, ModelConfig(max_batch_size=16))
    with server:
        swap = lambda: server.bind("M", answers(2), X, Y, ModelConfig(max_batch_size=16), version=2)  # noqa: E731
        counts, errors, before_swap = under_load(server, swap)
        assert errors == []
        assert before_swap > 0 and counts[1] >= before_swap and counts[2] > 0
        assert set(counts) == {1.0, 2.0}
        assert not server.model("M", 1).ready and server.model("M").infer(ONE)["y"][0, 0] == 2


def test_a_live_config_override_under_load_drops_no_request():
    """server.load(name, config=...) (what RepositoryModelLoad with a config does) under load."""
    from embedtriton import DynamicBatcher

    server = Server()
    server.bind("M", answers(1), X, Y, ModelConfig(max_batch_size=16))
    with server:
        bigger = ModelConfig(max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=200))
        counts, errors, before_swap = under_load(server, lambda: server.load("M", config=bigger))
        assert errors == [] and before_swap > 0 and counts[1] > before_swap
        assert server.model("M").config()["max_batch_size"] == 32


def test_repository_index_lists_each_version_over_grpc():
    grpcclient = pytest.importorskip("tritonclient.grpc")
    server = Server()
    server.bind("M", answers(1), X, Y, ModelConfig(max_batch_size=8))
    server.bind("M", answers(2), X, Y, ModelConfig(max_batch_size=8), version=2)
    with server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.serve_grpc('127.0.0.1:0')}")
        index = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
        assert index == {("M", "1"): "UNAVAILABLE", ("M", "2"): "READY"}
        inp = grpcclient.InferInput("x", [1, 1], "FP32")
        inp.set_data_from_numpy(ONE["x"])
        assert client.infer("M", [inp], model_version="2").as_numpy("y")[0, 0] == 2
        assert client.infer("M", [inp]).as_numpy("y")[0, 0] == 2
        assert not client.is_model_ready("M", "1") and client.is_model_ready("M", "2")


def test_stop_right_after_a_reload_with_another_config_waits_for_the_old_copy(tmp_path):
    """server.load(name, config) replaces the binding; Triton finalizes the old copy once its last
    requests are deleted. stop() right after used to wait only for the new one, then delete Triton
    under the old: a 30 s hang and heap corruption (found by the tuner). In a child process, so a
    crash fails this test instead of the suite."""
    import subprocess
    import sys

    script = tmp_path / "reload_then_stop.py"
    script.write_text(
        "import dataclasses, time\n"
        "import numpy as np\n"
        "from embedtriton import InstanceGroup, ModelConfig, Server, Tensor, batch\n"
        "server = Server()\n"
        "x = [Tensor(name='x', dtype=np.float32, shape=(4,))]\n"
        "server.bind('M', batch(lambda x: {'y': x * 2}), x, [Tensor(name='y', dtype=np.float32, shape=(4,))],\n"
        "            ModelConfig(max_batch_size=1))\n"
        "with server:\n"
        "    base = server.binding('M').config\n"
        "    for _ in range(64):\n"
        "        server.model('M').infer({'x': np.ones((1, 4), np.float32)})\n"
        "    server.load('M', dataclasses.replace(base, max_batch_size=8, instance_group=[InstanceGroup(count=2)]))\n"
        "    started = time.monotonic()\n"
        "print(f'stopped in {time.monotonic() - started:.2f} s')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split("stopped in ")[1].split(" s")[0]) < 5, done.stdout
