"""Fixtures shared by the endpoint tests."""

from __future__ import annotations

import os
import subprocess

import pytest

REQUIRE_PERF_ANALYZER = "EMBEDTRITON_REQUIRE_PERF_ANALYZER"  # CI: the perf_analyzer tests may not skip


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
def perf_analyzer():
    """The perf_analyzer binary of the tritonclient wheel (2.51 ships it) and an environment it
    starts in (it links libcudart.so.12: the copy in the nvidia-pytriton wheel); skips where the
    wheel has no binary or Debian's libb64-0d is missing."""
    from embedtriton.errors import UnavailableError
    from embedtriton.tuning.perf import perf_analyzer as find

    try:
        return find()
    except UnavailableError as exc:
        if os.environ.get(REQUIRE_PERF_ANALYZER):  # (set by .ci/run for tests-oldest, which has it)
            pytest.fail(f"{REQUIRE_PERF_ANALYZER} is set, but {exc}")
        pytest.skip(f"{exc}; nox -s tests-oldest runs this test")
