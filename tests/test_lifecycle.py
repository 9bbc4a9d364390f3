"""stop() with requests in flight: every caller gets a result or an error, nothing hangs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import numpy as np
from conftest import add_sub_tensors

from embedtriton import ModelConfig, Server, TritonError, batch

ONE = np.ones((1, 1), np.float32)


def slow_server(delay: float) -> Server:
    @batch
    def slow(a, b):
        time.sleep(delay)
        return {"add": a + b, "sub": a - b}

    srv = Server()
    inputs, outputs = add_sub_tensors()
    srv.bind("Slow", slow, inputs, outputs, ModelConfig(max_batch_size=2))
    return srv


def test_stop_with_requests_in_flight_leaves_nobody_waiting():
    srv = slow_server(0.02).start()
    model = srv.model("Slow")
    outcomes: list[str] = []
    lock = threading.Lock()

    def caller():
        for _ in range(20):
            try:
                out = model.infer({"a": ONE, "b": ONE})
                assert out["add"][0, 0] == 2
                result = "ok"
            except TritonError:
                result = "error"
            with lock:
                outcomes.append(result)

    async def async_callers():
        calls = [model.infer_async({"a": ONE, "b": ONE}) for _ in range(30)]
        return await asyncio.gather(*calls, return_exceptions=True)

    async_results: list = []
    threads = [threading.Thread(target=caller) for _ in range(8)]
    threads.append(threading.Thread(target=lambda: async_results.extend(asyncio.run(async_callers()))))
    for t in threads:
        t.start()
    time.sleep(0.15)
    started = time.monotonic()
    srv.stop()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a caller is still waiting after stop()"
    assert time.monotonic() - started < 30
    assert len(outcomes) == 8 * 20
    assert "ok" in outcomes and "error" in outcomes  # some finished, the rest were refused
    assert len(async_results) == 30
    assert all(isinstance(r, (dict, TritonError)) for r in async_results)


def test_process_exits_cleanly_with_a_running_server(tmp_path):
    script = """
import numpy as np
from embedtriton import Server, Tensor, batch
srv = Server()
srv.bind("Id", batch(lambda x: {"y": x}), [Tensor(name="x", dtype=np.float32, shape=(1,))],
         [Tensor(name="y", dtype=np.float32, shape=(1,))])
srv.start()
print(srv.model("Id").infer({"x": np.ones((1, 1), np.float32)})["y"][0, 0])
# no stop(): the atexit hook stops it
"""
    # cwd elsewhere: `python -c` puts the working folder first on sys.path
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0"
