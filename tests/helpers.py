"""Helpers shared by the test modules (importable from any of them: pytest puts ``tests/`` on
``sys.path`` for its ``conftest.py``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# Set where no package index can be reached (tests/gpu/run_on_gpu.sh on the GPU machine): the
# tests that would pip-install something skip with OFFLINE_REASON instead of failing.
OFFLINE = os.environ.get("EMBEDTRITON_TESTS_OFFLINE", "") not in ("", "0")
OFFLINE_REASON = "EMBEDTRITON_TESTS_OFFLINE is set: this machine reaches no package index to install from"


def wait_for(condition: Callable[[], object], seconds: float = 10.0, every: float = 0.01) -> bool:
    """Poll ``condition()`` every ``every`` seconds until it is true; whether it came true within
    ``seconds``. The one way the tests wait for a state: assert on what it returns."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True
