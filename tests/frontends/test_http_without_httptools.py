"""Without ``httptools`` (the ``[http]`` extra) the HTTP endpoint refuses to start, saying what to
install, instead of accepting connections it then closes unanswered. Run in a child process whose
imports of ``httptools`` fail (a ``sys.meta_path`` blocker), as on a machine without the extra."""

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
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            print("port open")
        except OSError:
            print("port closed")
        print("http endpoint:", server.endpoint("http"))

    from embedtriton.pytriton.triton import Triton, TritonConfig

    triton = Triton(config=TritonConfig(http_address="127.0.0.1", http_port=0, allow_grpc=False, allow_metrics=False))
    try:
        triton.run()
    except UnsupportedError as exc:
        print("pytriton refused:", exc)
    print("pytriton running:", triton.is_alive())
    """
)


def test_serve_http_without_httptools_names_the_extra(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        "refused: the HTTP endpoint needs httptools (No module named 'httptools'): pip install \"embedtriton[http]\""
        in lines
    )
    assert "port closed" in lines and "http endpoint: None" in lines
    assert any(line.startswith("pytriton refused:") and "embedtriton[http]" in line for line in lines), lines
    assert "pytriton running: False" in lines
