"""The HTTP endpoint's listening socket: connections accepted within the endpoint's cap, an
idle one closed to admit a new one at the cap or out of descriptors (README "Security").

Our own accept() rather than asyncio's server: asyncio accepts a whole backlog at once (each
taking a descriptor before any of them is counted) and, out of descriptors, stops accepting for
a second (``asyncio.constants.ACCEPT_RETRY_DELAY``).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from typing import Any

from .connection import Connection

ACCEPT_BATCH = 16  # connections accepted per turn of the loop: a connect flood cannot hold it
ACCEPT_PAUSE = 0.1  # seconds without accepting after an error that retrying at once would only repeat


class Listener:
    """Accepts the connections of ``endpoint`` (a ``RestEndpoint``: its ``connections``, its
    ``max_connections``) on ``host:port``, over TLS with ``context``."""

    def __init__(self, endpoint: Any, host: str, port: int, context: ssl.SSLContext | None, handshake_s: float) -> None:
        self.endpoint = endpoint
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.sock = socket.create_server((host, port), family=family, backlog=1024)  # the first address, as gRPC
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]
        self.context = context
        self.handshake_s = handshake_s if context else None  # a stalled TLS handshake is cut too
        self.starting: set[asyncio.Task[None]] = set()  # accepted, not yet connections (TLS handshakes)
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        loop.call_soon(self._resume)

    def close(self) -> None:
        """Stop accepting (in the loop's thread); handshakes in progress are abandoned."""
        if self.loop is not None and self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for task in self.starting:
            task.cancel()

    def _accept(self) -> None:
        """Take waiting connections, a batch per turn of the loop. At the cap, or out of
        descriptors, an idle connection makes room (:meth:`make_room`): its descriptor is closed
        by the next turn, when the listener, still readable, brings us back here."""
        assert self.loop is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE) and self.make_room():
                    return
                # out of descriptors with a request in flight everywhere, ENOBUFS, ...: retrying at once would spin
                self.loop.remove_reader(self.sock.fileno())
                self.loop.call_later(ACCEPT_PAUSE, self._resume)
                return
            if len(self.endpoint.connections) + len(self.starting) >= self.endpoint.max_connections:
                if not self.make_room():
                    sock.close()  # a request in flight on every connection: refused before any TLS or HTTP work
                    continue
            task = self.loop.create_task(self._start(sock))
            self.starting.add(task)
            task.add_done_callback(self.starting.discard)

    def _resume(self) -> None:
        if self.loop is not None and self.sock.fileno() >= 0:  # not closed meanwhile
            self.loop.add_reader(self.sock.fileno(), self._accept)

    async def _start(self, sock: socket.socket) -> None:
        assert self.loop is not None
        try:
            await self.loop.connect_accepted_socket(
                lambda: Connection(self.endpoint), sock, ssl=self.context, ssl_handshake_timeout=self.handshake_s
            )
        except Exception:  # a TLS handshake that failed or timed out, a client already gone: nobody to answer
            sock.close()

    def make_room(self) -> bool:
        """At the connection cap, or out of descriptors: close a connection with nothing in flight
        (:meth:`Connection.idle`), so that idle clients cannot keep a new one out; first one that
        never sent anything (the cheapest attack: a client that spoke keeps its connection through
        it), then the longest idle. False when every connection has a request in flight."""
        connections = self.endpoint.connections
        victim = min((c for c in connections if c.idle()), key=lambda c: (c.spoke, c.idle_since), default=None)
        if victim is None or victim.transport is None:
            return False
        connections.discard(victim)  # out of the count now; its connection_lost follows
        victim.transport.abort()  # nothing to flush; close() would keep the descriptor for a TLS close_notify
        return True
