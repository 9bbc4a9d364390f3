"""Helpers for the adversarial tests: a server in a child process (``embedtriton serve``),
so that an attack that would crash it cannot take the test run down with it."""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from helpers import wait_for  # noqa: F401  (the adversarial tests import it from here too)

# Under `nox -s tests-asan` (AddressSanitizer): this process's memory is not what the code holds
# (freed blocks wait in ASan's quarantine, shadow memory, redzones), so tests that measure RSS keep
# their other checks there and leave the memory ones to the normal sessions.
SANITIZED = bool(os.environ.get("EMBEDTRITON_SANITIZED"))


def unread_posts(port: int, path: str, body: bytes, count: int) -> list[socket.socket]:
    """``count`` connections that each POST ``body`` to ``path`` and then read nothing (a 4 KiB
    receive buffer, so the server's writes stall at once). The caller closes them."""
    request = b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(request)
        socks.append(s)
    return socks


def read_all(s: socket.socket, limit: float = 10.0) -> bytes:
    """What the server sends until it closes (a close with bytes it did not read is a reset)."""
    s.settimeout(limit)
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


class Served:
    """An ``embedtriton serve`` child process serving the models of a bind function."""

    def __init__(
        self, folder: Path, bind_source: str, *options: str, nofile: int | None = None, env: dict | None = None
    ) -> None:
        """``nofile``: the child's descriptor limit (RLIMIT_NOFILE, soft and hard: it cannot raise it);
        ``env``: the child's environment (this process's by default)."""
        (folder / "served_models.py").write_text(textwrap.dedent(bind_source))
        command = [sys.executable, "-m", "embedtriton", "serve", "served_models:bind", "--grpc", "127.0.0.1:0"]
        limit = None if nofile is None else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        self.process = subprocess.Popen(
            [*command, "--metrics", "", *options],
            cwd=folder,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=limit,
            env=env,
        )
        self.lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            self.lines.append(line)
            if "ready:" in line or not line:
                break
        text = "".join(self.lines)
        found = re.search(r"gRPC .* \(port (\d+)\)", text)
        assert found and "ready:" in text, text
        self.port = int(found.group(1))
        self.address = f"127.0.0.1:{self.port}"
        http = re.search(r"serving HTTP on .* \(port (\d+)\)", text)
        self.http_port = int(http.group(1)) if http else None  # (with --http)

    def keep_reading(self) -> None:
        """Read the rest of its log (into ``lines``) in a thread, so that a chatty server never
        blocks on a full pipe."""

        def drain() -> None:
            try:
                for line in self.process.stderr:
                    self.lines.append(line)
            except (OSError, ValueError):
                pass

        threading.Thread(target=drain, daemon=True).start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        """Wait for the process to end; (exit code, the rest of its log)."""
        code = self.process.wait(timeout=timeout)
        return code, "".join(self.lines) + self.process.stderr.read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process.stderr.close()
