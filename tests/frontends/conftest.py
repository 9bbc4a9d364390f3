"""Fixtures shared by the endpoint tests."""

from __future__ import annotations

import subprocess

import pytest


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """A CA, a server certificate for localhost and a client certificate, made with openssl."""
    d = tmp_path_factory.mktemp("certs")
    try:
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                 "-days", "2", "-subj", "/CN=test-ca", cwd=d)  # fmt: skip
        for name in ("server", "client"):
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                     "-subj", "/CN=localhost", cwd=d)  # fmt: skip
            (d / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                     "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"openssl could not make test certificates: {exc}")
    return d


@pytest.fixture(scope="session")
def perf_analyzer(tmp_path_factory):
    """The perf_analyzer binary of the tritonclient wheel (2.51 ships it) and an environment it
    starts in (it links libcudart.so.12: the copy in the nvidia-pytriton wheel); skips where the
    wheel has no binary or Debian's libb64-0d is missing."""
    import glob
    import os
    import shutil
    import sysconfig
    from importlib.util import find_spec
    from pathlib import Path

    binary = Path(sysconfig.get_path("scripts")) / "perf_analyzer"
    if not binary.exists():
        found = shutil.which("perf_analyzer")
        if found is None:
            pytest.skip("perf_analyzer is not installed (tritonclient 2.51's wheel ships it)")
        binary = Path(found)
    env = dict(os.environ)
    spec = find_spec("pytriton")
    libs = glob.glob(str(Path(spec.origin).parent.parent / "nvidia_pytriton.libs" / "libcudart*.so*")) if spec else []
    if libs:
        link_dir = tmp_path_factory.mktemp("perf_analyzer_libs")
        (link_dir / "libcudart.so.12").symlink_to(libs[0])
        env["LD_LIBRARY_PATH"] = f"{link_dir}:{env.get('LD_LIBRARY_PATH', '')}"
    check = subprocess.run([str(binary), "--version"], env=env, capture_output=True, text=True)
    if "error while loading shared libraries" in check.stderr:
        pytest.skip(f"perf_analyzer cannot start here: {check.stderr.strip()} (Debian: apt-get install libb64-0d)")
    return str(binary), env
