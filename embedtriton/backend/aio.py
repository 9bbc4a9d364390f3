"""The library's event loop, on a daemon thread of its own (started at first use): the
coroutines of ``async def`` callables run on it, so they can ``await`` other models while
Triton schedules other batches on the model's instance."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("embedtriton")

_loop: asyncio.AbstractEventLoop | None = None
_thread_id: int | None = None
_lock = threading.Lock()
_tasks: set[asyncio.Task[Any]] = set()  # strong references: the loop keeps only weak ones
native: Any = None  # the native module, set by library.native() when it loads it


def loop() -> asyncio.AbstractEventLoop:
    """The event loop that runs async callables."""
    global _loop
    if _loop is None:
        with _lock:
            if _loop is None:
                _loop = _start()
    return _loop


def _start() -> asyncio.AbstractEventLoop:
    new = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        global _thread_id
        asyncio.set_event_loop(new)
        native.mark_model_thread()  # calls from here are model-to-model calls
        _thread_id = threading.get_ident()
        ready.set()
        new.run_forever()

    threading.Thread(target=run, name="embedtriton-async-models", daemon=True).start()
    ready.wait()
    return new


def schedule(coroutine: Coroutine[Any, Any, Any], batch: Any) -> None:
    """Run ``coroutine`` on the loop, then answer ``batch`` with its result (the backend's
    ``finish_batch``)."""
    loop().call_soon_threadsafe(_begin, coroutine, batch, native.finish_batch)


def _begin(coroutine: Coroutine[Any, Any, Any], batch: Any, finish: Callable[[Any, Any], None]) -> None:
    task = asyncio.ensure_future(_run(coroutine, batch, finish))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _run(coroutine: Coroutine[Any, Any, Any], batch: Any, finish: Callable[[Any, Any], None]) -> None:
    try:
        result = await coroutine  # the runner turns the callable's exceptions into messages
    except BaseException as exc:  # a bug of ours, or the task was cancelled: still answer the batch
        log.exception("async model failed")
        result = f"the async model failed: {type(exc).__name__}: {exc}"
    finish(batch, result)
