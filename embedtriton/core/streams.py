"""The responses of a decoupled model's request, from the native stream handle: as a
blocking iterator and as an async iterator. Leaving early closes (cancels) the stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from ..backend import library
from ..backend.library import STREAM_EMPTY, STREAM_END, STREAM_ITEM


def iterate(handle: Any) -> Iterator[dict[str, Any]]:
    """Each response as it comes, waiting for it (an error is raised after those before it)."""
    native = library.native()
    try:
        while True:
            status, outputs = native.stream_next(handle, True)
            if status == STREAM_END:
                return
            yield outputs
    finally:
        native.stream_close(handle)


async def iterate_async(handle: Any, arrived: asyncio.Event) -> AsyncGenerator[dict[str, Any], None]:
    """Each response as it comes; ``arrived`` is set (from the loop) when one is there."""
    native = library.native()
    try:
        while True:
            status, outputs = native.stream_next(handle, False)
            if status == STREAM_END:
                return
            if status == STREAM_ITEM:
                yield outputs
                continue
            arrived.clear()
            status, outputs = native.stream_next(handle, False)  # arrived before clear()?
            if status == STREAM_EMPTY:
                await arrived.wait()
            elif status == STREAM_END:
                return
            else:
                yield outputs
    finally:
        native.stream_close(handle)
