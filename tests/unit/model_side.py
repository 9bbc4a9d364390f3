"""What the model-side unit tests build: requests as the backend hands them to a callable."""

from __future__ import annotations

from typing import Any

import numpy as np

from embedtriton.backend.request import Request


def make_request(parameters: dict[str, Any] | None = None, **inputs: Any) -> Request:
    """A Request as the backend hands it over: read-only arrays, then its parameters."""
    request = Request()
    for name, value in inputs.items():
        array = np.array(value)
        array.setflags(write=False)
        request[name] = array
    request.parameters = dict(parameters or {})
    return request
