"""System shared-memory regions that network clients register (KServe/Triton extension).

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
"""

from __future__ import annotations

import os
import stat
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ..backend.library import native
from ..errors import AlreadyExistsError, InvalidArgumentError, NotFoundError

SHM_DIR = "/dev/shm"
_NAME_MAX = 255


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


class SystemSharedMemory:
    """Registered regions, by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[str, Region] = {}

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

    def unregister(self, name: str = "") -> None:
        """Forget one region, or all of them when ``name`` is empty."""
        with self._lock:
            names = [name] if name else list(self._regions)
            regions = [self._regions.pop(n) for n in names if n in self._regions]
        for region in regions:
            region.release()

    def status(self, name: str = "") -> list[Region]:
        with self._lock:
            if name and name not in self._regions:
                raise NotFoundError(f"Unable to find system shared memory region: '{name}'")
            return [self._regions[name]] if name else list(self._regions.values())

    def get(self, name: str) -> Region:
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise InvalidArgumentError(f"Unable to find shared memory region: '{name}'")
        return region


_of_server: weakref.WeakKeyDictionary[Any, SystemSharedMemory] = weakref.WeakKeyDictionary()
_of_server_lock = threading.Lock()


def regions_of(server: Any) -> SystemSharedMemory:
    """The regions of a server: one table for all its endpoints, as in Triton (a region
    registered over HTTP can be named in a gRPC request)."""
    with _of_server_lock:
        table = _of_server.get(server)
        if table is None:
            table = _of_server[server] = SystemSharedMemory()
        return table
