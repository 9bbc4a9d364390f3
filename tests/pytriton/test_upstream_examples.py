"""PyTriton 0.7.0's own numpy examples, run as their READMEs say with only the imports changed.

The example files (``upstream_examples/``, byte for byte PyTriton's; see its README) are copied
into a temporary folder, where their ``pytriton.`` imports become ``embedtriton.pytriton.``.
Each server script runs as a subprocess, then the example's own client runs against it twice:
rewritten the same way, and unchanged (PyTriton's client from the nvidia-pytriton wheel). The
assertions are on what the clients print and on the exit codes.

The examples use Triton's default ports (8000, 8001, 8002, and 8080 for Vertex AI) and their
clients cannot be pointed elsewhere, so every test runs its processes in a private network
namespace of its own (``unshare``), where those ports are always free; without namespaces they
run on the machine's network, one after another, and a test skips if a port is taken.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

UPSTREAM = Path(__file__).parent / "upstream_examples"
EXAMPLES = UPSTREAM / "examples"
STAND_INS = Path(__file__).parent / "stand_ins"
PORTS = (8000, 8001, 8002, 8080)  # tritonserver's defaults (HTTP, gRPC, metrics, Vertex AI)
SERVER_START_S = 60  # a server script must be serving within this (it is a few seconds)
CLIENT_S = 60  # a client must be done within this
_IMPORT = re.compile(r"^(\s*(?:from|import)\s+)pytriton(?=[.\s])", re.MULTILINE)


def rewrite(source: str, *, keep_client: bool = False) -> str:
    """``source`` with its ``pytriton`` imports turned into ``embedtriton.pytriton`` ones (all
    but ``pytriton.client``'s with ``keep_client``)."""

    def one(match: re.Match[str]) -> str:
        rest = source[match.end() : match.end() + len(".client")]
        if keep_client and rest == ".client":
            return match.group(0)
        return match.group(1) + "embedtriton.pytriton"

    return _IMPORT.sub(one, source)


@pytest.fixture(scope="module")
def stock_client(stock_pytriton) -> bool:
    """Whether PyTriton's own client (the nvidia-pytriton wheel and its dependencies) is here."""
    return stock_pytriton("client") is not None


def test_rewrite_changes_only_the_import_lines():
    source = (EXAMPLES / "add_sub_python_with_optional" / "server.py").read_text()
    changed = rewrite(source)
    pairs = [(a, b) for a, b in zip(source.splitlines(), changed.splitlines(), strict=True) if a != b]
    assert [b for _, b in pairs] == [
        "from embedtriton.pytriton.decorators import batch, fill_optionals, first_value",
        "from embedtriton.pytriton.model_config import ModelConfig, Tensor",
        "from embedtriton.pytriton.triton import Triton",
    ]
    client = (EXAMPLES / "add_sub_python" / "client.py").read_text()
    assert rewrite(client, keep_client=True) == client
    assert "from embedtriton.pytriton.client import ModelClient" in rewrite(client)


# -- where the processes run ---------------------------------------------------------------


class Network:
    """Runs the example's processes in one network namespace (``holder``'s), or on the
    machine's network when ``holder`` is None."""

    def __init__(self, holder: subprocess.Popen[bytes] | None, tmp: Path, stock_client: bool) -> None:
        self.holder = holder
        self.tmp = tmp
        self.stock_client = stock_client  # PyTriton's own client is here: clients run with it too
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTRITON_", "AIP_"))}
        self.env["PYTHONUNBUFFERED"] = "1"

    def argv(self, argv: list[str]) -> list[str]:
        if self.holder is None:
            return argv
        return ["nsenter", "--preserve-credentials", "-U", "-n", "-t", str(self.holder.pid), "--", *argv]

    def start(self, argv: list[str], name: str, cwd: Path, env: dict[str, str] | None = None) -> Process:
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(self.argv(argv), cwd=cwd, env=env or self.env, stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(proc)
        return Process(proc, log, name)

    def run(self, argv: list[str], cwd: Path, timeout: float = CLIENT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(argv), cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class Process:
    """A started process, its combined output in a file."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, name: str) -> None:
        self.proc, self.log, self.name = proc, log, name

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float, server: Process | None = None) -> int:
        """Wait for the exit; fail (with the outputs) on a timeout or when ``server`` dies first."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if server is not None and server.proc.poll() is not None:
                self.proc.kill()
                pytest.fail(f"{server.name} exited ({server.proc.returncode}) under {self.name}:\n{server.output}")
            if time.monotonic() > deadline:
                self.proc.kill()
                extra = f"\n--- {server.name}:\n{server.output}" if server else ""
                pytest.fail(f"{self.name} did not finish in {timeout} s:\n{self.output}{extra}")
            time.sleep(0.05)
        return self.proc.returncode

    def wait_for(self, text: str, timeout: float, server: Process) -> None:
        """Wait until the output shows ``text``; fail if the process or ``server`` exits first."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.proc.poll() is not None or server.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"{self.name} never printed {text!r} (exit {self.proc.poll()}):\n{self.output}\n"
                    f"--- {server.name} (exit {server.proc.poll()}):\n{server.output}"
                )
            time.sleep(0.05)

    def interrupt(self, timeout: float = 30) -> int:
        """Ctrl-C, as the READMEs stop a server; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"{self.name} did not stop on SIGINT:\n{self.output}")


def _namespace() -> subprocess.Popen[bytes] | None:
    """A process holding a new network namespace with its loopback up, or None."""
    if not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        return None
    try:
        holder = subprocess.Popen(
            ["unshare", "--net", "--map-root-user", "sh", "-c", "ip link set lo up && echo up && exec sleep 600"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return None
    assert holder.stdout is not None
    entered = (
        holder.stdout.readline().strip() == b"up"
        and subprocess.run(
            ["nsenter", "--preserve-credentials", "-U", "-n", "-t", str(holder.pid), "--", "true"], capture_output=True
        ).returncode
        == 0
    )  # (a sandbox may allow making a namespace and not entering it)
    if not entered:
        holder.kill()
        holder.wait()
        return None
    return holder


def _ports_free() -> list[int]:
    taken = []
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                taken.append(port)
    return taken


@pytest.fixture
def net(tmp_path, stock_client) -> Iterator[Network]:
    holder = _namespace()
    if holder is None:
        taken = _ports_free()
        if taken:
            pytest.skip(f"no network namespace here (unshare) and port(s) {taken} are taken: the example needs them")
    network = Network(holder, tmp_path, stock_client)
    try:
        yield network
    finally:
        network.close()
        if holder is not None:
            holder.kill()
            holder.wait()


# -- running an example ----------------------------------------------------------------------


def copy_example(name: str, dest: Path, *, keep_client: bool = False) -> Path:
    """The example's folder under ``dest/examples/`` with its Python files' imports rewritten."""
    folder = dest / "examples" / name
    folder.mkdir(parents=True)
    for path in (EXAMPLES / name).iterdir():
        target = folder / path.name
        if path.suffix == ".py":
            target.write_text(rewrite(path.read_text(), keep_client=keep_client))
        else:
            shutil.copy2(path, target)
    return folder


def run_clients(net: Network, tmp: Path, name: str, server: Process, script: str = "client.py") -> list[str]:
    """The example's client, rewritten and then unchanged (PyTriton's own client), against
    ``server``; each must exit 0. Their outputs."""
    outputs = []
    variants = [("embedtriton", False)] + ([("pytriton", True)] if net.stock_client else [])
    for variant, keep in variants:
        folder = copy_example(name, tmp / f"client-{variant}", keep_client=keep)
        client = net.start([sys.executable, str(folder / script)], f"{variant}-client", folder)
        code = client.wait(CLIENT_S, server)
        assert code == 0, f"{variant} client exited {code}:\n{client.output}\n--- server:\n{server.output}"
        outputs.append(client.output)
    return outputs


def start_server(net: Network, tmp: Path, name: str, script: str = "server.py", **env: str) -> Process:
    folder = copy_example(name, tmp / "server")
    return net.start([sys.executable, str(folder / script)], "server", folder, {**net.env, **env})


_PROBE = """
import socket, sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    try:
        assert urllib.request.urlopen("http://localhost:8000/v2/health/ready", timeout=1).status == 200
        for arg in sys.argv[2:]:
            if arg.startswith("model:"):  # a model the example binds after the server is up
                url = f"http://localhost:8000/v2/models/{arg[6:]}/ready"
                assert urllib.request.urlopen(url, timeout=1).status == 200
            else:
                socket.create_connection(("localhost", int(arg)), timeout=1).close()
        break
    except Exception:
        time.sleep(0.05)
else:
    sys.exit("not serving in time")
"""


def wait_serving(net: Network, tmp: Path, server: Process, *ports: int, models: tuple[str, ...] = ()) -> None:
    """Until ``server`` is ready over HTTP, accepts connections on ``ports`` and serves ``models``
    (for clients that do not wait for the server themselves, as PyTriton's ModelClient does)."""
    args = [*map(str, ports), *(f"model:{m}" for m in models)]
    probe = net.start([sys.executable, "-c", _PROBE, str(SERVER_START_S), *args], "probe", tmp)
    assert probe.wait(SERVER_START_S + 5, server) == 0, probe.output + server.output


def logged(output: str, key: str) -> list[str]:
    """The values the example's logger printed as ``key: value``, in order."""
    return re.findall(rf"(?:^|: ){re.escape(key)}: (.*)$", output, re.MULTILINE)


def serve_and_ask(net: Network, tmp: Path, name: str) -> tuple[Process, list[str]]:
    server = start_server(net, tmp, name)
    outputs = run_clients(net, tmp, name, server)
    assert server.interrupt() == 0, server.output
    return server, outputs


# -- the examples -------------------------------------------------------------------------


def test_add_sub_python(net, tmp_path):
    _, outputs = serve_and_ask(net, tmp_path, "add_sub_python")
    for out in outputs:
        assert logged(out, "add") == ["[[2.0], [2.0]]"] and logged(out, "sub") == ["[[0.0], [0.0]]"], out


def test_add_sub_python_with_optional(net, tmp_path):
    _, outputs = serve_and_ask(net, tmp_path, "add_sub_python_with_optional")
    for out in outputs:
        # a*w + b + t and a*w - b + t, with t filled in as 2 and w the first row's (1 when absent)
        assert logged(out, "add") == ["[[4.0], [4.0]]", "[[6.0], [6.0]]", "[[7.0], [7.0]]", "[[9.0], [9.0]]"], out
        assert logged(out, "sub") == ["[[2.0], [2.0]]", "[[4.0], [4.0]]", "[[5.0], [5.0]]", "[[7.0], [7.0]]"], out


def test_identity_python(net, tmp_path):
    _, outputs = serve_and_ask(net, tmp_path, "identity_python")
    for out in outputs:
        sent, back = logged(out, "INPUT_1"), logged(out, "OUTPUT_1")
        assert len(sent) == 1 and back == sent, out  # the same random floats, printed the same way
        assert logged(out, "OUTPUT_2") == [repr([[b"\xff\x00\x00\x00"]] * 4)], out


def test_multiple_models_python(net, tmp_path):
    _, outputs = serve_and_ask(net, tmp_path, "multiple_models_python")
    for out in outputs:
        assert logged(out, "Multiply2/product") == ["[[2.0], [2.0]]"], out
        assert logged(out, "Multiply4/product") == ["[[4.0], [4.0]]"], out


def test_use_parameters_and_headers(net, tmp_path):
    _, outputs = serve_and_ask(net, tmp_path, "use_parameters_and_headers")
    for out in outputs:  # (2 + 1) / header_divisor 3 and (2 - 1) * parameter_multiplier 2
        assert logged(out, "scaled_add") == ["[[1.0], [1.0]]"] and logged(out, "scaled_sub") == ["[[2.0], [2.0]]"], out


def notebook_script(keep_client: bool) -> str:
    """The notebook's code cells as one script (its ``!pip install`` lines left out), imports
    rewritten."""
    cells = json.loads((EXAMPLES / "add_sub_notebook" / "add_sub.ipynb").read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    lines = [line for cell in code for line in cell.splitlines() if not line.lstrip().startswith("!")]
    return rewrite("\n".join(lines) + "\n", keep_client=keep_client)


@pytest.mark.parametrize("client", ["embedtriton", "pytriton"])
def test_add_sub_notebook(net, tmp_path, client):
    """The notebook's flow in one process: bind, run, infer, stop, bind the same name again with
    another callable, run, infer (the new callable answers), stop."""
    if client == "pytriton" and not net.stock_client:
        pytest.skip("PyTriton's client (nvidia-pytriton wheel and its dependencies) is not installed")
    script = tmp_path / "add_sub_notebook.py"
    script.write_text(notebook_script(keep_client=client == "pytriton"))
    notebook = net.start([sys.executable, str(script)], "notebook", tmp_path)
    assert notebook.wait(2 * CLIENT_S) == 0, notebook.output
    out = notebook.output
    assert re.findall(r"^add: (.*)$", out, re.MULTILINE) == ["[[2.0], [2.0]]", "[[4.0], [4.0]]"], out
    assert re.findall(r"^sub: (.*)$", out, re.MULTILINE) == ["[[0.0], [0.0]]", "[[0.0], [0.0]]"], out


def test_add_sub_vertex_ai(net, tmp_path):
    """The Vertex AI example: its client over the HTTP endpoint, and its two shell scripts (curl)
    on the Vertex AI endpoint (port 8080, AIP_PREDICT_ROUTE and AIP_HEALTH_ROUTE as the server
    sets them); also the same two requests without curl."""
    server = start_server(net, tmp_path, "add_sub_vertex_ai")
    outputs = run_clients(net, tmp_path, "add_sub_vertex_ai", server)
    for out in outputs:
        assert logged(out, "add") == ["[[2.0], [2.0]]"] and logged(out, "sub") == ["[[0.0], [0.0]]"], out
    probe = (
        "import json, sys, urllib.request\n"
        "body = open('examples/add_sub_vertex_ai/data.json', 'rb').read()\n"
        "ready = urllib.request.urlopen('http://localhost:8080/v2/health/ready')\n"
        "request = urllib.request.Request('http://localhost:8080/v2/models/AddSub/infer', body,\n"
        "                                 {'Content-Type': 'application/json'})\n"
        "answer = json.load(urllib.request.urlopen(request))\n"
        "print(json.dumps({'ready': ready.status, 'answer': answer}))\n"
    )
    done = net.run([sys.executable, "-c", probe], cwd=tmp_path / "server")
    assert done.returncode == 0, done.stderr + server.output
    seen = json.loads(done.stdout)
    assert seen["ready"] == 200
    outputs_by_name = {o["name"]: o for o in seen["answer"]["outputs"]}
    assert outputs_by_name["add"]["data"] == [2.0, 4.0, 6.0, 8.0] and outputs_by_name["sub"]["data"] == [0.0] * 4
    assert seen["answer"]["model_name"] == "AddSub"
    if shutil.which("curl") and shutil.which("bash"):
        # the scripts expect to run from PyTriton's root (they name examples/add_sub_vertex_ai/data.json)
        health = net.run(["bash", "examples/add_sub_vertex_ai/health_vertex_ai_endpoint.sh"], cwd=tmp_path / "server")
        assert health.returncode == 0 and re.search(r"HTTP/1\.1 200", health.stdout), health
        infer = net.run(["bash", "examples/add_sub_vertex_ai/infer_vertex_ai_endpoint.sh"], cwd=tmp_path / "server")
        assert infer.returncode == 0, infer
        answer = json.loads(infer.stdout)
        assert {o["name"]: o["data"] for o in answer["outputs"]} == {"add": [2.0, 4.0, 6.0, 8.0], "sub": [0.0] * 4}
    assert server.interrupt() == 0, server.output


def test_simple_python_remote_mode_remote_scripts_are_refused(net, tmp_path):
    """``RemoteTriton`` imports, and refuses at construction, naming what to do instead."""
    folder = copy_example("simple_python_remote_mode", tmp_path)
    for script in ("server_remote_mul.py", "server_remote_power.py"):
        done = net.run([sys.executable, str(folder / script)], cwd=folder)
        assert done.returncode == 1, done
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("embedtriton.pytriton.exceptions.PyTritonValidationError: RemoteTriton"), done.stderr
        assert "Triton.bind" in last and "ModelClient" in last, last


def test_simple_python_remote_mode_starting_triton(net, tmp_path):
    """The script that starts Triton serves AddSub to the example's client; the client's next
    models (Mul, Power) come from the RemoteTriton scripts, which embedtriton refuses: the client
    then waits for them (init_timeout_s, 300 s) and is stopped once AddSub has answered."""
    server = start_server(
        net, tmp_path, "simple_python_remote_mode", "server_starting_triton.py", TRITON_ACCESS_TOKEN="t"
    )
    folder = copy_example("simple_python_remote_mode", tmp_path / "client")
    client = net.start([sys.executable, str(folder / "client.py")], "client", folder)
    client.wait_for("sub: [[-1.0], [-1.0]]", CLIENT_S, server)
    assert logged(client.output, "add") == ["[[3.0], [5.0]]"], client.output
    client.proc.kill()
    assert server.interrupt() == 0, server.output


@pytest.fixture
def perf_analyzer_on_path():
    """PATH and environment for the example's client.sh, which calls ``perf_analyzer`` by name."""
    from embedtriton.errors import UnavailableError
    from embedtriton.tuning.perf import perf_analyzer

    try:
        binary, env = perf_analyzer()
    except UnavailableError as exc:
        if os.environ.get("EMBEDTRITON_REQUIRE_PERF_ANALYZER"):  # (set by .ci/run for tests-oldest, which has it)
            pytest.fail(f"EMBEDTRITON_REQUIRE_PERF_ANALYZER is set, but {exc}")
        pytest.skip(f"{exc}; nox -s tests-oldest runs this test")
    return {**env, "PATH": f"{Path(binary).parent}{os.pathsep}{env.get('PATH', '')}"}


def test_perf_analyzer(net, tmp_path, perf_analyzer_on_path):
    """The example's server (BART's scores made up by ``stand_ins/transformers.py``: no weights,
    no GPU here) measured by its client.sh: perf_analyzer over gRPC with the example's strings.

    It fails as it does on PyTriton 0.7.0 itself: PyTriton 0.7 guards Triton's statistics with a
    generated access token by default (its changelog's breaking change; the example passes no
    security config), and perf_analyzer reads the model's statistics on every pass, so Triton
    refuses it. embedtriton.pytriton applies the same default, and the refusal is Triton's."""
    env = {k: v for k, v in perf_analyzer_on_path.items() if not k.startswith(("PYTRITON_", "AIP_"))}
    server = start_server(net, tmp_path, "perf_analyzer", PYTHONPATH=str(STAND_INS))
    folder = copy_example("perf_analyzer", tmp_path / "client")
    wait_serving(net, tmp_path, server, 8001, models=("BART",))  # (perf_analyzer asks for it at once)
    client = net.start(["bash", str(folder / "client.sh")], "perf_analyzer", tmp_path, {**env, "PYTHONUNBUFFERED": "1"})
    assert client.wait(3 * CLIENT_S, server) != 0, client.output
    refusal = "This protocol is restricted, expecting header 'triton-grpc-protocol-triton-access-token'"
    assert refusal in client.output, client.output + "\n--- server:\n" + server.output
    assert server.interrupt() == 0, server.output
