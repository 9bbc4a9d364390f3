"""The stub processes of Triton's python backend: none outlives this process.

Triton's python backend runs each model instance in a process of its own (a stub) that
names its shared memory with a prefix we set per process (``shm-region-prefix-name``). A stub
notices that the server went away by polling its parent's pid, and most do exit; but a stub
still starting, or one that deadlocks in its own exit, stays behind when the server is killed
(SIGKILL, an OOM kill), holding its shared memory. So the first python-backend model a
process loads starts a small guard: a Python process reading a pipe that only this process
holds. When the pipe closes (this process ended, however it ended) the guard kills every stub
whose shared-memory name carries this process's prefix and removes those regions.

The guard runs in a session of its own, so a Ctrl-C aimed at the application's terminal does
not end it before the application has stopped its stubs itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

STUB = "triton_python_backend_stub"
_lock = threading.Lock()
_guard: tuple[int, Any] | None = None  # (the pid it guards, its Popen)


def prefix(pid: int | None = None) -> str:
    """The shared-memory prefix of this process's python-backend stubs (a server adds its own
    number after it)."""
    return f"embedtriton_{os.getpid() if pid is None else pid}_"


def guard_stubs() -> None:
    """Start this process's stub guard, once (again in a forked child)."""
    global _guard
    with _lock:
        if _guard is not None and _guard[0] == os.getpid() and _guard[1].poll() is None:
            return
        guard = subprocess.Popen(
            [sys.executable, "-I", __file__, prefix()],
            stdin=subprocess.PIPE,  # (close-on-exec here: stubs and other children never hold it)
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        _guard = (os.getpid(), guard)


def stubs_of(shm_prefix: str) -> list[int]:
    """The pids of running stubs whose shared-memory region name starts with ``shm_prefix``
    (a stub's second argument)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[0].endswith(STUB.encode()) and argv[2].startswith(shm_prefix.encode()):
            found.append(int(entry))
    return found


def regions_of(shm_prefix: str) -> list[str]:
    """The names of the /dev/shm regions whose name starts with ``shm_prefix``."""
    try:
        return [name for name in os.listdir("/dev/shm") if name.startswith(shm_prefix)]
    except OSError:
        return []


def _watch(shm_prefix: str) -> None:
    """The guard: wait until the pipe closes, then kill what is left and free its memory."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    for pid in stubs_of(shm_prefix):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for name in regions_of(shm_prefix):
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:  # gone meanwhile: one region does not keep the others
            pass


if __name__ == "__main__":
    _watch(sys.argv[1])
