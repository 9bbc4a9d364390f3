"""``embedtriton doctor`` and ``embedtriton install-runtime`` (embedtriton/doctor.py), run as a user
types them, in this test environment (which has the runtime and the native modules)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from embedtriton import doctor


def embedtriton(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "embedtriton", *args], capture_output=True, text=True, timeout=120, cwd="/"
    )


def test_doctor_reports_what_this_installation_is_made_of():
    done = embedtriton("doctor")
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(None, 1) for line in done.stdout.splitlines() if not line.startswith("extra "))
    assert set(lines) >= {"embedtriton", "wheel", "python", "platform", "numpy", "triton", "runtime", "gpus"}
    assert "_native.cpython" in done.stdout and "_h2.cpython" in done.stdout  # the built modules, by path
    assert f"nvidia-pytriton {doctor.RUNTIME_VERSION} (Triton {doctor.RUNTIME_TRITON})" in done.stdout
    assert "triton C API         1." in done.stdout  # read from libtritonserver itself
    assert "extra grpc           yes (grpcio " in done.stdout


def test_doctor_says_what_is_missing_and_fails_without_a_runtime(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "embedtriton", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        # (PYTHONPATH kept: where embedtriton is imported from a checkout, as on the GPU machine)
        env={"EMBEDTRITON_TRITON_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
        | ({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    )
    assert done.returncode == 1
    assert "problem: no Triton runtime: run `embedtriton install-runtime`" in done.stderr


def test_install_runtime_with_the_runtime_installed_only_checks_it(capsys):
    ran = []
    assert doctor.install_runtime(argparse.Namespace(check=False), run=lambda c: ran.append(c) or 0) == 0
    assert ran == []  # nothing to install
    out = capsys.readouterr().out
    assert f"nvidia-pytriton {doctor.RUNTIME_VERSION} is installed." in out and "Triton runtime: " in out


def test_install_runtime_runs_pip_without_dependencies(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "_version", lambda d: None if d == "nvidia-pytriton" else "2.0")
    ran = []
    code = doctor.install_runtime(argparse.Namespace(check=False), run=lambda c: ran.append(c) or 1)
    assert ran == [[sys.executable, "-m", "pip", "install", "--no-deps", f"nvidia-pytriton=={doctor.RUNTIME_VERSION}"]]
    assert code == 1 and "pip failed" in capsys.readouterr().err
    assert doctor.install_runtime(argparse.Namespace(check=True), run=ran.append) == 1  # --check installs nothing
    assert len(ran) == 1


@pytest.mark.parametrize(("machine", "libc"), [("x86_64", ("glibc", "2.31")), ("riscv64", ("glibc", "2.39"))])
def test_install_runtime_refuses_platforms_the_runtime_is_not_published_for(monkeypatch, capsys, machine, libc):
    monkeypatch.setattr(doctor.platform, "machine", lambda: machine)
    monkeypatch.setattr(doctor.platform, "libc_ver", lambda: libc)
    assert doctor.install_runtime(argparse.Namespace(check=False), run=lambda c: 0) == 2
    assert "EMBEDTRITON_TRITON_HOME=/opt/tritonserver" in capsys.readouterr().err
