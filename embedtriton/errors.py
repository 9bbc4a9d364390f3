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
    """An error Triton gives no other code (``UNKNOWN``)."""

    code = "UNKNOWN"


class InternalError(TritonError):
    """The model failed (its callable raised, or returned outputs that do not match its
    declaration), or Triton did (``INTERNAL``)."""

    code = "INTERNAL"


class NotFoundError(TritonError):
    """No such model, version or shared-memory region (``NOT_FOUND``)."""

    code = "NOT_FOUND"


class InvalidArgumentError(TritonError, ValueError):
    """A request or declaration is wrong: the message says what to change (``INVALID_ARG``;
    also a :class:`ValueError`)."""

    code = "INVALID_ARG"


class UnavailableError(TritonError):
    """The server or model cannot take the request now: stopping, not ready, a full queue, a
    timeout (``UNAVAILABLE``)."""

    code = "UNAVAILABLE"


class UnsupportedError(TritonError):
    """What this runtime or set-up cannot do, e.g. an extra that is not installed (``UNSUPPORTED``)."""

    code = "UNSUPPORTED"


class AlreadyExistsError(TritonError):
    """Something of that name exists already (``ALREADY_EXISTS``)."""

    code = "ALREADY_EXISTS"


class CancelledError(TritonError):
    """The request was cancelled: its caller left, or the server cancelled it at stop (``CANCELLED``)."""

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
