"""The native HTTP/2 transport (embedtriton._h2) under hostile clients: raw frames over plain sockets, 127.0.0.1 only.

Each test states the protective behaviour it checks; all are bounded in count and time.
"""

from __future__ import annotations

import glob
import json
import os
import site
import subprocess
import sys

import pytest

_h2 = pytest.importorskip("embedtriton._h2")


def _wheel_nghttp2():
    for d in site.getsitepackages():
        found = glob.glob(os.path.join(d, "nvidia_pytriton.libs", "libnghttp2-*.so*"))
        if found:
            return os.path.realpath(found[0])
    return None


LIBRARY_CHILD = """
import json, sys
from embedtriton import _h2
print(json.dumps(_h2.library(sys.argv[1] if len(sys.argv) > 1 else None)))
"""


def _library_in_child(tmp_path, *args, env=None):
    out = subprocess.run(
        [sys.executable, "-c", LIBRARY_CHILD, *args],
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,  # the installed package, not the source tree
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _library_rank(info):
    return info["reset_rate_limit"] + info["max_continuations"], tuple(map(int, info["version"].split(".")))


def test_library_choice(tmp_path):
    """The libnghttp2 with the security options, then the newer one, is used; EMBEDTRITON_NGHTTP2 forces one."""
    env = {"EMBEDTRITON_NGHTTP2": ""}
    info = _library_in_child(tmp_path, env=env)
    assert set(info) == {"path", "version", "reset_rate_limit", "max_continuations"}
    assert os.path.exists(info["path"]) and info["version"].count(".") == 2
    wheel = _wheel_nghttp2()
    if wheel is None:
        pytest.skip("nvidia-pytriton wheel not installed")
    system = info
    with_wheel = _library_in_child(tmp_path, wheel, env=env)
    wheel_info = _library_in_child(tmp_path, env={"EMBEDTRITON_NGHTTP2": wheel})
    assert wheel_info["path"] == wheel
    # Whichever of the two is better is chosen, whatever the order they were found in.
    best = max((system, wheel_info), key=_library_rank)
    assert with_wheel["path"] == best["path"]
    # A libpath that is not nghttp2 is ignored.
    assert _library_in_child(tmp_path, "/nonexistent/libnghttp2.so", env=env)["path"] == system["path"]
