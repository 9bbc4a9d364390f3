"""A KServe-v2 gRPC endpoint wrapping a server: the transport chosen by its options, TLS, and
the service it feeds. Attached to the server, which drains and stops it with itself."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from ...core import CoreServer
from ...errors import InvalidArgumentError, UnavailableError
from ...triton.runtime import runtime_nghttp2
from ..descriptors import connection_cap
from .options import COMPRESSION_LEVELS, GrpcLimits, GrpcOptions

try:
    import grpc

    from .service import Service
    from .transport import GrpcioHandler, grpcio_credentials
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'the gRPC endpoint needs grpcio, grpcio-health-checking and tritonclient[grpc]: pip install "embedtriton[grpc]"'
    ) from exc

log = logging.getLogger("embedtriton")


class GrpcEndpoint:
    """A gRPC server for the KServe-v2 and health services of a server.

    ``transport="native"`` (the default) is embedtriton's own HTTP/2 transport
    (``embedtriton._h2``, on libnghttp2): one IO thread, the Python service called once per
    message with no event loop in between. ``transport="grpcio"`` serves the same service on
    grpcio's asyncio server, about 2.5x slower (see benchmarks/bench_grpc.py).
    """

    def __init__(self, server: CoreServer, options: GrpcOptions | None = None) -> None:
        options = options or GrpcOptions()
        self.options = options
        self.address = options.address
        self.service = Service(server, options)
        self._h2_server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # limits.max_connections, or fewer when the process's descriptor limit leaves less room
        self.max_connections = connection_cap(options.limits.max_connections, "gRPC")
        address = str(options.address)  # (GrpcOptions normalized it to "host:port")
        if options.transport == "native":
            self._start_native(
                address, options.max_message_bytes, options.tls, options.limits, options.max_buffered_bytes
            )
        else:
            self._start_grpcio(
                address,
                options.max_message_bytes,
                options.tls,
                options.infer_response_compression_level,
                options.limits,
            )

    def _start_native(
        self, address: str, max_message_bytes: int, tls: Any, limits: GrpcLimits, max_incoming_bytes: int
    ) -> None:
        from ... import _h2

        host, _, port = address.rpartition(":")  # GrpcOptions checked and normalized it
        host = host.strip("[]")
        transport_options = {
            **limits.transport_options(),
            "max_connections": self.max_connections,
            "max_incoming_bytes": max_incoming_bytes,  # (GrpcOptions.max_buffered_bytes: across connections)
        }
        try:
            self._h2_server = _h2.Server(
                host, int(port), self.service, max_message_bytes, tls, runtime_nghttp2(), **transport_options
            )
        except ValueError as exc:  # e.g. a TLS certificate or key file that does not load
            raise InvalidArgumentError(f"cannot serve gRPC on {address}: {exc}") from exc
        except (OSError, RuntimeError) as exc:
            raise UnavailableError(f"cannot serve gRPC on {address}: {exc}") from exc
        self.port: int = self._h2_server.port
        library = _h2.library()
        missing = [name for name in ("reset_rate_limit", "max_continuations") if not library[name]]
        log.info(
            "gRPC transport: libnghttp2 %s from %s%s",
            library["version"],
            library["path"],
            f" (without {', '.join(missing)}: an old copy; set EMBEDTRITON_NGHTTP2 to a newer one)" if missing else "",
        )

    def _start_grpcio(
        self, address: str, max_message_bytes: int, tls: Any, compression_level: str, limits: GrpcLimits
    ) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="embedtriton-grpc", daemon=True)
        self._thread.start()
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # What grpc-core offers of GrpcLimits: it refuses connections over the cap (it cannot close
            # an idle one to admit them), so idle and half-open ones must time out to make room.
            ("grpc.max_allowed_incoming_connections", self.max_connections),
            ("grpc.max_connection_idle_ms", _milliseconds(limits.idle_timeout_s)),
            ("grpc.server_handshake_timeout_ms", _milliseconds(limits.handshake_timeout_s)),
        ]
        if compression_level != "none":
            # grpc-core keeps the client's grpc-accept-encoding from the application (the service's
            # per-call choice never sees it), so grpc-core picks the algorithm itself, for every method.
            options.append(("grpc.default_compression_level", COMPRESSION_LEVELS[compression_level]))
        credentials = grpcio_credentials(tls) if tls else None

        async def start() -> tuple[Any, int]:
            grpc_server = grpc.aio.server(options=options)
            grpc_server.add_generic_rpc_handlers([GrpcioHandler(self.service)])
            if credentials is not None:
                port = grpc_server.add_secure_port(address, credentials)
            else:
                port = grpc_server.add_insecure_port(address)
            await grpc_server.start()
            return grpc_server, port

        try:
            self._server, self.port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
        except Exception as exc:
            loop.call_soon_threadsafe(loop.stop)
            raise UnavailableError(f"cannot serve gRPC on {address}: {exc}") from exc
        if self.port == 0:
            self.stop()
            raise UnavailableError(f"cannot serve gRPC on {address}: the address is in use or invalid")

    def stats(self) -> dict[str, Any]:
        """The native transport's counters (connections, ...); empty on grpcio."""
        return self._h2_server.stats() if self._h2_server is not None else {}

    def drain(self) -> None:
        """The server stops: refuse new requests; those in flight finish (see Service.drain)."""
        self.service.drain()

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving: calls in progress get ``grace`` seconds to finish."""
        self.service.stop()
        if self._h2_server is not None:
            self._h2_server.stop(grace)
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._server.stop(grace), loop)
        try:
            future.result(timeout=grace + 5)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=5)
            loop.close()


def _milliseconds(seconds: float) -> int:
    """A grpc-core channel argument in milliseconds (a C int)."""
    return min(int(seconds * 1000), 2**31 - 1)
