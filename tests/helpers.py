"""Helpers shared by the test modules (importable from any of them: pytest puts ``tests/`` on
``sys.path`` for its ``conftest.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], seconds: float = 10.0, every: float = 0.01) -> bool:
    """Poll ``condition()`` every ``every`` seconds until it is true; whether it came true within
    ``seconds``. The one way the tests wait for a state: assert on what it returns."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True
