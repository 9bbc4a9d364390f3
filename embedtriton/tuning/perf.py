"""Finding ``perf_analyzer`` (the binary in tritonclient 2.51's wheel) and an environment it
starts in: it links ``libcudart.so.12``, which the nvidia-pytriton wheel carries."""

from __future__ import annotations

import atexit
import functools
import glob
import os
import shutil
import subprocess
import sysconfig
import tempfile
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path

from ..errors import UnavailableError


@functools.cache
def perf_analyzer() -> tuple[str, dict[str, str]]:
    """(binary, environment), or an UnavailableError that says what to install."""
    binary = Path(sysconfig.get_path("scripts")) / "perf_analyzer"
    found = str(binary) if binary.exists() else shutil.which("perf_analyzer")
    if found is None:
        try:
            have = f"tritonclient {version('tritonclient')} is installed, whose wheel has no perf_analyzer"
        except PackageNotFoundError:
            have = "tritonclient is not installed"
        raise UnavailableError(
            f"perf_analyzer is not installed ({have}): pip install tritonclient==2.51.0, the last wheel that "
            "ships the binary (Debian: also apt-get install libb64-0d)"
        )
    env = dict(os.environ)
    spec = find_spec("pytriton")
    libs = (
        glob.glob(str(Path(spec.origin).parent.parent / "nvidia_pytriton.libs" / "libcudart*.so*"))
        if spec and spec.origin
        else []
    )
    if libs:
        link_dir = Path(tempfile.mkdtemp(prefix="embedtriton-perf-"))
        atexit.register(shutil.rmtree, link_dir, ignore_errors=True)
        (link_dir / "libcudart.so.12").symlink_to(libs[0])
        env["LD_LIBRARY_PATH"] = f"{link_dir}:{env.get('LD_LIBRARY_PATH', '')}"
    check = subprocess.run([found, "--version"], env=env, capture_output=True, text=True)
    if "error while loading shared libraries" in check.stderr:
        raise UnavailableError(
            f"perf_analyzer cannot start: {check.stderr.strip()} (Debian: apt-get install libb64-0d)"
        )
    return found, env
