"""Triton's Prometheus metrics over HTTP at ``/metrics``."""

from __future__ import annotations

import http.server
import socket
import threading
from typing import Any

from ...core import CoreServer
from ...errors import TritonError, UnavailableError


class MetricsEndpoint:
    """Serves ``server.metrics()`` at ``http://ADDRESS/metrics`` (``"host:0"`` picks a free port)."""

    def __init__(self, server: CoreServer, address: str = "127.0.0.1:8002") -> None:
        host, _, port = address.rpartition(":")

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                try:
                    body = server.metrics().encode()
                except TritonError as exc:
                    self.send_error(503, str(exc))
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        host = host.strip("[]") or "127.0.0.1"  # "[::]:8002" (IPv6) as the other endpoints take it

        class HTTPServer(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        try:
            self._httpd = HTTPServer((host, int(port)), Handler)
        except (OSError, ValueError) as exc:
            raise UnavailableError(f"cannot serve metrics on {address}: {exc}") from None
        self.port: int = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, name="embedtriton-metrics", daemon=True).start()

    def drain(self) -> None:
        """Metrics stay readable while the server drains."""

    def stop(self, grace: float = 0.0) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
