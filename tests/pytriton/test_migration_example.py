"""examples/pytriton_migration: after.py is before.py (a PyTriton script) with the imports
changed, and it runs to completion on embedtriton on its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "pytriton_migration"


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def test_after_differs_from_before_only_in_the_imports():
    before = (FOLDER / "before.py").read_text().splitlines()
    after = (FOLDER / "after.py").read_text().splitlines()
    assert len(before) == len(after)
    changed = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert changed and all(b.startswith("from pytriton.") for b, _ in changed)
    assert all(a == b.replace("from pytriton.", "from embedtriton.pytriton.", 1) for b, a in changed)


def test_after_runs_on_its_own(tmp_path):
    http, grpc, metrics = free_ports(3)
    env = {**os.environ, "HTTP_PORT": str(http), "GRPC_PORT": str(grpc), "METRICS_PORT": str(metrics)}
    done = subprocess.run(  # cwd elsewhere: the installed package is imported, not the source tree
        [sys.executable, str(FOLDER / "after.py")], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "AddSub over HTTP: [4.0, 5.0] [2.0, 3.0]" in done.stdout
    assert "Linear over gRPC: [[1.5, 0.0, -0.5]," in done.stdout
    assert done.stdout.rstrip().endswith("done")
