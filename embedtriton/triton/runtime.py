"""Finding and loading a Triton runtime (``libtritonserver`` and its folders).

Two sources, in this order:

1. ``EMBEDTRITON_TRITON_HOME``: a Triton install such as ``/opt/tritonserver``
   with ``lib/libtritonserver.so``, ``backends/`` and ``caches/``.
2. The runtime bundled in an installed ``nvidia-pytriton`` wheel
   (``pip install --no-deps nvidia-pytriton==0.7.0``): its
   ``nvidia_pytriton.libs/libtritonserver-<hash>.so`` and ``pytriton/tritonserver/caches``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import NotFoundError, UnavailableError

HOME_VARIABLE = "EMBEDTRITON_TRITON_HOME"
HOW_TO_GET_ONE = (
    "no Triton runtime found. Either install the one bundled with PyTriton:\n"
    "    pip install --no-deps nvidia-pytriton==0.7.0\n"
    f"or point {HOME_VARIABLE} at a Triton install (a folder with lib/libtritonserver.so, "
    "e.g. /opt/tritonserver from the Triton container)."
)


@dataclass(frozen=True)
class Runtime:
    """Where a Triton runtime's files are."""

    library: Path  # libtritonserver shared library
    caches: Path | None  # folder of cache implementations (local, redis)
    origin: str  # how it was found, for messages

    @property
    def lib_dir(self) -> Path:
        return self.library.parent


def _from_home(home: str) -> Runtime:
    root = Path(home).expanduser()
    library = root / "lib" / "libtritonserver.so"
    if not library.is_file():
        raise NotFoundError(
            f"{HOME_VARIABLE}={home} holds no lib/libtritonserver.so; point it at a Triton "
            "install or unset it to use the nvidia-pytriton wheel's runtime"
        )
    caches = root / "caches"
    return Runtime(library, caches if caches.is_dir() else None, f"{HOME_VARIABLE}={home}")


def _from_pytriton_wheel() -> Runtime | None:
    spec = importlib.util.find_spec("pytriton")  # finds without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    libs = package.parent / "nvidia_pytriton.libs"
    found = sorted(libs.glob("libtritonserver*.so")) if libs.is_dir() else []
    if not found:
        return None
    caches = package / "tritonserver" / "caches"
    return Runtime(found[0], caches if caches.is_dir() else None, "nvidia-pytriton wheel")


def find_runtime() -> Runtime:
    """Locate a Triton runtime, or raise :class:`NotFoundError` naming both ways to get one."""
    home = os.environ.get(HOME_VARIABLE)
    if home:
        return _from_home(home)
    runtime = _from_pytriton_wheel()
    if runtime is None:
        raise NotFoundError(HOW_TO_GET_ONE)
    return runtime


def runtime_nghttp2() -> str | None:
    """The Triton runtime's own libnghttp2 (the wheel bundles one), for machines without the
    system's; None without a runtime or a copy."""
    try:
        found = sorted(find_runtime().lib_dir.glob("libnghttp2*.so*"))
    except NotFoundError:
        return None
    return str(found[0]) if found else None


_MISSING = re.compile(r"([^\s:]+\.so[^\s:]*): cannot open shared object file")
_lock = threading.Lock()
_loaded: tuple[Runtime, ctypes.CDLL] | None = None
_keep: list[ctypes.CDLL] = []  # preloaded dependencies stay loaded for the process


def load_runtime() -> tuple[Runtime, ctypes.CDLL]:
    """Load ``libtritonserver`` once per process and return it with its :class:`Runtime`.

    The wheel's library finds its direct dependencies through RUNPATH ``$ORIGIN``, but
    their own dependencies (libnghttp2, libicuuc, ...) do not resolve without help: each
    "cannot open shared object file" names one, which we load from the same folder and
    retry. The folder's bundled libpython is never loaded.
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        runtime = find_runtime()
        library = _load_with_dependencies(runtime)
        _loaded = (runtime, library)
        return _loaded


def _load_with_dependencies(runtime: Runtime) -> ctypes.CDLL:
    """dlopen the library; on a missing dependency, load that one first (depth first)."""
    stack = [runtime.library]
    while True:
        target = stack[-1]
        try:
            handle = ctypes.CDLL(str(target), mode=ctypes.RTLD_LOCAL)
        except OSError as exc:
            missing = _MISSING.search(str(exc))
            candidate = runtime.lib_dir / missing.group(1) if missing else None
            if (
                candidate is None
                or not candidate.is_file()
                or candidate in stack
                or candidate.name.startswith("libpython")
                or len(stack) > 64
            ):
                raise UnavailableError(
                    f"cannot load the Triton runtime {runtime.library} ({runtime.origin}): {exc}"
                ) from exc
            stack.append(candidate)
            continue
        stack.pop()
        if not stack:
            return handle
        _keep.append(handle)
