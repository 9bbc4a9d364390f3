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
