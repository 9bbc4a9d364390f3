"""Triton model repositories served next to bound callables (``ServerConfig.model_repository``).

A model folder holds version folders (``1/``, ``2/``, ...). Two kinds:

- **Python callables**: a version folder's ``model.py`` defines ``infer_func`` (plain or
  ``@batch``), ``inputs`` and ``outputs`` (lists of ``Tensor``) and optionally ``config`` (a
  ``ModelConfig``). Each version is imported and bound like ``server.bind(..., version=N)``.
- **Triton models**: a folder with a ``config.pbtxt`` naming a ``backend`` or ``platform``
  (an ensemble, a python-backend model, ...): Triton loads it as it is (through a link in the
  server's own repository folder).
- **ONNX models**: version folders holding ``model.onnx`` (with no ``config.pbtxt``, or one
  naming onnxruntime): run by the onnxruntime package through our backend, tensors read from
  the graph (see :mod:`.onnx`).

Control modes, as Triton's: ``"none"`` loads every model at start; ``"explicit"`` loads and
unloads on ``server.load(name)`` / ``server.unload(name)`` (and gRPC RepositoryModelLoad /
Unload); ``"poll"`` loads everything at start, then every ``repository_poll_secs`` picks up new
models and versions, edited files and removed models, without a restart. A model that fails to
load (a broken ``model.py``) keeps what was serving before.
"""

from __future__ import annotations

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
from .onnx import onnx_model

log = logging.getLogger("embedtriton")
_BACKEND_LINE = re.compile(r"^\s*(backend|platform)\s*:", re.MULTILINE)
_imports = itertools.count(1)


@dataclass
class Found:
    """A model folder of a repository."""

    name: str
    path: Path
    kind: str  # "callable" or "triton"
    versions: dict[int, Path] = field(default_factory=dict)
    stamp: tuple[Any, ...] = ()  # what POLL compares: every file's name, size and mtime


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
            native = _BACKEND_LINE.search(text) is not None
            callable_ = any((v / "model.py").is_file() for v in versions.values())
            onnx = any((v / "model.onnx").is_file() for v in versions.values()) and (not native or "onnx" in text)
            if not native and not callable_ and not onnx:
                continue  # not a model (yet): no config naming a backend, no model.py or model.onnx
            files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            stamp = tuple((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
            kind = "onnx" if onnx else "triton" if native else "callable"  # (ONNX: see Repositories._load)
            found[folder.name] = Found(folder.name, folder, kind, versions, stamp)
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


def stub_numpy() -> tuple[str, str | None]:
    """(the Python, its numpy version or None) that Triton's python backend stub will run.

    The stub embeds a libpython and finds its prefix as Python does: the first ``python3`` on
    PATH when that is a virtual environment (an activated venv, nox, tox), else the system's."""
    version = "{}.{}".format(*sys.version_info)
    found = shutil.which("python3")
    venv = Path(found).parent.parent if found else None
    if venv is not None and (venv / "pyvenv.cfg").is_file():
        site = venv / "lib" / f"python{version}" / "site-packages"
        infos = sorted(site.glob("numpy-*.dist-info"))
        return str(venv), infos[-1].name.removeprefix("numpy-").removesuffix(".dist-info") if infos else None
    system = f"/usr/bin/python{version}"
    try:
        done = subprocess.run(
            [system, "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return system, None
    return system, done.stdout.strip() if done.returncode == 0 else None


def check_python_backend(name: str) -> None:
    """Refuse a python-backend model whose stub would run on numpy 2: Triton 2.51's python
    backend predates numpy 2 and reads its arrays wrongly (the answers are garbage)."""
    python, numpy_version = stub_numpy()
    if numpy_version is None:
        raise UnsupportedError(
            f"model '{name}' runs on Triton's python backend, whose stub runs the Python at {python}; it has "
            "no numpy (on Debian: apt install python3-numpy, or activate a venv with numpy<2)"
        )
    if int(numpy_version.split(".")[0]) >= 2:
        raise UnsupportedError(
            f"model '{name}' runs on Triton's python backend, whose stub runs the Python at {python} with numpy "
            f"{numpy_version}: Triton 2.51's python backend reads numpy 2 arrays wrongly (its answers would be "
            "garbage). Give that Python numpy<2, or start the server with another Python first on PATH"
        )


class Repositories:
    """The user's repositories of one server, and their control mode."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.paths: list[str] = list(server.config.model_repository)
        self.mode: str = server.config.model_control_mode
        self.known: dict[str, Found] = {}  # what is loaded, as it was when loaded
        self.failed: dict[str, tuple[Any, ...]] = {}  # what failed to load, not tried again until it changes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holds(self, name: str) -> bool:
        """Whether ``name`` is a model of the repositories (loaded or not)."""
        return bool(self.paths) and (name in self.known or name in scan(self.paths))

    def start(self) -> None:
        """At server start: NONE and POLL load every model; POLL starts watching."""
        if not self.paths:
            return
        found = scan(self.paths)
        if self.mode in ("none", "poll"):  # callables first: Triton models (ensembles) may use them
            for item in sorted(found.values(), key=lambda f: f.kind != "callable"):
                try:
                    self._load(item)
                except TritonError as exc:
                    log.error("model '%s' of the repository failed to load: %s", item.name, exc)
        if self.mode == "poll":
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="embedtriton-repository-poll", daemon=True)
            self._thread.start()

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
        item = self.known.pop(name, None)
        if item is None:
            return
        if item.kind == "callable":
            self.server.unbind(name)
        else:
            self.server._unload_native(name)

    def _load(self, found: Found) -> None:
        """Load (or reload) one model as it is on disk now; on failure what served stays."""
        config = found.path / "config.pbtxt"
        if found.kind == "triton" and re.search(r'backend\s*:\s*"python"', config.read_text(errors="replace")):
            check_python_backend(found.name)
        backend_dir = self.server._repository.backend_dir
        onnx_backend = backend_dir is not None and (backend_dir / "onnxruntime").is_dir()
        if found.kind == "triton" or (
            found.kind == "onnx" and onnx_backend and (found.path / "config.pbtxt").is_file()
        ):
            self.server._load_native(found.name, found.path)  # (an NGC install runs ONNX itself)
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
        self.known[found.name] = found

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
