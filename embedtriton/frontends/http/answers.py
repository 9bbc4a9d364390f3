"""The REST endpoint's answers: their kinds (JSON, :class:`Binary`, :class:`Text`,
:class:`EventStream`), their encoding into header fields and body parts, Triton's status for each
error, and request bodies inflated (bounded). The connections themselves (parsing, limits,
keep-alive, pipelining) are served in C: ``embedtriton._h2.HttpServer``."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..statuses import statuses_of


def status_of(error: BaseException) -> int:
    """Triton's HTTP status of an error (frontends/statuses.py)."""
    return statuses_of(error).http


@dataclass
class Binary:
    """An answer with the binary tensor data extension: a JSON header, then raw tensor bytes."""

    header: dict[str, Any]
    blobs: list[bytes]


@dataclass
class EventStream:
    """An answer sent as Server-Sent Events (chunked): one ``data: {json}`` event per item.
    ``stall_timeout_s``: a client that reads nothing for this long (our buffer stays full) is
    disconnected, which closes the events (cancelling the request); None waits for it."""

    events: AsyncIterator[Any]
    stall_timeout_s: float | None = None


@dataclass
class Text:
    """An answer that is not JSON (Prometheus metrics)."""

    content_type: str
    body: bytes


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _accepted(header: bytes | None) -> str | None:
    """The compression an Accept-Encoding header asks for (gzip, then deflate), if any."""
    if not header:
        return None
    offered = {part.split(b";")[0].strip().lower() for part in header.split(b",")}
    return "gzip" if b"gzip" in offered else "deflate" if b"deflate" in offered else None


def encode(status: int, payload: Any, accept_encoding: bytes | None) -> tuple[list[tuple[str, str]], list[bytes]]:
    """An answer's header fields (but its length) and body parts: JSON; the binary tensor data
    extension's JSON header then the tensors' bytes; or text. As Triton: an inference answer is
    compressed when the client accepts gzip or deflate, errors and other answers are not."""
    if isinstance(payload, Text):
        return [("Content-Type", payload.content_type)], [payload.body]
    infer = status == 200 and (isinstance(payload, Binary) or (type(payload) is dict and "outputs" in payload))
    fields, blobs = [("Content-Type", "application/json")], []
    if isinstance(payload, Binary):
        payload, blobs = payload.header, payload.blobs
    body = b"" if payload is None else json.dumps(payload).encode()
    if blobs:
        fields = [("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", str(len(body)))]
    encoding = _accepted(accept_encoding) if infer else None
    if encoding is not None:
        packer = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
        return [*fields, ("Content-Encoding", encoding)], [packer.compress(b"".join([body, *blobs])) + packer.flush()]
    return fields, [body, *blobs]


def sse_event(event: Any) -> bytes:
    """One Server-Sent Event carrying ``event`` as JSON (``bytes``: as they are, e.g. ``[DONE]``)."""
    if isinstance(event, bytes):
        return b"data: " + event + b"\n\n"
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def decompress(encoding: bytes, body: bytes, limit: int) -> bytes:
    """A gzip / deflate request body (as tritonclient sends it), inflated to at most
    max_body_bytes: a small body that would inflate past the limit is refused (413) without
    inflating it all. Large bodies inflate off the loop."""
    name = encoding.strip().lower()
    if name in (b"identity", b""):
        return body
    if name not in (b"gzip", b"deflate"):
        raise Refused(415, f"Content-Encoding {name.decode('latin-1')!r}: only gzip and deflate are accepted")

    def inflate() -> bytes | None:
        inflater = zlib.decompressobj(wbits=47)  # zlib or gzip framing, by its header
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise Refused(400, f"the {name.decode()} request body does not inflate: {exc}") from None
        if len(out) > limit:
            return None
        if not inflater.eof:
            raise Refused(400, f"the {name.decode()} request body is truncated")
        return out

    out = inflate() if len(body) < 65536 else await asyncio.get_running_loop().run_in_executor(None, inflate)
    if out is None:
        raise Refused(413, f"request body inflates past the limit of {limit} bytes")
    return out
