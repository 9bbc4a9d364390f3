"""One table: each of Triton's error codes as a gRPC status, an HTTP status and an OpenAI route's
status. The gRPC and HTTP columns are Triton's own (its servers' ``grpc/grpc_utils.cc`` and
``http_server.cc HttpCodeFromError``); the C path keeps copies indexed by the code
(``native/_native/kserve.c``: ``grpc_code``, ``http_status``), which ``tests/unit/test_statuses.py``
checks against this table."""

from __future__ import annotations

from typing import NamedTuple

from ..errors import TritonError


class Statuses(NamedTuple):
    grpc: int
    http: int
    openai: int


# In the order of TRITONSERVER_Error_Code (the C copies are indexed by it).
TABLE: dict[str, Statuses] = {
    "UNKNOWN": Statuses(grpc=13, http=400, openai=500),  # INTERNAL; Triton's HTTP default is 400
    "INTERNAL": Statuses(grpc=13, http=500, openai=500),
    "NOT_FOUND": Statuses(grpc=5, http=404, openai=404),
    "INVALID_ARG": Statuses(grpc=3, http=400, openai=400),
    "UNAVAILABLE": Statuses(grpc=14, http=503, openai=503),
    "UNSUPPORTED": Statuses(grpc=12, http=501, openai=501),  # UNIMPLEMENTED
    "ALREADY_EXISTS": Statuses(grpc=6, http=400, openai=500),
    "CANCELLED": Statuses(grpc=1, http=400, openai=500),
}
NOT_TRITON = Statuses(grpc=13, http=400, openai=500)  # an exception that is no TritonError


def statuses_of(error: BaseException) -> Statuses:
    """The statuses of an error (by its Triton code)."""
    if isinstance(error, TritonError):
        return TABLE.get(error.code, TABLE["UNKNOWN"])
    return NOT_TRITON
