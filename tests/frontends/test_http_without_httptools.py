"""Without ``httptools`` (the ``[http]`` extra) the HTTP endpoint serves: its HTTP/1.1 is parsed in
C (``embedtriton._h2.HttpServer``), so nothing imports httptools any more, and a machine without
the extra neither gets a refusal nor a port that accepts connections it then closes unanswered.
Run in a child process whose imports of ``httptools`` fail (a ``sys.meta_path`` blocker), as on a
machine without the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import socket
    import sys

    class NoHttptools:
        def find_spec(self, name, path=None, target=None):
            if name == "httptools" or name.startswith("httptools."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoHttptools())
    sys.modules.pop("httptools", None)

    from embedtriton import Server, TritonError, UnsupportedError

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()

    server = Server()
    with server:
        try:
            server.serve_http(f"127.0.0.1:{port}")
        except UnsupportedError as exc:
            assert isinstance(exc, TritonError)
            print("refused:", exc)
        else:
            print("served")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET /v2/health/live HTTP/1.1\\r\\nConnection: close\\r\\n\\r\\n")
                print("answer:", s.recv(4096).split(b"\\r\\n")[0].decode())
        except OSError:
            print("port closed")
        print("http endpoint:", type(server.endpoint("http")).__name__)

    from embedtriton.pytriton.triton import Triton, TritonConfig

    triton = Triton(config=TritonConfig(http_address="127.0.0.1", http_port=0, allow_grpc=False, allow_metrics=False))
    try:
        triton.run()
    except UnsupportedError as exc:
        print("pytriton refused:", exc)
    print("pytriton running:", triton.is_alive())
    triton.stop()
    print("httptools imported:", "httptools" in sys.modules)
    """
)


def test_serve_http_without_httptools_serves(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "served" in lines and "answer: HTTP/1.1 200 OK" in lines, lines
    assert "http endpoint: RestEndpoint" in lines
    assert not any(line.startswith(("refused:", "pytriton refused:")) for line in lines), lines
    assert "pytriton running: True" in lines
    assert "httptools imported: False" in lines
