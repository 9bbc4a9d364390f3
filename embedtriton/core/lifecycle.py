"""When a stopped Triton server may be deleted: the process-wide rules.

Deleting a Triton server resets process-wide memory managers (the pinned-memory manager
above all), under any other server still running in the process. So a stopped server is
only deleted once no other one runs: until then it waits here ("retired"), stopped, its
models unloaded. A server whose callable was still running at stop()'s deadline also waits
until Triton has let go of its last request, then (for up to a second) until Triton has finalized
its models: Triton destroys an unloaded model on a thread of its own once the last request that
refers to it is deleted, and deleting the server under that thread crashes the process.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

from ..backend import library
from ..errors import AlreadyExistsError, TritonError
from ..triton import control

log = logging.getLogger("embedtriton")

lock = threading.Lock()  # ServerNew, ServerDelete and these collections
live_servers: weakref.WeakSet[Any] = weakref.WeakSet()  # started servers (stopped at exit)
_running: set[int] = set()  # handles of started, not yet stopped servers
_retired: list[int] = []  # handles of stopped servers not deleted yet
_unfinalized: list[Any] = []  # bindings of retired servers that Triton had not finalized yet
FINALIZE_WAIT_S = 1.0  # how long a deletion waits for Triton to finalize the models
FINALIZE_GRACE_S = 0.02  # Triton's model destructor goes on briefly after our ModelFinalize
_reaper: threading.Thread | None = None


def new_server(options: int) -> int:
    """A new Triton server; servers retired earlier are deleted first when that is safe."""
    with lock:
        reap()
        try:
            handle = control.new_server(options)
        except AlreadyExistsError as exc:
            if "CacheManager" not in str(exc) or not _retired:
                raise
            raise AlreadyExistsError(
                f"{exc}: Triton keeps one response cache per process, and a stopped server that had one is "
                f"not deleted yet (a stopped server is deleted only once no other runs in the process; "
                f"{len(_running)} run now). Stop the other servers first, or keep one server with "
                "cache_config for the life of the process"
            ) from None
        _running.add(handle)
        return handle


def reap() -> bool:
    """Delete the retired servers when that is safe (call with ``lock`` held).
    Returns whether some are left."""
    if not _retired or _running:
        return bool(_retired)
    native = library.native()
    if any(native.pending(handle)[1] for handle in _retired):
        return True  # a callable still runs: Triton holds its requests
    deadline = time.monotonic() + 0.1  # released requests go 20-40 ms late (see bury())
    while native.delete_released() and time.monotonic() < deadline:
        time.sleep(0.005)
    if _unfinalized:  # deleting the last requests set Triton's model destructors off: let them end
        until = time.monotonic() + FINALIZE_WAIT_S  # (one that never ends is deleted under, as before)
        waits = [b.wait_finalized(max(until - time.monotonic(), 0.0), native.delete_released) for b in _unfinalized]
        if all(waits):
            time.sleep(FINALIZE_GRACE_S)
        _unfinalized.clear()
    for handle in _retired:
        try:
            control.delete_server(handle)
        except TritonError as exc:
            log.warning("deleting Triton: %s", exc)
        aborted = native.abort_pending(handle)
        if aborted:
            log.warning("%d request(s) were still in flight when the server was deleted", aborted)
    _retired.clear()
    return False


def retire(handle: int, bindings: Iterable[Any] = ()) -> None:
    """A stopped server: delete it now or, when unsafe, later (see ``reap``). ``bindings``:
    its bound models, which Triton must have finalized first."""
    global _reaper
    with lock:
        _running.discard(handle)
        _retired.append(handle)
        _unfinalized.extend(b for b in bindings if getattr(b, "alive", False))
        if not reap() or _running or (_reaper is not None and _reaper.is_alive()):
            return
        _reaper = threading.Thread(target=_reap_later, name="embedtriton-reaper", daemon=True)
        _reaper.start()


def _reap_later() -> None:
    """Wait for the callables of retired servers to return, then delete the servers."""
    while True:
        time.sleep(0.05)
        with lock:
            if _running or not reap():
                return


@atexit.register
def _stop_all() -> None:
    for server in list(live_servers):
        server.stop()
    with lock:
        if reap():
            log.warning("a model's callable was still running at exit; its server was not deleted")
