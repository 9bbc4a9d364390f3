"""Shared fixtures for every tier (unit, core, frontends, adversarial).

The helpers are fixtures, not importable names: a test takes ``add_sub``, ``add_sub_tensors``,
``bind_double`` or ``counter`` as a parameter. They are session-scoped, so module- and
session-scoped fixtures can use them too. Building one of them starts nothing: only the
``server`` fixture (and ``add_sub_counted`` on top of it) runs Triton.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from helpers import OFFLINE, OFFLINE_REASON

from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor, batch

F32 = np.float32


@batch
def _add_sub(a, b):
    return {"add": a + b, "sub": a - b}


def _bind_double(server, func, max_batch_size=4):
    """Bind ``func`` as model "Double": FP32 input "x" and output "y", both [-1]."""
    server.bind(
        "Double",
        func,
        [Tensor(name="x", dtype=F32, shape=(-1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,))],
        ModelConfig(max_batch_size=max_batch_size),
    )
    return server.model("Double")


class _Counter:
    """A raw callable wrapper that counts the batches and requests it saw."""

    def __init__(self, func):
        self.func = func
        self.batches = 0
        self.requests = 0

    def __call__(self, requests):
        self.batches += 1
        self.requests += len(requests)
        return self.func(requests)


@pytest.fixture(scope="session")
def add_sub():
    """The AddSub model function (``@batch``): FP32 "a", "b" -> "add" = a + b, "sub" = a - b."""
    return _add_sub


@pytest.fixture(scope="session")
def add_sub_tensors():
    """AddSub's ``(inputs, outputs)``: FP32 "a", "b" -> "add", "sub", each of shape (1,).
    Tuples, so no test can change them for the next: ``server.bind(name, f, *add_sub_tensors)``."""
    return (
        (Tensor(name="a", dtype=F32, shape=(1,)), Tensor(name="b", dtype=F32, shape=(1,))),
        (Tensor(name="add", dtype=F32, shape=(1,)), Tensor(name="sub", dtype=F32, shape=(1,))),
    )


@pytest.fixture(scope="session")
def bind_double():
    """``bind_double(server, func, max_batch_size=4)``: binds ``func`` as model "Double"
    (FP32 input "x" and output "y", both [-1]) and returns its Model."""
    return _bind_double


@pytest.fixture(scope="session")
def counter():
    """The class ``Counter(func)``: a raw callable wrapper counting its ``batches`` and ``requests``."""
    return _Counter


@pytest.fixture(scope="session")
def server(add_sub, add_sub_tensors):
    """One running server with model "AddSub" (max_batch_size 8), shared by the session."""
    srv = Server()
    srv.bind("AddSub", add_sub, *add_sub_tensors, ModelConfig(max_batch_size=8))
    with srv:
        yield srv


@pytest.fixture
def add_sub_counted(server, add_sub, add_sub_tensors, counter):
    """AddSub with a call counter, bound fresh for one test: ``(model, counter)``."""
    counted = counter(add_sub)
    server.bind(
        "AddSubCounted",
        counted,
        *add_sub_tensors,
        ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=20000)),
    )
    yield server.model("AddSubCounted"), counted
    server.unbind("AddSubCounted")


@pytest.fixture
def own_process(request):
    """For a test that starts a server with a response cache. Triton keeps one cache per process,
    and a stopped server is deleted only once no other runs (the session's ``server`` does), so
    such a test runs again in a fresh process: True there (run the test body), False here once
    that run passed (the body returns at once)."""
    if os.environ.get("EMBEDTRITON_OWN_PROCESS") == request.node.nodeid:
        return True
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--timeout",
            "120",
            f"{request.config.rootpath}/{request.node.nodeid}",
        ],
        cwd=tempfile.gettempdir(),  # (not the source tree: the installed package is imported)
        env={**os.environ, "EMBEDTRITON_OWN_PROCESS": request.node.nodeid},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    return False


def _python_backend_missing() -> str | None:
    """Why Triton's python backend cannot run a model here, or None: the runtime carries a stub
    per Python version, and the stub embeds the system's libpython of that version."""
    from pathlib import Path

    from embedtriton.triton.runtime import find_runtime

    wheel = find_runtime().lib_dir.parent / "pytriton" / "tritonserver"
    version = "{}.{}".format(*sys.version_info)
    if not (wheel / "python_backend_stubs" / version / "triton_python_backend_stub").is_file():
        return f"the Triton runtime has no python backend stub for Python {version}"
    if not Path(f"/usr/lib/x86_64-linux-gnu/libpython{version}.so.1.0").exists():
        return f"the python backend's stub embeds the system's libpython{version}, which this system lacks"
    return None


@pytest.fixture(scope="session")
def stub_python(tmp_path_factory):
    """A virtual environment for the stub of Triton's python backend (its models run in a
    process embedding the system's libpython, on the first virtual environment's python3 on
    PATH), with what Triton 2.51's examples need: numpy<2, and torch: the test session's own where
    it has one (read through a .pth file), else torch's CPU wheel where this machine has it. Made
    once per session; ``{"bin": <venv>/bin, "torch": bool}``. Put ``bin`` first
    on PATH for a server whose python-backend models should run on it. Skips where the runtime
    cannot run python-backend models at all (no stub for this Python, or no system libpython)."""
    reason = _python_backend_missing()
    if reason:
        pytest.skip(reason)
    import venv
    from pathlib import Path

    if OFFLINE and not os.environ.get("EMBEDTRITON_TEST_STUB_VENV"):
        pytest.skip(f"the python backend's stub environment needs numpy<2 and torch installed: {OFFLINE_REASON}")
    root = Path(os.environ.get("EMBEDTRITON_TEST_STUB_VENV") or tmp_path_factory.mktemp("stub") / "venv")
    python = root / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(root)
    if subprocess.run([str(python), "-c", "import numpy"], capture_output=True).returncode:
        done = subprocess.run([*pip, "numpy<2"], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"installing numpy<2 for the python backend's stub failed: {done.stderr[-2000:]}"
    torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0
    here = _torch_site_packages()
    if not torch and here is not None:  # the test session's own torch, read after the stub's own numpy<2
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        Path(site, "embedtriton_tests_torch.pth").write_text(f"{here}\n")
        torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0
    if not torch:  # torch's CPU build only ('+cpu': never the multi-GB CUDA build from PyPI)
        torch = subprocess.run([*pip, "torch==2.13.0+cpu"], capture_output=True, timeout=900).returncode == 0
    return {"bin": str(root / "bin"), "torch": torch}


def _torch_site_packages() -> str | None:
    """The site-packages folder of the torch this test session could import, or None: the
    stub's environment (the same Python version) reads torch from there instead of installing
    a second copy (~35 s)."""
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("torch")
    return None if spec is None or spec.origin is None else str(Path(spec.origin).parent.parent)


def _python_backend_example(root, name: str, model: str, config: str | None = None) -> None:
    """Lay out model ``name`` in repository ``root`` as the python_backend examples' READMEs do:
    ``model`` (a path under tests/upstream/python_backend) copied, unchanged, to
    ``name/1/model.py``, and ``config`` (if any) to ``name/config.pbtxt``."""
    import shutil
    from pathlib import Path

    upstream = Path(__file__).parent / "upstream" / "python_backend"
    folder = Path(root) / name
    (folder / "1").mkdir(parents=True)
    shutil.copy(upstream / model, folder / "1" / "model.py")
    if config is not None:
        shutil.copy(upstream / config, folder / "config.pbtxt")


@pytest.fixture(scope="session")
def python_backend_example():
    """``python_backend_example(root, name, model, config=None)``: one of Triton's python_backend
    examples (tests/upstream/python_backend) laid out as model ``name`` of repository ``root``."""
    return _python_backend_example
