"""The unit tier: pure Python, no Triton. Each test is checked not to have loaded the Triton
runtime or embedtriton's native modules (``_native``, ``_h2``) that were not loaded before it."""

from __future__ import annotations

import sys

import pytest

NATIVE_MODULES = ("embedtriton._native", "embedtriton._h2")


def _loaded() -> set[str]:
    found = {name for name in NATIVE_MODULES if name in sys.modules}
    runtime = sys.modules.get("embedtriton.triton.runtime")
    if runtime is not None and getattr(runtime, "_loaded", None) is not None:
        found.add("the Triton runtime (libtritonserver)")
    return found


@pytest.fixture(autouse=True)
def _no_triton():
    before = _loaded()
    yield
    started = _loaded() - before
    assert not started, f"a unit test loaded {sorted(started)}; it belongs in tests/core or tests/frontends"
