"""Streams of the OpenAI routes (:mod:`.openai`): the responses of several requests merged as
they come, and their handles closed exactly once (closing cancels an unfinished request)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from ...errors import TritonError


class Once:
    """A request's stream handle whose ``close`` (which cancels an unfinished request) runs once:
    by the response iterator when it ends, or by the route for one that never started."""

    __slots__ = ("handle", "closed")

    def __init__(self, handle: Any) -> None:
        self.handle, self.closed = handle, False

    def next(self, block: bool) -> tuple[int, Any]:
        return self.handle.next(block)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.handle.close()


def close_all(handles: list[Once]) -> None:
    for handle in handles:
        handle.close()


class Closing:
    """The events of a stream; closing them closes the requests' handles too (also when the
    events never started: an async generator that never ran has no ``finally`` to run)."""

    def __init__(self, events: AsyncGenerator[Any, None], handles: list[Once]) -> None:
        self.events, self.handles = events, handles

    def __aiter__(self) -> Closing:
        return self

    async def __anext__(self) -> Any:
        return await self.events.__anext__()

    async def aclose(self) -> None:
        try:
            await self.events.aclose()
        finally:
            close_all(self.handles)


async def merge(
    streams: Sequence[AsyncGenerator[dict[str, Any], None]],
) -> AsyncGenerator[tuple[int, dict[str, Any]], None]:
    """The responses of several streams as they come, with the index of each one's stream."""
    if len(streams) == 1:
        try:
            async for outputs in streams[0]:
                yield 0, outputs
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    done = object()

    async def pump(index: int, source: AsyncGenerator[dict[str, Any], None]) -> None:
        try:
            async for outputs in source:
                await queue.put((index, outputs))
            await queue.put((index, done))
        except TritonError as exc:
            await queue.put((index, exc))
        finally:
            await source.aclose()

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            index, item = await queue.get()
            if item is done:
                left -= 1
            elif isinstance(item, TritonError):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
