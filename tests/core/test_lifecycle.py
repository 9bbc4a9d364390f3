"""stop() with requests in flight: every caller gets a result or an error, nothing hangs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import ModelConfig, Server, ServerConfig, TritonError, UnavailableError, _native, batch

ONE = np.ones((1, 1), np.float32)


@pytest.fixture
def slow_server(add_sub_tensors):
    """``slow_server(delay)``: a Server (not started) with model "Slow", AddSub taking ``delay`` s a batch."""

    def make(delay: float) -> Server:
        @batch
        def slow(a, b):
            time.sleep(delay)
            return {"add": a + b, "sub": a - b}

        srv = Server()
        inputs, outputs = add_sub_tensors
        srv.bind("Slow", slow, inputs, outputs, ModelConfig(max_batch_size=2))
        return srv

    return make


def test_stop_with_requests_in_flight_leaves_nobody_waiting(slow_server):
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
    some_done = wait_for(lambda: "ok" in outcomes)  # (asserted after stop(), which ends the callers)
    started = time.monotonic()
    srv.stop()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a caller is still waiting after stop()"
    assert some_done, "no request finished before stop()"
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


# -- stop() drains within exit_timeout_secs ----------------------------------------------


def test_stop_honours_exit_timeout_secs(add_sub, add_sub_tensors):
    """A 3 s model with 64 requests in flight and exit_timeout_secs=1: stop() takes about a
    second (not a batch after batch, not 60 s per model); every caller gets an answer."""
    srv = Server(ServerConfig(exit_timeout_secs=1))
    inputs, outputs = add_sub_tensors

    @batch
    def slow(a, b):
        time.sleep(3)
        return {"add": a + b, "sub": a - b}

    srv.bind("Slow", slow, inputs, outputs, ModelConfig(max_batch_size=4))
    srv.bind("Fast", add_sub, inputs, outputs, ModelConfig(max_batch_size=4))
    srv.start()
    outcomes: list[object] = []
    lock = threading.Lock()

    def caller():
        try:
            result: object = srv.model("Slow").infer({"a": ONE, "b": ONE})
        except TritonError as exc:
            result = exc
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=caller) for _ in range(64)]
    for t in threads:
        t.start()
    handle = srv._handle
    all_in = wait_for(lambda: _native.pending(handle)[0] == 64)  # (asserted after stop(), which ends the callers)
    in_flight = _native.pending(handle)[0]
    started = time.monotonic()
    srv.stop()
    elapsed = time.monotonic() - started
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "a caller is still waiting"
    assert all_in, f"{in_flight} of 64 requests in flight before stop()"
    assert elapsed < 2.0, f"stop() took {elapsed:.1f} s with exit_timeout_secs=1"
    assert len(outcomes) == 64
    errors = [o for o in outcomes if isinstance(o, UnavailableError)]
    assert len(errors) == 64 and "stopped before this request completed" in str(errors[0])
    # the process goes on: a new server works while the old callable finishes its batch
    with Server() as again:
        again.bind("Fast", add_sub, inputs, outputs)
        assert again.model("Fast").infer({"a": ONE, "b": ONE})["add"][0, 0] == 2
    # the abandoned batch returns on Triton's thread, which lets go of its requests: nothing crashes. (The
    # stopped server itself is deleted only once no other runs in the process, which other tests' servers may.)
    assert wait_for(lambda: _native.pending(handle)[1] == 0), (
        f"the abandoned batch never returned: {_native.pending(handle)}"
    )


def test_stop_lets_requests_in_flight_finish(slow_server):
    srv = slow_server(0.5).start()
    model = srv.model("Slow")
    results: list[object] = []

    def caller():
        try:
            results.append(model.infer({"a": ONE, "b": ONE})["add"][0, 0])
        except TritonError as exc:
            results.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    handle = srv._handle
    assert wait_for(lambda: _native.pending(handle)[0] == 4), f"{_native.pending(handle)[0]} of 4 requests in flight"
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    assert wait_for(lambda: srv.stopping), "stop() did not begin"
    assert srv._stopping and not srv.ready
    with pytest.raises(UnavailableError, match="stopping"):  # new requests are refused at once
        model.infer({"a": ONE, "b": ONE})
    stopper.join(timeout=30)
    for t in threads:
        t.join(timeout=10)
    assert results == [2.0] * 4  # all finished normally (two batches of 0.5 s)


def test_overlapping_servers_stop_in_any_order(tmp_path):
    """Deleting a Triton server resets process-wide memory managers: a second server that
    still runs must keep working (here: a sequence model, whose control tensors Triton
    allocates through the pinned-memory manager)."""
    script = """
import numpy as np
from embedtriton import ModelConfig, SequenceBatcher, Server, Tensor, batch

def bind_sequence(server):
    def total(requests):
        out = []
        for r in requests:
            r.state["sum"] = r.state.get("sum", 0) + int(r["x"][0, 0])
            out.append({"y": np.array([[r.state["sum"]]], np.int64)})
        return out
    server.bind("Sum", total, [Tensor(name="x", dtype=np.int64, shape=(1,))],
                [Tensor(name="y", dtype=np.int64, shape=(1,))],
                ModelConfig(max_batch_size=2, sequence_batcher=SequenceBatcher()))

a, b = Server(), Server()
a.start()
b.start()
b.stop()  # b goes first while a runs
bind_sequence(a)
model = a.model("Sum")
got = [int(model.infer({"x": np.array([[v]], np.int64)}, correlation_id=7, sequence_start=(i == 0),
                       sequence_end=(i == 2))["y"][0, 0]) for i, v in enumerate([1, 2, 3])]
a.stop()
c = Server()  # servers one after another keep working
bind_sequence(c)
with c:
    again = int(c.model("Sum").infer({"x": np.array([[5]], np.int64)}, correlation_id=1, sequence_start=True,
                                     sequence_end=True)["y"][0, 0])
print(got, again)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[1, 3, 6] 5"


CTRL_C = """
import signal, sys, threading, time
import numpy as np
from embedtriton import ModelConfig, Server, Tensor, TritonError
runs = []
running = threading.Event()
def slow(requests):
    runs.append(len(requests))
    running.set()
    time.sleep(1.5 if len(runs) == 1 else 0)  # the first run holds the model; the barrier's (below) does not
    return [{"y": r["x"]} for r in requests]
srv = Server()
srv.bind("Slow", slow, [Tensor(name="x", dtype=np.float32, shape=(1,))], [Tensor(name="y", dtype=np.float32, shape=(1,))],
         ModelConfig(max_batch_size=1))
srv.start()
x = np.ones((1, 1), np.float32)
busy = threading.Thread(target=lambda: srv.model("Slow").infer({"x": x}))
busy.start()
assert running.wait(30)  # the model runs the first request; ours waits in Triton's queue
threading.Timer(0.3, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)).start()
started = time.monotonic()
try:
    srv.model("Slow").%s
    print("no interrupt")
except KeyboardInterrupt:
    print("interrupted after %%.2f s" %% (time.monotonic() - started))
busy.join()
srv.model("Slow").infer({"x": x})  # a barrier: queued after the interrupted request, which would have run first
print("runs", runs)
srv.stop()
"""


@pytest.mark.parametrize(
    "call",
    ["infer({'x': x})", "stream({'x': x}).__next__()", "infer_many([{'x': x}] * 3)"],
    ids=["infer", "stream", "infer_many"],
)
def test_ctrl_c_interrupts_a_blocking_call_and_cancels_it(tmp_path, call):
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C % call], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert lines[0].startswith("interrupted after"), done.stdout
    assert float(lines[0].split()[2]) < 0.6  # promptly, not when the model is done with it
    assert lines[1] == "runs [1, 1]"  # the interrupted request never ran (only the barrier did): it was cancelled


def test_process_exits_promptly_after_stop(tmp_path):
    """Triton's CPU-metrics thread sleeps half the metrics interval and the process waits for
    it at exit (~1 s with Triton's default)."""
    script = """
import time
import numpy as np
from embedtriton import Server, Tensor, batch
srv = Server()
srv.bind("Id", batch(lambda x: {"y": x}), [Tensor(name="x", dtype=np.float32, shape=(1,))],
         [Tensor(name="y", dtype=np.float32, shape=(1,))])
with srv:
    srv.model("Id").infer({"x": np.ones((1, 1), np.float32)})
print(repr(time.time()), flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    ended = time.time()
    assert done.returncode == 0, done.stderr
    assert ended - float(done.stdout) < 0.5, f"the process took {ended - float(done.stdout):.2f} s to exit"
