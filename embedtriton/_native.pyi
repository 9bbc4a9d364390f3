"""Types of embedtriton._native, the per-request data path (C: embedtriton/native/_native/).

Opaque values: a server handle is the int address of a TRITONSERVER_Server (from
embedtriton.triton.control); stream and request handles are capsules that only this module reads.
"""

import asyncio
from collections import abc
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias, TypedDict, final

from numpy.typing import NDArray
from typing_extensions import Buffer, CapsuleType

from .backend.binding import Binding
from .backend.request import Request
from .core.request import InferRequest
from .errors import TritonError

_ServerHandle: TypeAlias = int  # a TRITONSERVER_Server*
_Stream: TypeAlias = CapsuleType  # "embedtriton.stream" (submit(..., stream=True))
_RequestHandle: TypeAlias = CapsuleType  # "embedtriton.request" (submit(..., cancellable=True))
_Outputs: TypeAlias = dict[str, NDArray[Any]]  # output name -> array (BYTES: an object array of bytes)
# A mapping of input name -> numpy array, anything numpy turns into one, or an object with __dlpack__.
_Inputs: TypeAlias = abc.Mapping[str, Any]
# None: every output; names; or name -> a writable C-contiguous buffer to write it into (or None).
_OutputsRequested: TypeAlias = Sequence[str] | abc.Mapping[str, Buffer | None] | None
_TraceSink: TypeAlias = Callable[[int, tuple[int, ...]], object]  # (trace id, Triton's timestamps)
_Target: TypeAlias = Callable[[_Outputs | None, BaseException | None], object]  # (outputs, None) or (None, error)

def load(handle: int, /) -> None:
    """Resolve the Triton C API from a dlopen handle of libtritonserver (once)."""

def set_hooks(
    bindings: dict[str, Binding],
    request_type: type[Request],
    make_error: Callable[[int, str], TritonError],
    decode_bytes: Callable[[Any, tuple[int, ...]], NDArray[Any]],
    encode_bytes: Callable[[NDArray[Any]], bytes],
    request_done: Callable[[int], object],
    /,
) -> None:
    """Install the Python hooks: bindings by model directory, the Request class, the error
    factory, the BYTES codec and the callback that ends an iterative request's generator."""

def submit(
    server: _ServerHandle | None,
    model: str,
    version: int,
    request: InferRequest | dict[str, Any],
    loop: asyncio.AbstractEventLoop | None,
    future: asyncio.Future[_Outputs] | _Target | Callable[[], object] | None,
    stream: bool,
    cancellable: bool,
    release_gil: bool,
    /,
) -> _Outputs | _Stream | _RequestHandle | None:
    """Submit one inference request.

    The request's fields are read once, as they are: ``inputs`` (_Inputs), ``outputs``
    (_OutputsRequested), ``request_id``, ``priority``, ``timeout_us``, ``parameters``,
    ``sequence`` ((correlation id, Triton sequence flags) or None), ``output_device`` (a GPU
    index; -1: host memory) and ``trace_sink`` (_TraceSink or None). A dict is the inputs of a
    request with no options (``Model.infer``'s without them).

    Three modes, by ``loop`` and ``future``:

    - neither (wait): blocks (GIL released) and returns the outputs; refused on a model's own
      thread where it would wait for itself;
    - a loop (asyncio): ``future`` (future-like) is resolved on the loop;
    - a target (no loop, ``future`` callable): called once as ``future(outputs, None)`` or
      ``future(None, error)`` on the thread that completes the request, with the GIL; the
      network frontends answer from there.

    The last two return None, or a handle for cancel() when cancellable. With stream: returns a
    stream for stream_next() (with a loop, ``future`` is the callable that wakes the consumer).
    ``release_gil``: hand the request to Triton without the GIL.
    """

def submit_many(
    server: _ServerHandle,
    model: str,
    version: int,
    request: InferRequest,
    inputs: list[dict[str, Any]],
    parameters: list[abc.Mapping[str, Any] | None] | None,
    sinks: list[_TraceSink | None] | None,
    window: int,
    release_gil: bool,
    /,
) -> list[_Outputs | BaseException]:
    """Submit many requests, at most ``window`` in flight; wait for all. Each request's
    outputs, or its exception, in order. ``request`` carries the options they share, read
    as submit() reads them (its own inputs are not sent); a request's entry of
    ``parameters`` (tracing's), when given and not None, replaces the shared parameters, and
    its entry of ``sinks`` is its trace sink."""

def stream_next(stream: _Stream, block: bool, /) -> tuple[Literal[0], _Outputs] | tuple[Literal[1, 2], None]:
    """The next response of a stream: (0, outputs), (1, None) when none is there yet
    (block=False) or (2, None) at the end. An error response raises."""

def stream_close(stream: _Stream, /) -> None:
    """Close a stream (cancels its request if unfinished)."""

def cancel(handle: _RequestHandle, /) -> None:
    """Cancel a request by the handle submit() gave (cancellable=True)."""

def grpc_model_infer(
    call: Any,
    data: bytes,
    table: dict[tuple[str, str], tuple[Any, int | None]],
    bound: dict[str, Any],
    server: _ServerHandle | None,
    /,
) -> _RequestHandle | tuple[str, str] | None:
    """Take a unary gRPC ModelInfer (``call``: an embedtriton._h2.Call, ``data``: its message) in C:
    decoded, submitted without the GIL and answered on Triton's thread; returns its cancel handle.
    None: declined (not a plain request: the Python path answers). (model_name, model_version):
    ``table`` has no entry for them whose binding is still ``bound``'s; an entry is (binding,
    version), version None for a model the C path does not take."""

_HTTP_FAST: CapsuleType  # the C handler of plain HTTP/REST inference requests, for _h2.HttpServer.set_fast

def http_stats() -> tuple[int, int]:
    """(taken, declined): the HTTP/REST inference requests the C path took and declined."""

class _JsonDecoded(TypedDict):
    id: str
    inputs: list[tuple[str, str, tuple[int, ...], bytes]]  # (name, datatype, shape, values' bytes)
    outputs: list[tuple[str, bool]]  # (name, binary_data)
    binary_data_output: bool

def kserve_json_decode(body: bytes, header_len: int, /) -> _JsonDecoded | None:
    """What the HTTP C path reads of an inference request body; None when it is not plain (tests)."""

def kserve_json_double(value: float, /) -> str:
    """A float as the C path's JSON answers write it: Python's repr (tests)."""

def release_answered() -> int:
    """Let go of the calls the C paths (gRPC and HTTP) answered since a request last took them
    (their _h2 calls and messages), as an endpoint stops; returns how many."""

def response_stats() -> tuple[int, int]:
    """(kept, buried): responses read and deleted on the thread that sent them (our backend's
    plain responses), and responses left to the graveyard (deleted 20 ms or more later)."""

def linger_stats() -> tuple[int, int]:
    """(lingers, caught): how often a model thread lingered after an execute that left nothing
    in flight (EMBEDTRITON_LINGER_US, default 250), and how often the next request came meanwhile."""

def grpc_stats() -> tuple[int, int]:
    """(taken, declined): the ModelInfer calls grpc_model_infer took and declined."""

class _Decoded(TypedDict):
    model_name: str
    model_version: str
    id: str
    inputs: list[tuple[str, str, tuple[int, ...], bytes]]  # (name, datatype, shape, raw contents)
    outputs: list[str]

def kserve_decode(data: bytes, /) -> _Decoded | None:
    """What grpc_model_infer reads of a ModelInferRequest; None when it is not plain (tests)."""

def _complete(loop: Any, calls: list[CapsuleType], /) -> None:
    """Finish asyncio calls (runs on their event loop)."""

def pending(server: _ServerHandle, /) -> tuple[int, int]:
    """(calls not completed, requests Triton still holds) of a server."""

def cancel_all(server: _ServerHandle, /) -> int:
    """Cancel every request Triton holds for a server; returns the count."""

def fail_pending(server: _ServerHandle, /) -> int:
    """Fail every call of a server that Triton has not completed (stop's deadline); returns the count."""

def abort_pending(server: _ServerHandle, /) -> int:
    """Fail every call of a deleted server that Triton never completed; returns the count."""

def open_server(server: _ServerHandle, /) -> None:
    """Accept requests for a server."""

def mark_model_thread() -> None:
    """This thread runs async callables (the library's event loop)."""

def finish_batch(batch: object, result: object, /) -> None:
    """Answer an async callable's batch (event loop side)."""

def in_model() -> bool:
    """Whether this thread is running a model's callable (its calls are model-to-model calls)."""

def close_server(server: _ServerHandle, /) -> None:
    """Stop accepting requests for a server (waits for submissions under way)."""

def delete_released() -> int:
    """Delete the requests and responses Triton released long enough ago; returns how many wait."""

def gate_stats(server: _ServerHandle, /) -> list[tuple[str, int, int, int, int, int, int, int]]:
    """(model, version, waiting, waited_ns, rejected, rejected_ns, cancelled, cancelled_ns) per
    queue-policy gate of a server (see native/_native/queues.c)."""

def map_shared(fd: int, length: int, /) -> _Mapping:
    """Map the first length bytes of a shared-memory file read-write, guarded against SIGBUS."""

# The type's name at runtime is embedtriton._native.Mapping, but the module does not export it:
# map_shared() is the only way to get one.
@final
class _Mapping:
    """A shared-memory file mapped read-write, guarded against SIGBUS (see map_shared)."""

    @property
    def truncated(self) -> bool:
        """Whether an access found the file shrunk under the mapping (its data is lost)."""
    @property
    def size(self) -> int:
        """Mapped bytes."""
    def close(self) -> None:
        """Unmap (now, or when the last view of it is released)."""
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@final
class DeviceArray:
    """C-contiguous GPU memory: an output in GPU memory (output_device="gpu"), a view of a GPU
    input (gpu_arrays="dlpack") or of a CUDA shared-memory region. No copy through DLPack."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> Any: ...  # a numpy dtype ("BF16" for bfloat16)
    @property
    def device(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __dlpack__(self, *args: Any, **kwargs: Any) -> CapsuleType: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def to_numpy(self) -> NDArray[Any]: ...

def cuda_init(path: str, /) -> int:
    """Load the CUDA runtime at path for device copies (once); the number of GPUs it sees."""

def device_array(ptr: int, shape: Sequence[int], dtype: Any, device: int, owner: object, /) -> DeviceArray:
    """A view of device memory at ptr that keeps owner alive (dtype None: bytes)."""

def cuda_ipc_open(handle: bytes, device: int, /) -> int:
    """Open a client's cudaIpcMemHandle_t (64 bytes) on device; the device address."""

def cuda_ipc_close(ptr: int, device: int = 0, /) -> None:
    """Close what cuda_ipc_open opened (on its device)."""

def cuda_allocation_size(ptr: int, device: int, /) -> int:
    """Bytes from ptr to the end of its device allocation (cuMemGetAddressRange)."""
