"""Every failure surfaces as a :class:`TritonError` subclass named after Triton's error code; the
refusals that several layers send are worded once here."""

from __future__ import annotations

# What a request is told when refused for these reasons (by the core and by every endpoint).
SERVER_STOPPING = "the server is stopping: it takes no new requests"
MODEL_CONTROL_REFUSED = "explicit model load / unload is not allowed if polling is enabled"  # Triton's words


class TritonError(Exception):
    """Base class of all embedtriton errors. ``code`` is Triton's error-code name."""

    code = "UNKNOWN"


class UnknownError(TritonError):
    code = "UNKNOWN"


class InternalError(TritonError):
    code = "INTERNAL"


class NotFoundError(TritonError):
    code = "NOT_FOUND"


class InvalidArgumentError(TritonError, ValueError):
    code = "INVALID_ARG"


class UnavailableError(TritonError):
    code = "UNAVAILABLE"


class UnsupportedError(TritonError):
    code = "UNSUPPORTED"


class AlreadyExistsError(TritonError):
    code = "ALREADY_EXISTS"


class CancelledError(TritonError):
    code = "CANCELLED"


# Index = TRITONSERVER_Error_Code value.
_BY_CODE: tuple[type[TritonError], ...] = (
    UnknownError,
    InternalError,
    NotFoundError,
    InvalidArgumentError,
    UnavailableError,
    UnsupportedError,
    AlreadyExistsError,
    CancelledError,
)


def error_for_code(code: int, message: str) -> TritonError:
    """The exception for a Triton error code and message (without Triton's "[request id: ...]"
    prefix, which says nothing to a caller that holds the request)."""
    cls = _BY_CODE[code] if 0 <= code < len(_BY_CODE) else UnknownError
    if message.startswith("[request id: "):
        end = message.find("] ")
        if end > 0:
            message = message[end + 2 :]
    return cls(message)
