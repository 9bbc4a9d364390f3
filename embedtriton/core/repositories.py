"""Triton model repositories served next to bound callables (``ServerConfig.model_repository``).

A model folder holds version folders (``1/``, ``2/``, ...). Three formats, told apart by what
the files hold (:func:`scan`):

- **Python callables**: a version folder's ``model.py`` defines ``infer_func`` (plain or
  ``@batch``), ``inputs`` and ``outputs`` (lists of ``Tensor``) and optionally ``config`` (a
  ``ModelConfig``). Each version is imported and bound like ``server.bind(..., version=N)``.
- **Triton models**: a folder with a ``config.pbtxt`` naming a ``backend`` or ``platform`` (an
  ensemble, ...), or whose ``model.py`` defines Triton's ``TritonPythonModel`` (a python-backend
  model, with or without ``config.pbtxt``: Triton auto-completes it): Triton loads it as it is
  (through a link in the server's own repository folder), and what it loaded (decoupled,
  batching, tensors) is read back from Triton, never assumed.
- **ONNX models**: version folders holding ``model.onnx`` (with no ``config.pbtxt``, or one
  naming onnxruntime): run by the onnxruntime package through our backend, tensors read from
  the graph (see :mod:`.onnx`).

Control modes, as Triton's: ``"none"`` loads every model at start; ``"explicit"`` loads and
unloads on ``server.load(name)`` / ``server.unload(name)`` (and gRPC RepositoryModelLoad /
Unload); ``"poll"`` loads everything at start, then every ``repository_poll_secs`` picks up new
models and versions, edited files and removed models, without a restart. A model that fails to
load fails alone, with the reason, and keeps what was serving before.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import logging
import re
import shutil
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ModelConfig, Tensor, name_tensors
from ..config.override import parse_pbtxt
from ..errors import InvalidArgumentError, NotFoundError, TritonError, UnsupportedError
from ..triton import control
from ..triton.stubs import guard_stubs
from .onnx import onnx_model

log = logging.getLogger("embedtriton")
_BACKEND_LINE = re.compile(r"^\s*(backend|platform)\s*:", re.MULTILINE)
_PYTHON_BACKEND_LINE = re.compile(r'^\s*backend\s*:\s*"python"', re.MULTILINE)
_imports = itertools.count(1)


@dataclass
class Found:
    """A model folder of a repository."""

    name: str
    path: Path
    kind: str  # "callable", "triton" or "onnx"
    versions: dict[int, Path] = field(default_factory=dict)
    stamp: tuple[Any, ...] = ()  # what POLL compares: every file's name, size and mtime
    python_backend: bool = False  # a Triton model run by Triton's python backend

    def read_as(self) -> str:
        """Which format the folder was read as, and why (for error messages)."""
        if self.kind == "onnx":
            return "an ONNX model (a version folder holds model.onnx)"
        if self.kind == "callable":
            return "an embedtriton callable model (its model.py defines no TritonPythonModel)"
        if self.python_backend:
            return 'a model of Triton\'s python backend (TritonPythonModel in model.py, or backend "python")'
        return "a model in Triton's format (its config.pbtxt names a backend or platform)"


@dataclass(frozen=True)
class LoadedModel:
    """A repository's Triton-format model as Triton loaded it: what callers need to know of it
    is read back from the config Triton applied (auto-completed, overridden), never assumed."""

    path: Path
    decoupled: bool
    max_batch_size: int

    @classmethod
    def read(cls, handle: int, name: str, path: Path) -> LoadedModel:
        config = control.model_config(handle, name, -1)
        policy = config.get("model_transaction_policy") or {}
        return cls(path, bool(policy.get("decoupled", False)), int(config.get("max_batch_size", 0) or 0))


def triton_python_model(path: Path) -> bool:
    """Whether ``model.py`` is written for Triton's python backend: it defines a top-level
    ``TritonPythonModel`` class (read, never imported; a file Python cannot parse is judged by
    whether it names that class at all)."""
    try:
        source = path.read_text(errors="replace")
    except OSError:
        return False
    try:
        tree = ast.parse(source, str(path))
    except (SyntaxError, ValueError):
        return "TritonPythonModel" in source
    return any(isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel" for node in tree.body)


def scan(repositories: list[str]) -> dict[str, Found]:
    """Every model folder of the repositories, by name."""
    found: dict[str, Found] = {}
    for repository in repositories:
        root = Path(repository)
        if not root.is_dir():
            raise NotFoundError(f"model repository {repository!r} is not a folder")
        for folder in sorted(root.iterdir()):
            if not folder.is_dir() or folder.name.startswith("."):
                continue
            if folder.name in found:
                raise InvalidArgumentError(
                    f"model '{folder.name}' is in two repositories: {found[folder.name].path.parent} and {root}"
                )
            versions = {int(v.name): v for v in folder.iterdir() if v.is_dir() and v.name.isdigit() and int(v.name) > 0}
            config = folder / "config.pbtxt"
            text = config.read_text(errors="replace") if config.is_file() else ""
            sources = [v / "model.py" for v in versions.values() if (v / "model.py").is_file()]
            python_backend = _PYTHON_BACKEND_LINE.search(text) is not None or any(
                triton_python_model(p) for p in sources
            )
            native = _BACKEND_LINE.search(text) is not None or python_backend
            callable_ = bool(sources) and not python_backend
            onnx = any((v / "model.onnx").is_file() for v in versions.values()) and (not native or "onnx" in text)
            if not native and not callable_ and not onnx:
                continue  # not a model (yet): no config naming a backend, no model.py or model.onnx
            files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            stamp = tuple((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
            kind = "onnx" if onnx else "triton" if native else "callable"  # (ONNX: see Repositories._load)
            found[folder.name] = Found(folder.name, folder, kind, versions, stamp, python_backend and kind == "triton")
    return found


def import_version(found: Found, version: int) -> tuple[Any, list[Tensor], list[Tensor], ModelConfig]:
    """``(infer_func, inputs, outputs, config)`` of a callable model's version; a broken
    ``model.py`` is an InvalidArgumentError naming the file and line."""
    path = found.versions[version] / "model.py"
    name = f"embedtriton_repository_{next(_imports)}_{found.name}_v{version}"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # (dataclasses and pickling look modules up)
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(name, None)
    except SyntaxError as exc:
        raise InvalidArgumentError(f"{path}:{exc.lineno}: SyntaxError: {exc.msg}") from None
    except Exception as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
        line = frames[-1].lineno if frames else "?"
        raise InvalidArgumentError(f"{path}:{line}: importing it raised {type(exc).__name__}: {exc}") from None
    missing = [n for n in ("infer_func", "inputs", "outputs") if not hasattr(module, n)]
    if missing:
        raise InvalidArgumentError(
            f"{path} defines no {', '.join(missing)}: a repository model.py defines infer_func, inputs and "
            "outputs (lists of Tensor) and optionally config (a ModelConfig)"
        )
    config = getattr(module, "config", None) or ModelConfig()
    inputs, outputs = list(module.inputs), list(module.outputs)
    pbtxt = found.path / "config.pbtxt"
    if pbtxt.is_file():  # Triton's format beside model.py: it overrides the declared config
        config = parse_pbtxt(
            pbtxt.read_text(),
            str(pbtxt),
            found.name,
            name_tensors(inputs, "INPUT"),
            name_tensors(outputs, "OUTPUT"),
            config,
        )
    return module.infer_func, inputs, outputs, config


def execution_env(config: Path) -> Path | None:
    """The ``EXECUTION_ENV_PATH`` parameter of a python-backend model's ``config.pbtxt`` (the
    Python environment Triton runs its stub in), or None."""
    try:
        text = config.read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r'key\s*:\s*"EXECUTION_ENV_PATH"\s*value\s*:?\s*\{\s*string_value\s*:\s*"([^"]*)"', text)
    if match is None:
        return None
    value = match.group(1).replace("$$TRITON_MODEL_DIRECTORY", str(config.parent))
    return Path(value)


def _site_numpy(prefix: Path) -> str | None:
    """The numpy version installed in the environment at ``prefix`` (read from its metadata)."""
    version = "{}.{}".format(*sys.version_info)
    infos = sorted((prefix / "lib" / f"python{version}" / "site-packages").glob("numpy-*.dist-info"))
    return infos[-1].name.removeprefix("numpy-").removesuffix(".dist-info") if infos else None


def stub_numpy(env: Path | None = None) -> tuple[str, str | None]:
    """(the Python, its numpy version or None) that Triton's python backend stub will run.

    With a model's ``EXECUTION_ENV_PATH`` (a folder), that environment. Otherwise the stub
    embeds a libpython that finds its prefix as Python does for a program named ``python3``:
    the first ``python3`` on PATH when that is a virtual environment (an activated venv, nox,
    tox), else the system's."""
    if env is not None:
        return str(env), _site_numpy(env)
    version = "{}.{}".format(*sys.version_info)
    found = shutil.which("python3")
    venv = Path(found).parent.parent if found else None
    if venv is not None and (venv / "pyvenv.cfg").is_file():
        return str(venv), _site_numpy(venv)
    system = f"/usr/bin/python{version}"
    try:
        done = subprocess.run(
            [system, "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return system, None
    return system, done.stdout.strip() if done.returncode == 0 else None


def check_python_backend(name: str, env: Path | None = None) -> None:
    """Refuse a python-backend model whose stub would run without numpy or on numpy 2 (Triton
    2.51's python backend predates numpy 2 and reads its arrays wrongly: its answers would be
    garbage), saying what to install where. ``env``: the model's ``EXECUTION_ENV_PATH``."""
    if env is not None and not env.is_dir():
        return  # a conda-pack archive: Triton unpacks it; what it holds is not ours to read
    python, numpy_version = stub_numpy(env)
    if numpy_version is not None and int(numpy_version.split(".")[0]) < 2:
        return
    version = "{}.{}".format(*sys.version_info)
    if env is not None:
        where = f"its EXECUTION_ENV_PATH {python}"
        fix = f'{python}/bin/pip install "numpy<2"'
    elif python.startswith("/usr/bin/"):
        where = f"the system's Python ({python}, as no virtual environment's python3 is first on PATH)"
        fix = (
            "apt install python3-numpy (Debian/Ubuntu), or start the server with a virtual environment "
            f'of Python {version} holding "numpy<2" first on PATH'
        )
    else:
        where = f"the virtual environment {python} (the first python3 on PATH)"
        fix = (
            f'{python}/bin/pip install "numpy<2", or start the server with another virtual environment of '
            f'Python {version} holding "numpy<2" first on PATH (PATH=/path/to/venv/bin:$PATH), or set '
            "EXECUTION_ENV_PATH in the model's config.pbtxt to one"
        )
    has = (
        "has no numpy"
        if numpy_version is None
        else f"has numpy {numpy_version}, which Triton 2.51's stub reads wrongly"
    )
    raise UnsupportedError(
        f"Triton's python backend runs model '{name}' in a stub process that needs numpy<2, and the stub would "
        f"run {where}, which {has}. Fix: {fix}"
    )


class Repositories:
    """The user's repositories of one server, and their control mode."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.paths: list[str] = list(server.config.model_repository)
        self.mode: str = server.config.model_control_mode
        self.known: dict[str, Found] = {}  # what is loaded, as it was when loaded
        self.failed: dict[str, tuple[Any, ...]] = {}  # what failed to load, not tried again until it changes
        self.reasons: dict[str, str] = {}  # why each model that is not loaded failed its last load
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holds(self, name: str) -> bool:
        """Whether ``name`` is a model of the repositories (loaded or not)."""
        return bool(self.paths) and (name in self.known or name in scan(self.paths))

    def start(self) -> None:
        """At server start: NONE and POLL load every model; POLL starts watching."""
        if not self.paths:
            return
        found = scan(self.paths)  # also in explicit mode: a missing folder fails the start
        if self.mode in ("none", "poll"):
            self.load_all(found)
        if self.mode == "poll":
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="embedtriton-repository-poll", daemon=True)
            self._thread.start()

    def load_all(self, found: dict[str, Found] | None = None) -> None:
        """Load every model of the repositories as it is on disk now (NONE and POLL at start;
        tritonserver's ``--load-model=*`` in explicit mode); a model that fails is logged and
        the others load."""
        if found is None:
            found = scan(self.paths) if self.paths else {}
        for item in sorted(found.values(), key=lambda f: f.kind != "callable"):  # callables first:
            try:  # Triton models (ensembles) may use them
                self._load(item)
            except TritonError as exc:
                log.error("model '%s' of the repository failed to load: %s", item.name, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        self.known.clear()

    def load(self, name: str) -> None:
        """``server.load(name)`` for a repository model (explicit mode)."""
        found = scan(self.paths).get(name)
        if found is None:
            raise NotFoundError(f"failed to load '{name}', failed to poll from model repository")
        self._load(found)

    def unload(self, name: str) -> None:
        self.reasons.pop(name, None)
        item = self.known.pop(name, None)
        if item is None:
            return
        if item.kind == "callable":
            self.server.unbind(name)
        else:
            self.server._unload_repository_model(name)

    def _load(self, found: Found) -> None:
        """Load (or reload) one model as it is on disk now; on failure what served stays, and
        the error says which format the folder was read as."""
        try:
            self._load_as_read(found)
        except TritonError as exc:
            error = type(exc)(f"model '{found.name}', read as {found.read_as()}: {str(exc).rstrip('; ' + chr(10))}")
            if found.name not in self.known:
                self.reasons[found.name] = str(error)
            raise error from None
        self.reasons.pop(found.name, None)
        self.known[found.name] = found

    def unloaded(self) -> dict[str, str | None]:
        """The repositories' models that are not loaded: name -> why the last load failed (None:
        never tried, or unloaded)."""
        if not self.paths:
            return {}
        try:
            names = scan(self.paths)
        except TritonError:
            names = {}
        return {name: self.reasons.get(name) for name in names if name not in self.known}

    def _load_as_read(self, found: Found) -> None:
        if found.python_backend:
            check_python_backend(found.name, execution_env(found.path / "config.pbtxt"))
            guard_stubs()  # no stub of its outlives this process
        backend_dir = self.server._generated_repository.backend_dir
        onnx_backend = backend_dir is not None and (backend_dir / "onnxruntime").is_dir()
        if found.kind == "triton" or (
            found.kind == "onnx" and onnx_backend and (found.path / "config.pbtxt").is_file()
        ):
            self.server._load_repository_model(found.name, found.path)  # (an NGC install runs ONNX itself)
        elif found.kind == "onnx":  # no onnxruntime backend in this runtime: the package runs it
            imported = {
                v: onnx_model(found.versions[v] / "model.onnx", None)
                for v in sorted(found.versions)
                if (found.versions[v] / "model.onnx").is_file()
            }
            self.server._bind_versions(found.name, imported)
        else:
            imported = {
                v: import_version(found, v)
                for v in sorted(found.versions)
                if (found.versions[v] / "model.py").is_file()
            }
            self.server._bind_versions(found.name, imported)

    def _watch(self) -> None:
        while not self._stop.wait(self.server.config.repository_poll_secs):
            try:
                self.poll()
            except Exception:  # a bug of ours: keep watching
                log.exception("polling the model repositories failed")

    def poll(self) -> None:
        """One look at the repositories: load what is new or changed, unload what is gone."""
        try:
            found = scan(self.paths)
        except TritonError as exc:
            log.error("model repository: %s", exc)
            return
        for name in [n for n in self.known if n not in found]:
            log.info("model '%s' left the repository: unloading it", name)
            self.unload(name)
        for name, item in found.items():
            before = self.known.get(name)
            if (before is not None and before.stamp == item.stamp) or self.failed.get(name) == item.stamp:
                continue
            try:
                self._load(item)
                self.failed.pop(name, None)
                log.info("model '%s' %s from the repository", name, "reloaded" if before else "loaded")
            except TritonError as exc:
                self.failed[name] = item.stamp
                log.error(
                    "model '%s' of the repository failed to load (what served before still serves): %s", name, exc
                )
