"""The responses of a decoupled model's request, from its :class:`~.handles.Stream`: as a
blocking iterator and as an async iterator. Leaving early closes (cancels) the stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from .handles import STREAM_EMPTY, STREAM_END, STREAM_ITEM, Stream

__all__ = ["STREAM_EMPTY", "STREAM_END", "STREAM_ITEM", "Stream", "iterate", "iterate_async"]


def iterate(handle: Stream) -> Iterator[dict[str, Any]]:
    """Each response as it comes, waiting for it (an error is raised after those before it)."""
    try:
        while True:
            status, outputs = handle.next(True)
            if status == STREAM_END:
                return
            yield outputs
    finally:
        handle.close()


async def iterate_async(handle: Stream, arrived: asyncio.Event) -> AsyncGenerator[dict[str, Any], None]:
    """Each response as it comes; ``arrived`` is set (from the loop) when one is there."""
    try:
        while True:
            status, outputs = handle.next(False)
            if status == STREAM_END:
                return
            if status == STREAM_ITEM:
                yield outputs
                continue
            arrived.clear()
            status, outputs = handle.next(False)  # arrived before clear()?
            if status == STREAM_EMPTY:
                await arrived.wait()
            elif status == STREAM_END:
                return
            else:
                yield outputs
    finally:
        handle.close()
