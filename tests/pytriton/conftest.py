"""Fixtures of the PyTriton drop-in tests. Every Triton here serves on 127.0.0.1 with ports the
system picks (port 0), so tests never collide with each other or with other servers."""

from __future__ import annotations

import functools
import importlib
import subprocess
import sys
from types import ModuleType

import pytest

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

from embedtriton.pytriton.triton import TritonConfig  # noqa: E402


def _local_config(**fields) -> TritonConfig:
    base = dict(http_address="127.0.0.1", grpc_address="127.0.0.1", http_port=0, grpc_port=0, metrics_port=0)
    return TritonConfig(**{**base, **fields})


def _url_of(triton, protocol: str) -> str:
    if protocol == "grpc":
        return f"grpc://127.0.0.1:{triton.grpc_port}"
    return f"127.0.0.1:{triton.http_port}"  # no scheme: HTTP, PyTriton's default


@pytest.fixture(scope="session")
def local_config():
    """``local_config(**fields)``: a TritonConfig on 127.0.0.1 with free ports (plus ``fields``)."""
    return _local_config


@pytest.fixture(scope="session")
def url_of():
    """``url_of(triton, "http" | "grpc")``: the URL a client uses (HTTP as a bare host:port)."""
    return _url_of


@pytest.fixture(params=["http", "grpc"])
def protocol(request) -> str:
    return request.param


@functools.cache
def _stock_importable() -> bool:
    """Whether PyTriton's package imports whole (the wheel is installed with --no-deps; its own
    dependencies may be missing). Asked in a subprocess: a failed import in this process would
    leave half of the package in ``sys.modules``, and later imports of it would look fine."""
    probe = "import pytriton.client, pytriton.decorators, pytriton.triton"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def _stock(name: str) -> ModuleType | None:
    """``pytriton.<name>`` from the nvidia-pytriton wheel, or None where it cannot import."""
    return importlib.import_module(f"pytriton.{name}") if _stock_importable() else None


@pytest.fixture(scope="session")
def stock_pytriton():
    """``stock_pytriton("client")``: PyTriton's own module (to compare with), or None."""
    return _stock
