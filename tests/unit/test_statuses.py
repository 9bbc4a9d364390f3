"""One error table (embedtriton/frontends/statuses.py): every Triton error code has its gRPC,
HTTP and OpenAI statuses there, in the order of TRITONSERVER_Error_Code, and the C path's copies
(kserve.c) agree with it."""

from __future__ import annotations

import re
from pathlib import Path

from embedtriton import errors
from embedtriton.frontends.grpc.transport import code_of
from embedtriton.frontends.http.answers import status_of
from embedtriton.frontends.http.openai import _triton_status
from embedtriton.frontends.statuses import TABLE

KSERVE_C = Path(__file__).resolve().parents[2] / "embedtriton" / "native" / "_native" / "kserve.c"


def c_table(function: str) -> list[int]:
    """The static int table in kserve.c's ``function``."""
    source = KSERVE_C.read_text()
    body = source[source.index(f"static int {function}(int code)") :]
    found = re.search(r"static const int \w+\[\] = \{([^}]*)\}", body)
    assert found, function
    return [int(v) for v in found.group(1).split(",")]


def test_the_table_follows_tritons_error_codes():
    assert list(TABLE) == [cls.code for cls in errors._BY_CODE]  # (index = TRITONSERVER_Error_Code)
    subclasses = {
        cls.code for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.TritonError)
    }
    assert subclasses <= TABLE.keys()


def test_the_c_copies_agree():
    assert c_table("grpc_code") == [s.grpc for s in TABLE.values()]
    assert c_table("http_status") == [s.http for s in TABLE.values()]


def test_every_frontend_reads_the_table():
    for cls in errors._BY_CODE:
        error = cls("x")
        statuses = TABLE[cls.code]
        assert (code_of(error), status_of(error), _triton_status(error)) == statuses, cls
    assert _triton_status(errors.UnsupportedError("no")) == 501  # (the OpenAI routes said 500)
    assert (code_of(KeyError("x")), status_of(KeyError("x"))) == (13, 400)
