"""Shared-memory regions that network clients register (KServe/Triton extensions): system
shared memory (POSIX ``shm_open`` objects) and CUDA shared memory (CUDA IPC handles of a
client's GPU allocations). One table per server holds both kinds, as Triton's shared-memory
manager does: a name is one region of either kind, and requests name regions the same way
whatever their kind.

A client on the same host creates a POSIX shared-memory object (``shm_open`` name, a
file in ``/dev/shm``), registers it under a name, and then names that region in a
request's input or output parameters (``shared_memory_region``,
``shared_memory_offset``, ``shared_memory_byte_size``). Inputs are read straight from
the mapping (the arrays Triton and the model see are views of it) and outputs are
written straight into it by Triton's output allocation: the tensor bytes never travel
through the socket.

Shared memory is for same-host clients the server trusts with that memory, but a
client still cannot reach files outside ``/dev/shm`` (keys are POSIX shared-memory
names: no path, no symlink is followed) nor crash the server by shrinking a region
under a request: the mapping is guarded against SIGBUS (``_native.map_shared``) and the
requests that used a shrunk region fail with a clear error.

A CUDA region is a client's ``cudaMalloc`` allocation, opened in this process from its
``cudaIpcMemHandle_t`` (``cudaIpcOpenMemHandle``) on the device the client names. Inputs in it
reach Triton as GPU memory (a :class:`~embedtriton.DeviceArray` view, no copy) and outputs are
allocated in it. Unregistering a region that requests still use does not unmap it under them:
the handle is closed once the last of them lets go (the views keep the region alive).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import weakref
from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.handles import memory as native  # the native functions it needs, through the core
from ..errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, TritonError
from ..triton.devices import cuda_devices

log = logging.getLogger("embedtriton")

SHM_DIR = "/dev/shm"
_NAME_MAX = 255
SYSTEM, CUDA = "system", "cuda"  # the two kinds of region
CUDA_IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


def shm_name(key: str) -> str:
    """The file name in ``/dev/shm`` of a POSIX shared-memory key, as ``shm_open`` takes it:
    leading slashes are dropped, and what is left must be a plain file name."""
    name = key.lstrip("/")
    if not name or "/" in name or name in (".", "..") or "\0" in name or len(name.encode()) > _NAME_MAX:
        raise InvalidArgumentError(
            f"Unable to open shared memory region: '{key}': a key is a POSIX shared-memory name "
            f"such as '/my_region' (a leading '/', then a file name of at most {_NAME_MAX} bytes "
            "with no other '/')"
        )
    return name


@dataclass
class Region:
    """A system shared-memory region."""

    kind: ClassVar[str] = SYSTEM
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: Any  # _native.Mapping of the file's first offset + byte_size bytes
    fd: int  # kept open to check the file's size before each use

    def check(self) -> None:
        """Fail when the client shrank the file under the region (now or while in use)."""
        if self.mapping.truncated:
            raise InvalidArgumentError(
                f"shared-memory region '{self.name}' was shrunk by its owner while a request used it, "
                "so its data is lost; unregister the region and register it again"
            )
        try:
            size = os.fstat(self.fd).st_size
        except OSError as exc:
            raise InvalidArgumentError(f"shared-memory region '{self.name}': {exc.strerror}") from None
        if size < self.offset + self.byte_size:
            raise InvalidArgumentError(
                f"shared-memory region '{self.name}': its owner shrank '{self.key}' to {size} bytes, but "
                f"the region was registered with offset {self.offset} + byte_size {self.byte_size}; "
                "register it again"
            )

    def view(self, offset: int, byte_size: int, what: str) -> memoryview:
        """``byte_size`` bytes at ``offset`` inside the region (checked)."""
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise InvalidArgumentError(
                f"{what}: {byte_size} bytes at offset {offset} do not fit shared-memory region "
                f"'{self.name}' of {self.byte_size} bytes"
            )
        self.check()
        start = self.offset + offset
        return memoryview(self.mapping)[start : start + byte_size]

    def release(self) -> None:
        self.mapping.close()  # unmapped now, or once the last request using it lets go
        os.close(self.fd)

    def status(self) -> dict[str, Any]:
        """The region as Triton's status lists it."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _open_region(name: str, key: str, offset: int, byte_size: int) -> Region:
    file_name = shm_name(key)
    directory = os.open(SHM_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:  # relative to /dev/shm, never following a symlink, never blocking on a FIFO
        fd = os.open(file_name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=directory)
    except OSError as exc:
        raise InvalidArgumentError(f"Unable to open shared memory region: '{key}': {exc.strerror}") from None
    finally:
        os.close(directory)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgumentError(f"Unable to open shared memory region: '{key}' is not a shared-memory object")
        if offset + byte_size > info.st_size:
            raise InvalidArgumentError(
                f"failed to register shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                f"exceed the {info.st_size} bytes of '{key}'"
            )
        try:
            mapping = native().map_shared(fd, offset + byte_size)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot map shared memory region '{name}' ('{key}'): {exc.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return Region(name, key, offset, byte_size, mapping, fd)


def refuse_cuda_without_gpu(name: str) -> None:
    """CUDA shared memory needs a GPU: without one, registering is refused as Triton built
    without GPU support refuses it (its words, then why and what to do instead)."""
    if cuda_devices()[0] == 0:
        raise InvalidArgumentError(
            f"failed to register CUDA shared memory region: '{name}', GPUs not supported "
            "(this server sees no GPU: use system shared memory or send tensors in the request)"
        )


class CudaRegion:
    """A CUDA shared-memory region: a client's GPU allocation opened from its IPC handle.

    Requests use it through :meth:`array` views, which keep it alive; the IPC handle is closed
    when the region is no longer registered and the last view is gone (never under a request).
    """

    kind: ClassVar[str] = CUDA
    __slots__ = ("name", "device_id", "byte_size", "ptr", "_closer", "__weakref__")

    def __init__(self, name: str, device_id: int, byte_size: int, ptr: int) -> None:
        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        self.ptr = ptr  # where cudaIpcOpenMemHandle mapped the allocation in this process
        self._closer = weakref.finalize(self, _ipc_close, native().cuda_ipc_close, ptr, device_id)
        self._closer.atexit = False  # at exit the driver unmaps it: no CUDA call during teardown

    def check(self) -> None:
        """Nothing to check: a client cannot shrink a CUDA allocation under a request."""

    def bounds(self, offset: int, byte_size: int) -> None:
        """Triton's checks of a tensor's offset and byte size against the region (its words)."""
        end = max(self.byte_size - 1, 0)  # the last byte (as Triton's GetMemoryInfo computes it)
        if offset < 0 or offset > end:
            raise InvalidArgumentError(f"Invalid offset for shared memory region: '{self.name}'")
        if byte_size < 0 or offset + byte_size - 1 > end:
            raise InvalidArgumentError(f"Invalid offset + byte size for shared memory region: '{self.name}'")

    def array(self, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
        """A :class:`~embedtriton.DeviceArray` view at ``offset`` (checked with :meth:`bounds`
        by the caller); ``dtype`` None: raw bytes, ``shape`` ``(byte_size,)``."""
        return native().device_array(self.ptr + offset, shape, dtype, self.device_id, self)

    def release(self) -> None:
        """Unregistered: the handle is closed once no request holds a view of the region."""

    def close(self) -> None:
        """Close the handle now (a region never handed to a request)."""
        self._closer()

    def status(self) -> dict[str, Any]:
        """The region as Triton's status lists it."""
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


def _ipc_close(close: Any, ptr: int, device_id: int) -> None:
    try:
        close(ptr, device_id)
    except Exception:  # a finalizer: nothing to raise to
        log.exception("closing a CUDA IPC handle failed")


def _open_cuda_region(name: str, raw_handle: bytes, device_id: int, byte_size: int) -> CudaRegion:
    """Open a client's IPC handle as Triton's RegisterCUDASharedMemory does, with its words:
    "failed to register shared memory region: invalid args" when the handle does not open on the
    device, "failed to register shared memory region '<name>': invalid args" when ``byte_size``
    exceeds the allocation; the reason follows in parentheses (Triton only logs it). The
    handle's length and the device id are checked before CUDA sees them."""
    invalid = "failed to register shared memory region: invalid args"
    if len(raw_handle) != CUDA_IPC_HANDLE_BYTES:
        raise InvalidArgumentError(
            f"{invalid} (raw_handle must be the {CUDA_IPC_HANDLE_BYTES} bytes of a cudaIpcMemHandle_t, "
            f"not {len(raw_handle)})"
        )
    count = cuda_devices()[0]
    if not 0 <= device_id < count:
        raise InvalidArgumentError(f"{invalid} (device_id {device_id}: this server sees {count} GPU(s))")
    if byte_size < 0:
        raise InvalidArgumentError(f"{invalid} (byte_size {byte_size} is negative)")
    try:
        ptr = native().cuda_ipc_open(bytes(raw_handle), device_id)
    except TritonError as exc:
        log.error("failed to open CUDA IPC handle: %s", exc)
        raise InvalidArgumentError(f"{invalid} ({exc})") from None
    region = CudaRegion(name, device_id, byte_size, ptr)
    try:
        size = _allocation_size(ptr, device_id)
    except TritonError as exc:
        region.close()
        log.error("%s", exc)
        raise InvalidArgumentError(f"failed to register shared memory region '{name}': invalid args ({exc})") from None
    if byte_size > size:
        region.close()
        raise InvalidArgumentError(
            f"failed to register shared memory region '{name}': invalid args (byte_size {byte_size} exceeds "
            f"the {size} bytes of the CUDA allocation)"
        )
    return region


def _allocation_size(ptr: int, device_id: int) -> int:
    """The bytes of the CUDA allocation from ``ptr`` to its end (``cuMemGetAddressRange``, as
    Triton checks a registration)."""
    return int(native().cuda_allocation_size(ptr, device_id))


class SharedMemory:
    """The registered regions of one server, system and CUDA, by name (one name, one region of
    either kind, as in Triton's shared-memory manager)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[str, Region | CudaRegion] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidArgumentError("a shared-memory region needs a name")
        if byte_size <= 0 or offset < 0:
            raise InvalidArgumentError(f"shared-memory region '{name}': byte_size must be > 0 and offset >= 0")
        with self._lock:
            if name in self._regions:
                raise AlreadyExistsError(f"shared memory region '{name}' already in manager; unregister it first")
        region = _open_region(name, key, offset, byte_size)
        with self._lock:
            if name in self._regions:
                region.release()
                raise AlreadyExistsError(f"shared memory region '{name}' already in manager; unregister it first")
            self._regions[name] = region

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register a client's CUDA allocation (its ``cudaIpcMemHandle_t``) on GPU ``device_id``."""
        refuse_cuda_without_gpu(name)
        if not name:
            raise InvalidArgumentError("'region name' is necessary to register cuda shared memory region")
        with self._lock:
            if name in self._regions:
                raise AlreadyExistsError(f"shared memory region '{name}' already in manager; unregister it first")
        region = _open_cuda_region(name, raw_handle, device_id, byte_size)
        with self._lock:
            if name not in self._regions:
                self._regions[name] = region
                return
        region.close()
        raise AlreadyExistsError(f"shared memory region '{name}' already in manager; unregister it first")

    def unregister(self, name: str = "", kind: str = SYSTEM) -> None:
        """Forget one region of ``kind``, or all of them when ``name`` is empty; a name that is
        not a region of that kind is left alone (as Triton does, with no error)."""
        with self._lock:
            names = [name] if name else list(self._regions)
            regions = [self._regions.pop(n) for n in names if n in self._regions and self._regions[n].kind == kind]
        for region in regions:
            region.release()

    def clear(self) -> None:
        """Forget every region, of both kinds (the server stops)."""
        with self._lock:
            regions, self._regions = list(self._regions.values()), {}
        for region in regions:
            region.release()

    def status(self, name: str = "", kind: str = SYSTEM) -> list[Any]:
        """The regions of ``kind``, or the one named (NOT_FOUND in Triton's words otherwise)."""
        with self._lock:
            if not name:
                return [r for r in self._regions.values() if r.kind == kind]
            region = self._regions.get(name)
        if region is None:
            raise NotFoundError(f"Unable to find {'cuda' if kind == CUDA else 'system'} shared memory region: '{name}'")
        if region.kind != kind:
            kinds = ("CUDA shared memory", "system shared memory")
            was, asked = kinds if region.kind == CUDA else kinds[::-1]
            raise NotFoundError(f"The region named '{name}' is registered as {was}, not {asked}")
        return [region]

    def get(self, name: str) -> Region | CudaRegion:
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise InvalidArgumentError(f"Unable to find shared memory region: '{name}'")
        return region


_of_server: weakref.WeakKeyDictionary[Any, SharedMemory] = weakref.WeakKeyDictionary()
_of_server_lock = threading.Lock()


def regions_of(server: Any) -> SharedMemory:
    """The regions of a server: one table for all its endpoints, as in Triton (a region
    registered over HTTP can be named in a gRPC request)."""
    with _of_server_lock:
        table = _of_server.get(server)
        if table is None:
            table = _of_server[server] = SharedMemory()
        return table
