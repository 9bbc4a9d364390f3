"""embedtriton's network endpoints against standalone Triton serving the same Python model.

What a user would run instead of our endpoints is ``tritonserver`` itself, with the model in
its python backend. This script runs, one server at a time, in interleaved rounds:

- ``embedtriton``: a separate process serving AddSub (``@batch``, FP32 inputs ``a``, ``b`` of
  dims [-1], ``max_batch_size=8``, dynamic batcher, one instance) with ``serve_grpc`` and
  ``serve_http``;
- ``triton``: the ``tritonserver`` binary of the nvidia-pytriton wheel (Triton 2.51) with a
  generated model repository: the same AddSub as a python-backend ``model.py`` (the batch's
  rows joined, one numpy add and one sub, cut back per request), ``max_batch_size: 8``,
  ``dynamic_batching { }``, one KIND_CPU instance; metrics off;
- ``floor``: our transport floor, the embedtriton process with inference replaced by canned
  answers (gRPC: the request parsed by protobuf, then prebuilt reply bytes, as
  ``bench_grpc.py``'s floor; HTTP: the body parsed with ``json.loads``, then a prebuilt JSON
  body), i.e. what the transport, routing and parsing cost with no Triton and no model.

Each server is driven at concurrency 1 and 16 by ``perf_analyzer`` over gRPC (the binary of
the tritonclient 2.51 wheel, [1,16] inputs) and by ``wrk`` over HTTP with a KServe-v2 JSON body
(the same [1,16] inputs, keep-alive, one wrk thread). Before measuring, each server answers one
request per protocol whose outputs are checked; a wrk run with a non-2xx answer or a socket
error fails the benchmark. During every run the CPU time of the server's process tree
(Triton: ``tritonserver`` and its python-backend stub process) is read from /proc, and the
average batch size from the model's statistics (``inference_count / execution_count`` of
``/v2/models/AddSub/stats``, which both servers answer).

Prints req/s medians of ``--rounds`` with ours / Triton (target >= 1.5x) and ours / floor
(target >= 0.6x), then CPU use and batch sizes; writes benchmarks/results/vs_triton.json.

Needs:

- ``wrk`` for the HTTP columns (Debian/Ubuntu: ``sudo apt-get install -y wrk``); without it the
  gRPC columns still run and the HTTP ones print n/a;
- ``perf_analyzer``: ``pip install 'tritonclient[grpc,http]==2.51.0'`` (the last wheel that ships it;
  Debian: also ``apt-get install libb64-0d``), as ``nox -s bench-vs-triton`` does;
- for Triton's python backend, a Python of this one's minor version with numpy < 2 (the wheel's
  stub is built against numpy 1: with numpy 2 Triton's answers have wrong sizes, which the
  answer check catches). tritonclient 2.51 pins numpy < 2, so this Python does; elsewhere make
  one (``python3 -m venv /tmp/tritonpy && /tmp/tritonpy/bin/pip install 'numpy<2'``) and pass
  ``--stub-python /tmp/tritonpy/bin/python``.

    nox -s bench-vs-triton -- [--rounds 3] [--seconds 3]
    python benchmarks/bench_vs_triton.py [--rounds 3] [--seconds 3] [--stub-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from importlib.util import find_spec
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from bench_grpc import _answer_canned, free_port, measure, perf_analyzer_binary

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
N = 16  # elements per input; bench_grpc.measure sends [1,16] too
COLUMNS = (("grpc", 1), ("grpc", 16), ("http", 1), ("http", 16))
SERVERS = ("embedtriton", "triton", "floor")
A = np.arange(N, dtype=np.float32).reshape(1, N)
B = np.full((1, N), 0.5, np.float32)
ONES = np.ones((1, N), np.float32)  # what the floor's canned answers were computed from
TICK = os.sysconf("SC_CLK_TCK")
STARTUP_S = 120.0

CONFIG = """name: "AddSub"
backend: "python"
max_batch_size: 8
dynamic_batching { }
input [ { name: "a" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "b" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "add" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "sub" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

MODEL_PY = '''"""AddSub for Triton's python backend: the batch's rows joined, one add and one sub, cut back per request."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        a = [pb_utils.get_input_tensor_by_name(r, "a").as_numpy() for r in requests]
        b = [pb_utils.get_input_tensor_by_name(r, "b").as_numpy() for r in requests]
        if len(requests) == 1:
            pairs = [(a[0] + b[0], a[0] - b[0])]
        else:
            joined_a, joined_b = np.concatenate(a), np.concatenate(b)
            add, sub = joined_a + joined_b, joined_a - joined_b
            pairs, start = [], 0
            for x in a:
                pairs.append((add[start : start + len(x)], sub[start : start + len(x)]))
                start += len(x)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("add", s), pb_utils.Tensor("sub", d)]) for s, d in pairs]
'''


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def json_body(a: np.ndarray, b: np.ndarray) -> str:
    inputs = [
        {"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        for name, x in (("a", a), ("b", b))
    ]
    return json.dumps({"inputs": inputs})


# -- our server process ------------------------------------------------------------------------


def serve(mode: str, http_port: int, grpc_port: int) -> None:
    """The embedtriton process: AddSub on HTTP and gRPC until SIGTERM (``floor``: canned answers)."""
    from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor, batch

    @batch
    def add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
        return {"add": a + b, "sub": a - b}

    server = Server()
    server.bind(
        "AddSub",
        add_sub,
        [Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))],
        [Tensor(name="add", dtype=np.float32, shape=(-1,)), Tensor(name="sub", dtype=np.float32, shape=(-1,))],
        ModelConfig(max_batch_size=8, batcher=DynamicBatcher()),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        if mode == "floor":
            from embedtriton.frontends.grpc import infer, service
            from embedtriton.frontends.grpc import transport as codes

            _answer_canned(server, infer, service, codes)  # gRPC: bench_grpc.py's floor
            _answer_canned_http(server)
        server.serve_http(f"127.0.0.1:{http_port}")
        if mode == "floor":
            server.endpoint("http").use_c_path(False)  # (the C path would run the model)
        server.serve_grpc(f"127.0.0.1:{grpc_port}")
        print("ready", flush=True)
        stop.wait()


def _answer_canned_http(server: Any) -> None:
    """HTTP floor: an infer request's body is parsed, the answer is one prebuilt JSON body."""
    from embedtriton.frontends.http import endpoint, rest
    from embedtriton.frontends.http.answers import Text

    out = server.model("AddSub").infer({"a": ONES, "b": ONES})
    outputs = [
        {"name": name, "datatype": "FP32", "shape": list(out[name].shape), "data": out[name].ravel().tolist()}
        for name in ("add", "sub")
    ]
    canned = Text(
        "application/json", json.dumps({"model_name": "AddSub", "model_version": "1", "outputs": outputs}).encode()
    )

    async def infer_answer(self: Any, name: str, version: str, headers: Any, body: bytes, forwarded: Any) -> Any:
        json.loads(body)
        return 200, canned

    def infer_now(self: Any, call: Any, url: str, headers: Any, body: bytes, forwarded: Any) -> bool:
        json.loads(body)  # on the transport's IO thread, where the endpoint decodes /infer
        call.respond(200, [("Content-Type", canned.content_type)], [canned.body])
        return True

    rest.RestApi._infer_answer = infer_answer
    endpoint.RestEndpoint._infer_now = infer_now


# -- starting and stopping servers -------------------------------------------------------------


class Running:
    """One server process under test, with its ports; ``stop()`` ends it."""

    def __init__(self, name: str, proc: subprocess.Popen, http_port: int, grpc_port: int, log_path: Path | None):
        self.name, self.proc, self.http_port, self.grpc_port, self.log_path = name, proc, http_port, grpc_port, log_path

    def log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-3000:]

    def fail(self, what: str) -> NoReturn:
        self.stop()
        sys.exit(f"bench_vs_triton: {self.name} {what}\n{self.log_tail()}")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            self.fail(f"exited (status {self.proc.returncode}) during the run")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def start_ours(mode: str, work: Path) -> Running:
    http_port, grpc_port = free_port(), free_port()
    log_path = work / f"{mode}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", mode, "--http-port", str(http_port), "--grpc-port", str(grpc_port)],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    running = Running(mode, proc, http_port, grpc_port, log_path)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], STARTUP_S)
    line = proc.stdout.readline().strip() if ready else ""
    if line != "ready":
        running.fail(f"server did not start (said {line!r} within {STARTUP_S:.0f} s)")
    return running


def triton_install(stub_python: str, work: Path) -> tuple[Path, dict[str, str]]:
    """tritonserver and its python backend copied as PyTriton does (the stub for the stub
    Python's version into backends/python), and the environment it runs in."""
    spec = find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "bench_vs_triton: the nvidia-pytriton wheel is not installed (pip install --no-deps nvidia-pytriton==0.7.0)"
        )
    package = Path(list(spec.submodule_search_locations)[0])
    dist = package / "tritonserver"
    libs = dist / "external_libs" if (dist / "external_libs").exists() else package.parent / "nvidia_pytriton.libs"
    check = subprocess.run(
        [
            stub_python,
            "-c",
            "import sys, numpy; print(f'{sys.version_info[0]}.{sys.version_info[1]}', numpy.__version__)",
        ],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        sys.exit(f"bench_vs_triton: the stub Python {stub_python} cannot import numpy:\n{check.stderr}")
    py_version, numpy_version = check.stdout.split()
    if int(numpy_version.split(".")[0]) >= 2:
        sys.exit(
            f"bench_vs_triton: {stub_python} has numpy {numpy_version}; Triton 2.51's python backend stub needs "
            "numpy < 2 (with 2.x its answers have wrong sizes). Make one:\n"
            f"  python{py_version} -m venv /tmp/tritonpy && /tmp/tritonpy/bin/pip install 'numpy<2'\n"
            "and pass --stub-python /tmp/tritonpy/bin/python"
        )
    stub = dist / "python_backend_stubs" / py_version / "triton_python_backend_stub"
    if not stub.exists():
        sys.exit(f"bench_vs_triton: the wheel has no python backend stub for Python {py_version} ({stub})")
    target = work / "tritonserver"
    shutil.copytree(dist, target, ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"))
    shutil.copy(stub, target / "backends" / "python" / "triton_python_backend_stub")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libs}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(libs)
    env["PATH"] = f"{Path(stub_python).parent}:{env['PATH']}"  # the stub's embedded Python finds its prefix there
    repo = work / "repository" / "AddSub"
    (repo / "1").mkdir(parents=True)
    (repo / "config.pbtxt").write_text(CONFIG)
    (repo / "1" / "model.py").write_text(MODEL_PY)
    return target, env


def start_triton(install: Path, env: dict[str, str], work: Path) -> Running:
    http_port, grpc_port = free_port(), free_port()
    log_path = work / "triton.log"
    cmd = [
        str(install / "bin" / "tritonserver"), f"--model-repository={work / 'repository'}",
        f"--backend-directory={install / 'backends'}", f"--cache-directory={install / 'caches'}",
        "--http-address=127.0.0.1", f"--http-port={http_port}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}",
        "--allow-metrics=false", "--allow-gpu-metrics=false", "--exit-timeout-secs=10",
    ]  # fmt: skip
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    running = Running("triton", proc, http_port, grpc_port, log_path)
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            running.fail(f"tritonserver exited (status {proc.returncode}) while starting")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    return running
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    running.fail(f"tritonserver was not ready within {STARTUP_S:.0f} s")


# -- checks, counters ---------------------------------------------------------------------------


def get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        return json.loads(answer.read())


def check_answers(running: Running) -> dict[str, Any]:
    """One request on each protocol, outputs compared; the model's config as the server reports it."""
    import tritonclient.grpc as grpcclient

    a, b = (ONES, ONES) if running.name == "floor" else (A, B)
    request = urllib.request.Request(
        f"http://127.0.0.1:{running.http_port}/v2/models/AddSub/infer",
        data=json_body(a, b).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, body = answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        running.fail(f"answered HTTP {exc.code}: {exc.read()[:500]!r}")
    got = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in body["outputs"]}
    if status != 200 or not (np.array_equal(got["add"], a + b) and np.array_equal(got["sub"], a - b)):
        running.fail(f"answered HTTP {status} with wrong outputs: {body}")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    inputs = [grpcclient.InferInput(n, [1, N], "FP32") for n in ("a", "b")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    try:
        result = client.infer("AddSub", inputs)
    except Exception as exc:
        running.fail(f"failed a gRPC request: {exc}")
    if not (np.array_equal(result.as_numpy("add"), a + b) and np.array_equal(result.as_numpy("sub"), a - b)):
        running.fail("answered gRPC with wrong outputs")
    client.close()
    config = get_json(running.http_port, "/v2/models/AddSub/config")
    return {
        "max_batch_size": config.get("max_batch_size"),
        "dynamic_batching": "dynamic_batching" in config,
        "instances": sum(int(g.get("count", 1)) for g in config.get("instance_group", [])),
    }


def batch_counts(running: Running) -> tuple[int, int]:
    """(inference_count, execution_count) of AddSub, all versions."""
    stats = get_json(running.http_port, "/v2/models/AddSub/stats")["model_stats"]
    return sum(int(s.get("inference_count", 0)) for s in stats), sum(int(s.get("execution_count", 0)) for s in stats)


def tree_pids(pid: int) -> dict[int, str]:
    """pid -> command of a process and its descendants (Triton: tritonserver and its python stub)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            parents[int(entry)] = (
                int(text[text.rindex(")") + 2 :].split()[1]),
                text[text.index("(") + 1 : text.rindex(")")],
            )
    tree, frontier = {}, [pid]
    while frontier:
        p = frontier.pop()
        if p in parents:
            tree[p] = parents[p][1]
            frontier.extend(c for c, (ppid, _) in parents.items() if ppid == p)
    return tree


class CpuSampler:
    """The CPU time (utime + stime, all threads) of a server's process tree, read from /proc
    every ``period`` s while a load generator runs: % of one core over the whole run, and the
    median of the slices (what the server uses under load, without the load generator's
    start-up and its pauses between measurement windows); and the busiest threads over the
    whole run (one at ~100% while the total stays under 200%: a single thread bounds it)."""

    def __init__(self, pid: int, period: float = 0.5) -> None:
        self.pids = tree_pids(pid)
        self.period = period
        self.snaps: list[tuple[float, dict[int, float]]] = []
        self.threads: list[dict[int, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> dict[int, float]:
        used = {}
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                used[pid] = (int(fields[11]) + int(fields[12])) / TICK
            except OSError:
                pass
        return used

    def _read_threads(self) -> dict[int, float]:
        used = {}
        for pid in self.pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    used[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
                except OSError:
                    pass
        return used

    def _loop(self) -> None:
        while not self.done.wait(self.period):
            self.snaps.append((time.perf_counter(), self._read()))

    def __enter__(self) -> CpuSampler:
        self.threads.append(self._read_threads())
        self.snaps.append((time.perf_counter(), self._read()))
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        self.snaps.append((time.perf_counter(), self._read()))
        self.threads.append(self._read_threads())

    def _percent(self, first: int, last: int) -> dict[str, float]:
        (t0, a), (t1, b) = self.snaps[first], self.snaps[last]
        used: dict[str, float] = {}
        for pid, comm in self.pids.items():
            used[comm] = used.get(comm, 0.0) + 100 * (b.get(pid, 0.0) - a.get(pid, 0.0)) / (t1 - t0)
        return used

    def result(self) -> dict[str, Any]:
        whole = self._percent(0, len(self.snaps) - 1)
        slices = [self._percent(i, i + 1) for i in range(len(self.snaps) - 2)]  # (the last one is partial)
        wall = self.snaps[-1][0] - self.snaps[0][0]
        before, after = self.threads
        busiest = sorted((100 * (t - before.get(tid, 0.0)) / wall for tid, t in after.items()), reverse=True)
        return {
            "busiest_threads_pct": (busiest + [0.0, 0.0, 0.0])[:3],
            "mean_pct": whole,
            "slice_median_pct": {c: statistics.median(s[c] for s in slices) for c in whole} if slices else whole,
            "slice_median_total_pct": statistics.median(sum(s.values()) for s in slices)
            if slices
            else sum(whole.values()),
        }


# -- load generators ----------------------------------------------------------------------------


def wrk_script(work: Path) -> Path:
    path = work / "infer.lua"
    body = json_body(A, B).replace("]]", "] ]")
    path.write_text(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = [[{body}]]\n')
    return path


def wrk_measure(wrk: str, script: Path, port: int, concurrency: int, seconds: float) -> tuple[float, float]:
    """(req/s, p50 µs) of one wrk run; any non-2xx answer or socket error fails the benchmark."""
    cmd = [wrk, "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script),
           f"http://127.0.0.1:{port}/v2/models/AddSub/infer"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    out = run.stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)\b", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if run.returncode != 0 or not rate or not p50:
        raise RuntimeError(f"wrk failed:\n{out[-2000:]}\n{run.stderr[-2000:]}")
    if bad or (errors and any(int(x) for x in errors.groups())):
        raise RuntimeError(f"wrk got errors (not measuring errors as speed):\n{out}")
    scale = {"us": 1.0, "ms": 1e3, "s": 1e6}[p50.group(2)]
    return float(rate.group(1)), float(p50.group(1)) * scale


def pa_measure(tools: dict[str, Any], port: int, concurrency: int, seconds: float) -> tuple[float, float]:
    """bench_grpc's perf_analyzer run, tried up to three times when perf_analyzer finds no stable
    window (10 windows within ±50 %: a noisy neighbour); any other failure fails at once."""
    for attempt in range(3):
        try:
            return measure(tools["pa"], tools["pa_env"], port, concurrency, seconds)
        except RuntimeError as exc:
            if "Failed to obtain stable measurement" not in str(exc) or attempt == 2:
                raise
            log(f"    (perf_analyzer found no stable window at c{concurrency}; again)")
    raise AssertionError("unreachable")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- the benchmark ------------------------------------------------------------------------------


def session(running: Running, tools: dict[str, Any], seconds: float, samples: dict[str, list[dict]]) -> None:
    """All columns against one running server; one sample per column appended to ``samples``."""
    for protocol, concurrency in COLUMNS:
        if protocol == "http" and tools["wrk"] is None:
            continue
        before_counts, client_before = batch_counts(running), children_cpu()
        started = time.perf_counter()
        with CpuSampler(running.proc.pid) as sampler:
            if protocol == "grpc":
                rate, p50 = pa_measure(tools, running.grpc_port, concurrency, seconds)
            else:
                rate, p50 = wrk_measure(tools["wrk"], tools["script"], running.http_port, concurrency, seconds)
        client = 100 * (children_cpu() - client_before) / (time.perf_counter() - started)
        running.check_alive()
        cpu = sampler.result()
        after_counts = batch_counts(running)
        inferences, executions = after_counts[0] - before_counts[0], after_counts[1] - before_counts[1]
        avg_batch = inferences / executions if executions and running.name != "floor" else None
        sample = {
            "column": f"{protocol} c{concurrency}", "req_s": rate, "p50_us": p50,
            "server_cpu_pct": cpu["slice_median_total_pct"], "server_cpu_by_process_pct": cpu["slice_median_pct"],
            "server_cpu_mean_pct": sum(cpu["mean_pct"].values()),
            "busiest_threads_pct": cpu["busiest_threads_pct"], "client_cpu_pct": client, "avg_batch": avg_batch,
        }  # fmt: skip
        samples.setdefault(running.name, []).append(sample)
        batch_text = f"  batch {avg_batch:4.2f}" if avg_batch else ""
        log(f"    {running.name:11} {protocol:4} c{concurrency:<2}: {rate:8,.0f} req/s  p50 {p50:7,.0f} µs  "
            f"server CPU {sample['server_cpu_pct']:4.0f}% (mean {sample['server_cpu_mean_pct']:3.0f}%)  "
            f"load generator CPU {client:4.0f}%{batch_text}  busiest threads "
            f"{', '.join(f'{t:.0f}%' for t in sample['busiest_threads_pct'])}")  # fmt: skip


def median_of(samples: list[dict], column: str, key: str) -> Any:
    values = [s[key] for s in samples if s["column"] == column and s[key] is not None]
    if not values:
        return None
    if isinstance(values[0], dict):
        names = {n for v in values for n in v}
        return {n: statistics.median(v.get(n, 0.0) for v in values) for n in sorted(names)}
    if isinstance(values[0], list):
        return [statistics.median(v[i] for v in values) for i in range(len(values[0]))]
    return statistics.median(values)


def report(args: argparse.Namespace, samples: dict[str, list[dict]], meta: dict[str, Any]) -> None:
    columns = [f"{p} c{c}" for p, c in COLUMNS]
    med = {name: {col: median_of(samples.get(name, []), col, "req_s") for col in columns} for name in SERVERS}

    def cell(value: float | None) -> str:
        return "n/a" if value is None else f"{value:,.0f}"

    def ratio(a: float | None, b: float | None, target: float) -> str:
        if a is None or b is None:
            return "n/a"
        return f"{a / b:.2f}x {'met' if a / b >= target else 'NOT met'}"

    version = meta.get("triton_version", "?")
    heads = " | ".join(c.replace("grpc", "gRPC").replace("http", "HTTP") for c in columns)
    print(f"\nAddSub FP32 [1,{N}] x2, max batch 8, one instance; medians of {args.rounds} interleaved rounds, "
          f"{args.seconds:g} s windows; {os.cpu_count()} CPUs, 1-min load average {meta['load_average_before'][0]:.1f} "
          f"before, {meta['load_average_after'][0]:.1f} after (before the run: other work on this machine)\n")  # fmt: skip
    print(f"| req/s | {heads} |")
    print("|---" * (len(columns) + 1) + "|")
    print(f"| embedtriton | {' | '.join(cell(med['embedtriton'][c]) for c in columns)} |")
    print(f"| Triton {version} standalone, python backend | {' | '.join(cell(med['triton'][c]) for c in columns)} |")
    print(f"| embedtriton transport floor (canned answers) | {' | '.join(cell(med['floor'][c]) for c in columns)} |")
    print(f"| ours / Triton (target >= 1.5x) | "
          f"{' | '.join(ratio(med['embedtriton'][c], med['triton'][c], 1.5) for c in columns)} |")  # fmt: skip
    print(f"| ours / floor (target >= 0.6x) | "
          f"{' | '.join(ratio(med['embedtriton'][c], med['floor'][c], 0.6) for c in columns)} |")  # fmt: skip

    print("\np50 latency, µs (perf_analyzer / wrk)\n")
    print(f"| p50 µs | {heads} |")
    print("|---" * (len(columns) + 1) + "|")
    for name in SERVERS:
        print(f"| {name} | {' | '.join(cell(median_of(samples.get(name, []), c, 'p50_us')) for c in columns)} |")

    print("\nAt concurrency 16: CPU of the server's process tree in % of one core (200% = both cores; utime+stime "
          "from /proc, median of 0.5 s slices during the run, per process, and the mean over the whole run), "
          "its three busiest threads over the run, the load generator's (mean), and the average batch size "
          "(inference_count / execution_count)\n")  # fmt: skip
    print("| server, column | server CPU % (per process) | run mean | busiest threads % | load generator CPU % "
          "| avg batch |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name in SERVERS:
        for col in (c for c in columns if c.endswith("c16")):
            total = median_of(samples.get(name, []), col, "server_cpu_pct")
            if total is None:
                continue
            by_process = median_of(samples[name], col, "server_cpu_by_process_pct")
            parts = ", ".join(f"{n} {v:.0f}" for n, v in by_process.items())
            mean = median_of(samples[name], col, "server_cpu_mean_pct")
            threads = ", ".join(f"{t:.0f}" for t in median_of(samples[name], col, "busiest_threads_pct"))
            client = median_of(samples[name], col, "client_cpu_pct")
            avg = median_of(samples[name], col, "avg_batch")
            print(f"| {name}, {col} | {total:.0f} ({parts}) | {mean:.0f} | {threads} | {client:.0f} | "
                  f"{'n/a' if avg is None else f'{avg:.2f}'} |")  # fmt: skip

    RESULTS.mkdir(exist_ok=True)
    out = {
        "settings": {"rounds": args.rounds, "seconds": args.seconds, "elements": N, "cpus": os.cpu_count()},
        "meta": meta,
        "medians_req_s": med,
        "ratios": {
            "ours_over_triton": {c: (med["embedtriton"][c] / med["triton"][c]) if med["embedtriton"][c] and med["triton"][c] else None for c in columns},
            "ours_over_floor": {c: (med["embedtriton"][c] / med["floor"][c]) if med["embedtriton"][c] and med["floor"][c] else None for c in columns},
        },
        "samples": samples,
    }  # fmt: skip
    (RESULTS / "vs_triton.json").write_text(json.dumps(out, indent=1, ensure_ascii=False))
    log(f"written: {RESULTS / 'vs_triton.json'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="each measurement window (wrk: whole seconds)")
    parser.add_argument("--stub-python", default=sys.executable,
                        help="a Python with numpy < 2 for Triton's python backend stub (default: this one)")  # fmt: skip
    parser.add_argument("--serve", choices=["embedtriton", "floor"], help=argparse.SUPPRESS)
    parser.add_argument("--http-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--grpc-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.http_port, args.grpc_port)
        return
    work = Path(tempfile.mkdtemp(prefix="embedtriton-vs-triton-"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    pa, pa_env = perf_analyzer_binary()
    wrk = shutil.which("wrk")
    if wrk is None:
        log("bench_vs_triton: wrk is not installed, so the HTTP columns are skipped "
            "(Debian/Ubuntu: sudo apt-get install -y wrk)")  # fmt: skip
    tools = {"pa": pa, "pa_env": pa_env, "wrk": wrk, "script": wrk_script(work)}
    install, triton_env = triton_install(args.stub_python, work)
    samples: dict[str, list[dict]] = {}
    meta: dict[str, Any] = {"load_average_before": os.getloadavg()}
    for r in range(args.rounds):
        order = SERVERS[r % len(SERVERS) :] + SERVERS[: r % len(SERVERS)]
        log(f"round {r + 1}/{args.rounds}: {', '.join(order)}")
        for name in order:
            running = start_triton(install, triton_env, work) if name == "triton" else start_ours(name, work)
            try:
                meta.setdefault("configs", {})[name] = check_answers(running)
                if name == "triton":
                    meta["triton_version"] = get_json(running.http_port, "/v2").get("version")
                if wrk is not None:  # a second of warm-up on fresh connections, not measured
                    wrk_measure(wrk, tools["script"], running.http_port, 16, 1)
                session(running, tools, args.seconds, samples)
            finally:
                running.stop()
    meta["load_average_after"] = os.getloadavg()
    log(f"model configs as served: {meta['configs']}")
    report(args, samples, meta)


if __name__ == "__main__":
    main()
