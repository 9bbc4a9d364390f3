"""What a newcomer met, following the README alone (issue 33): each test fails where the
friction was. (The output-dtype message is in tests/core/test_errors.py, the demo's request
count in tests/test_examples.py.)"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import packages_distributions
from pathlib import Path

import numpy as np
import pytest
from helpers import OFFLINE, OFFLINE_REASON

from embedtriton import InvalidArgumentError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (tests-oldest): pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
README = (ROOT / "README.md").read_text()


def _section(markdown: str, title: str) -> str:
    return markdown.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


# ---- every example's needs are in the Install section -------------------------------------------


def _requirement_name(requirement: str) -> tuple[str, set[str]]:
    """('tritonclient', {'grpc', 'http'}) for 'tritonclient[grpc,http]>=2.51'."""
    match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", requirement)
    assert match, requirement
    return match.group(1).lower().replace("_", "-"), {e.strip() for e in (match.group(2) or "").split(",") if e}


def _installed_by_readme() -> dict[str, set[str]]:
    """Distribution name -> extras, for everything the README's Install section installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras_table = project["optional-dependencies"]
    have: dict[str, set[str]] = {}

    def add(requirement: str) -> None:
        name, extras = _requirement_name(requirement)
        if name == "embedtriton":
            for extra in extras - have.get(name, set()):
                have.setdefault(name, set()).add(extra)
                for inner in extras_table[extra]:
                    add(inner)
        have.setdefault(name, set()).update(extras)

    for requirement in project["dependencies"]:
        add(requirement)
    for line in re.findall(r"pip install ([^`\n#]+)", _section(README, "Install")):
        for word in line.replace('"', " ").replace("'", " ").split():
            if word.startswith("-"):
                continue
            add("embedtriton" + word[1:] if word.startswith(".") else word)
    return have


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _needs(module: str, local: set[str]) -> tuple[list[str], str] | None:
    """(distributions, any of which provides it; extra or '') that `import module` needs; None
    for the standard library and the examples' own modules."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in local or top == "__future__":
        return None
    if top == "tritonclient":  # its parts are extras of one distribution
        part = module.split(".")[1] if "." in module else ""
        return ["tritonclient"], part if part in ("grpc", "http") else ""
    distributions = packages_distributions().get(top) or [top]
    return [d.lower().replace("_", "-") for d in distributions], ""


def test_every_example_needs_only_what_the_install_section_installs():
    """`examples/http_serving.py` once failed after the Install section (no gevent, then
    tritonclient without http support): its needs were only in its docstring."""
    have = _installed_by_readme()
    local = {p.stem for p in EXAMPLES.rglob("*.py")}
    missing = []
    for path in sorted(EXAMPLES.rglob("*.py")):
        for module in sorted(_imports(path)):
            need = _needs(module, local)
            if need is None:
                continue
            names, extra = need
            name = names[0]
            found = [d for d in have if any(d == n or d.startswith(n + "-") for n in names)]
            if not found or (extra and not any(extra in have[d] or "all" in have[d] for d in found)):
                missing.append(f"{path.relative_to(ROOT)}: import {module} needs {name}{f'[{extra}]' if extra else ''}")
    assert not missing, "not installed by the README's Install section:\n" + "\n".join(missing)


def test_the_tests_install_the_examples_as_the_readme_does():
    noxfile = (ROOT / "noxfile.py").read_text()
    tests_session = noxfile.split("def tests(session", 1)[1].split("\n@nox.session", 1)[0]
    assert 'extras="examples' in tests_session
    assert 'pip install ".[examples]"' in _section(README, "Install")


# ---- an unexpected input is named ----------------------------------------------------------------


def test_an_unexpected_input_is_named(server):
    """Triton said "expected 2 inputs but got 3 inputs ... missing required input(s) ]"."""
    one = np.ones((1, 1), np.float32)
    model = server.model("AddSub")
    with pytest.raises(InvalidArgumentError) as caught:
        model.infer({"a": one, "b": one, "c": one})
    assert str(caught.value) == "model 'AddSub': unexpected input ['c']; its inputs are ['a', 'b']"
    with pytest.raises(InvalidArgumentError, match=re.escape("missing input ['b']; its inputs are ['a', 'b']")):
        model.infer({"a": one})
    with pytest.raises(InvalidArgumentError, match=re.escape("unexpected inputs ['c', 'd'] and missing input ['b']")):
        model.infer({"a": one, "c": one, "d": one})


def test_an_unexpected_input_is_named_in_asyncio(server):
    one = np.ones((1, 1), np.float32)

    async def call() -> None:
        await server.model("AddSub").infer_async({"a": one, "b": one, "c": one})

    with pytest.raises(InvalidArgumentError, match=re.escape("unexpected input ['c']")):
        asyncio.run(call())


# ---- embedtriton serve: defaults said, metrics when asked, a port in use explained --------------


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "embedtriton", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_serve_help_shows_the_defaults():
    done = _run("serve", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())  # (argparse wraps lines)
    assert "(default: 127.0.0.1:8001)" in text and "(default: 30)" in text and "(default: none)" in text
    metrics = text.split("--metrics METRICS ")[1].split(" --http HTTP ")[0]
    assert metrics.endswith("--http serves /metrics too) (default: none)")  # no port unless asked


def _targets(tmp_path: Path) -> Path:
    (tmp_path / "targets.py").write_text(
        "import numpy as np\n"
        "from embedtriton import Tensor, batch\n"
        "def good(server):\n"
        "    server.bind('Double', batch(lambda x: {'y': x * 2}),\n"
        "                [Tensor(name='x', dtype=np.float32, shape=(1,))], [Tensor(name='y', dtype=np.float32, shape=(1,))])\n"
    )
    return tmp_path


def test_serve_opens_no_metrics_port_unless_asked(tmp_path):
    """It opened 127.0.0.1:8002 unasked, so a second `serve` on other gRPC/HTTP ports died."""
    process = subprocess.Popen(
        [sys.executable, "-m", "embedtriton", "serve", "targets:good", "--grpc", "127.0.0.1:0"],
        cwd=_targets(tmp_path),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("ready:" in line for line in lines):
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
        assert any("ready: Double" in line for line in lines), lines
        assert not any("metrics" in line for line in lines), lines
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        process.stderr.close()


def test_a_port_in_use_names_the_flag(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run("serve", "targets:good", "--grpc", f"127.0.0.1:{port}", cwd=_targets(tmp_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"cannot serve gRPC on 127.0.0.1:{port}" in done.stderr
    assert "pick another with --grpc HOST:PORT, or --grpc '' for none" in done.stderr


# ---- embedtriton tune: where it writes, said alike everywhere ------------------------------------


def test_tune_says_where_it_writes_and_the_example_agrees():
    done = _run("tune", "--help")
    text = " ".join(done.stdout.split())
    assert "(default: tuning-report)" in text and "relative: to the current folder" in text
    assert "``tuning-report/`` in the current folder" in " ".join((EXAMPLES / "tuning.py").read_text().split())


# ---- the first two commands work on a PEP 668 system ---------------------------------------------


def _first_commands() -> list[str]:
    block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_first_two_commands_install_nothing_outside_a_virtual_environment():
    commands = _first_commands()
    assert commands == ["./dev demo", "./dev tests"]
    ci = (ROOT / ".ci" / "run").read_text().rstrip().splitlines()
    assert ci[-3:] == [
        "./dev tests tests-oldest tests-newest tests-asan lint docs",
        "./dev fuzz -- --seconds 15",
        "./dev wheels -- --python 3.11 --test quick",
    ]


@pytest.mark.skipif(
    not list(Path("/usr/lib").glob("python3*/EXTERNALLY-MANAGED")) or not Path("/usr/bin/python3").exists(),
    reason="no externally managed (PEP 668) system Python here",
)
def test_dev_runs_nox_with_an_externally_managed_system_python(tmp_path):
    """Debian 12's own python3 refuses `python3 -m pip install nox`; ./dev makes a virtual
    environment for nox instead."""
    if OFFLINE:
        pytest.skip(f"./dev installs nox from PyPI: {OFFLINE_REASON}")
    shutil.copy(ROOT / "dev", tmp_path / "dev")
    shutil.copy(ROOT / "noxfile.py", tmp_path / "noxfile.py")
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    env.pop("VIRTUAL_ENV", None)
    refused = subprocess.run(
        ["python3", "-m", "pip", "install", "--dry-run", "nox"], env=env, capture_output=True, text=True
    )
    assert refused.returncode != 0  # what the README's old commands met
    done = subprocess.run(["sh", "dev", "--list"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tests" in done.stdout and "docs" in done.stdout
    assert (tmp_path / ".nox-venv" / "bin" / "nox").exists()


# ---- the perf_analyzer tests run in one session, and their skip says where ------------------------


def test_perf_analyzer_missing_says_which_wheel_has_it(monkeypatch, tmp_path):
    from embedtriton.errors import UnavailableError
    from embedtriton.tuning import perf

    monkeypatch.setattr(perf.sysconfig, "get_path", lambda name: str(tmp_path))
    monkeypatch.setattr(perf.shutil, "which", lambda name: None)
    with pytest.raises(UnavailableError) as caught:
        perf.perf_analyzer.__wrapped__()
    message = str(caught.value)
    assert "pip install tritonclient==2.51.0, the last wheel that ships the binary" in message
    assert "whose wheel has no perf_analyzer" in message or "tritonclient is not installed" in message


def test_the_perf_analyzer_tests_run_in_the_oldest_session():
    noxfile = (ROOT / "noxfile.py").read_text()
    oldest = noxfile.split("def tests_oldest(session", 1)[1].split("\n@nox.session", 1)[0]
    assert '"tritonclient[grpc,http]==2.51.0"' in oldest  # the wheel with the binary
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get install -y -qq libb64-0d" in ci and "export EMBEDTRITON_REQUIRE_PERF_ANALYZER=1" in ci
    for conftest in (ROOT / "tests/frontends/conftest.py", ROOT / "tests/pytriton/test_upstream_examples.py"):
        assert "EMBEDTRITON_REQUIRE_PERF_ANALYZER" in conftest.read_text()
