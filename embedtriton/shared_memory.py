"""System shared-memory regions that gRPC clients register (KServe/Triton extension).

A client on the same host creates a POSIX shared-memory object (``/dev/shm/<key>``),
registers it under a name, and then names that region in a request's input or output
parameters (``shared_memory_region``, ``shared_memory_offset``,
``shared_memory_byte_size``). Inputs are read straight from the mapping (the arrays Triton
and the model see are views of it) and outputs are written straight into it by Triton's
output allocation: the tensor bytes never travel through the socket.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass

from .errors import AlreadyExistsError, InvalidArgumentError, NotFoundError


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def view(self, offset: int, byte_size: int, what: str) -> memoryview:
        """``byte_size`` bytes at ``offset`` inside the region (checked)."""
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise InvalidArgumentError(
                f"{what}: {byte_size} bytes at offset {offset} do not fit shared-memory region "
                f"'{self.name}' of {self.byte_size} bytes"
            )
        start = self.offset + offset
        return memoryview(self.mapping)[start : start + byte_size]


class SystemSharedMemory:
    """The registered regions of one endpoint, by name."""

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
                raise AlreadyExistsError(f"shared-memory region '{name}' is already registered; unregister it first")
        path = "/dev/shm/" + key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise InvalidArgumentError(
                f"cannot open shared-memory region '{name}' with key '{key}': {exc.strerror}"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise InvalidArgumentError(
                    f"shared-memory region '{name}': offset {offset} + byte_size {byte_size} exceed "
                    f"the {size} bytes of '{key}'"
                )
            mapping = mmap.mmap(fd, offset + byte_size)
        finally:
            os.close(fd)
        with self._lock:
            if name in self._regions:
                mapping.close()
                raise AlreadyExistsError(f"shared-memory region '{name}' is already registered; unregister it first")
            self._regions[name] = Region(name, key, offset, byte_size, mapping)

    def unregister(self, name: str = "") -> None:
        """Forget one region, or all of them when ``name`` is empty."""
        with self._lock:
            names = [name] if name else list(self._regions)
            regions = [self._regions.pop(n) for n in names if n in self._regions]
        for region in regions:
            try:
                region.mapping.close()
            except BufferError:
                pass  # a request still uses it: the mapping goes when its last view does

    def status(self, name: str = "") -> list[Region]:
        with self._lock:
            if name and name not in self._regions:
                raise NotFoundError(f"no shared-memory region named '{name}' is registered")
            return [self._regions[name]] if name else list(self._regions.values())

    def get(self, name: str) -> Region:
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise InvalidArgumentError(f"shared-memory region '{name}' is not registered")
        return region
