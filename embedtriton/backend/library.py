"""The one owner of the contract between Python and the native module.

``embedtriton._native`` is one shared library with two faces: the CPython extension that
submits requests (caller side) and the Triton backend ``embedtriton`` that Triton dlopens
from the same file (model side). This module loads it once, wires it to the process's
Triton runtime, hands it its Python hooks, and keeps the registry it reads at model load
(model directory -> :class:`Binding`). :class:`NativeModel` lists what the backend reads of
a binding.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import error_for_code
from ..tensors import decode_bytes, encode_bytes
from ..triton import capi
from ..triton.devices import cuda_runtime_path
from ..triton.runtime import find_runtime
from . import aio
from .binding import BACKEND_NAME, Binding, FastBatch, OutputSpec, QueueGate
from .request import Request
from .runners import request_done

STREAM_ITEM, STREAM_EMPTY, STREAM_END = 0, 1, 2  # statuses of _native.stream_next

bindings: dict[str, Binding] = {}  # model directory -> binding, read by the native backend at model load


class NativeModel(Protocol):
    """What the native backend reads of a bound model (see :class:`Binding`): every attribute
    and method the C looks up on it (tests/unit/test_native_layers.py reads the C for them)."""

    name: str
    max_batch_size: int
    output_specs: list[OutputSpec]
    decoupled: bool
    iterative: bool
    sequence: bool
    with_batcher: bool  # Triton's batcher thread hands requests over (how an instance thread lingers)
    batch_rule: Any
    queue_gate: QueueGate | None  # priorities and queue policies the backend applies (queues.c)
    fast_batch: FastBatch | None  # a plain @batch function the backend calls itself (fast_batch.c)
    gpu_wrap: Any  # how GPU inputs reach the callable (None: as DeviceArray)
    gpu_inputs: tuple[str | None, ...]  # inputs the callable wants in GPU memory
    warmup_runs: int  # executes at load that answer nobody (warm-up)
    warming: bool  # the server is loading it (a warm-up's failure is recorded, not sent)
    warmup_error: str | None  # written by the backend: the first warm-up failure

    def execute(self, requests: list[Request]) -> Any: ...  # a batch: outputs per request, steps, or a message
    def schedule(self, coroutine: Any, batch: Any) -> None: ...  # an async callable's batch, to finish later
    def _iterate(self, step: list[tuple[int, Request | None]]) -> list[tuple[Any, bool]]: ...  # iterative only
    def _knows(self, key: int) -> bool: ...  # iterative only
    def _forget(self, key: int) -> None: ...  # iterative only
    def _include(self, batch: list[Request], candidate: Request) -> bool: ...  # with a batch rule only
    def _loaded(self, delta: int) -> None: ...  # +1 when Triton initializes a copy, -1 when it finalizes one


if TYPE_CHECKING:  # (mypy: a Binding is what the backend reads)
    _binding: type[NativeModel] = Binding


_native: Any = None


def native() -> Any:
    """The native module, wired to the process's Triton runtime and its hooks (once)."""
    global _native
    if _native is None:
        try:
            from .. import _native as module
        except ImportError as exc:  # e.g. `python -m embedtriton` run inside a source checkout
            package = Path(__file__).resolve().parents[1]
            raise ImportError(
                f"embedtriton's native module is not built in {package}: this is a source folder (the "
                "current directory comes first on sys.path). Run from another folder so that the installed "
                "package is imported, or build in place with `pip install -e .`"
            ) from exc

        module.load(capi.api().handle)
        module.set_hooks(bindings, Request, error_for_code, decode_bytes, encode_bytes, request_done)
        cudart = cuda_runtime_path()
        if cudart is not None:  # device copies and GPU outputs (Triton's own CUDA runtime)
            module.cuda_init(cudart)
        aio.native = module
        _native = module
    return _native


def library_path() -> str:
    """The native module's file: also the backend library and the batch strategy library."""
    return native().__file__


def install_backend(root: Path) -> Path:
    """Lay out Triton's backend folder under ``root`` (returned): ours, ``embedtriton``, and
    the runtime's own backends (python, onnxruntime, ... as the runtime has them).

    The nvidia-pytriton wheel's backends find their libraries through RPATHs relative to the
    wheel's layout (``$ORIGIN/../../../../nvidia_pytriton.libs``), so the folder mirrors that
    layout with links; its python backend gets the stub built for this Python version. An NGC
    install's backends (``$EMBEDTRITON_TRITON_HOME/backends``) are linked as they are."""
    runtime = find_runtime()
    wheel = runtime.lib_dir.parent / "pytriton" / "tritonserver"
    if (wheel / "backends").is_dir():
        (root / runtime.lib_dir.name).symlink_to(runtime.lib_dir, target_is_directory=True)
        folder = root / "pytriton" / "tritonserver" / "backends"
        folder.mkdir(parents=True)
        python, stub = wheel / "backends" / "python", wheel / "python_backend_stubs" / "{}.{}".format(*sys.version_info)
        if (python / "libtriton_python.so").is_file() and (stub / "triton_python_backend_stub").is_file():
            (folder / "python").mkdir()
            for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
                (folder / "python" / name).symlink_to(python / name)
            (folder / "python" / "triton_python_backend_stub").symlink_to(stub / "triton_python_backend_stub")
    else:
        folder = root
        installed = runtime.lib_dir.parent / "backends"
        for backend in sorted(installed.iterdir()) if installed.is_dir() else ():
            if backend.is_dir() and backend.name != BACKEND_NAME:
                (folder / backend.name).symlink_to(backend, target_is_directory=True)
    ours = folder / BACKEND_NAME
    ours.mkdir()
    (ours / f"libtriton_{BACKEND_NAME}.so").symlink_to(library_path())
    return folder
