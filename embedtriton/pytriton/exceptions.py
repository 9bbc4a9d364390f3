"""PyTriton's exception names, as members of embedtriton's :class:`~embedtriton.TritonError` family.

``except PyTritonBadParameterError`` works as with PyTriton, and so does ``except
InvalidArgumentError`` (or ``ValueError``): each class also derives from the embedtriton error of
the same meaning. The client's errors (``PyTritonClient*``) live here too, and in
``embedtriton.pytriton.client.exceptions`` where PyTriton has them.

``PyTritonUnrecoverableError`` raised by an inference callable fails that call's requests and
stops the server, as in PyTriton: ``Triton.serve()`` then returns and ``is_alive()`` is False.
"""

from __future__ import annotations

from ..errors import InternalError, InvalidArgumentError, TritonError, UnavailableError


class _WithMessage(TritonError):
    """PyTriton's errors keep their text in ``message``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    @property
    def message(self) -> str:
        return self._message


class PyTritonError(_WithMessage):
    """Base of the server-side PyTriton errors; ``message`` holds the text."""


class PyTritonValidationError(PyTritonError, InvalidArgumentError):
    """A declaration or configuration is not valid."""


class PyTritonInvalidOperationError(PyTritonError):
    """The operation is not allowed in the current state."""


class PyTritonBadParameterError(PyTritonError, InvalidArgumentError):
    """A parameter has a wrong value."""


class PyTritonModelConfigError(PyTritonError, InvalidArgumentError):
    """The model configuration is not valid."""


class PyTritonUnrecoverableError(PyTritonError, InternalError):
    """Raised by an inference callable that cannot serve any more: the server stops."""


class PyTritonRuntimeError(PyTritonError):
    """An error that fits none of the other classes (e.g. a decorator misused at run time)."""


class PyTritonClientError(_WithMessage):
    """Base of the client's errors (not a PyTritonError, as in PyTriton); ``message`` holds the text."""


class PyTritonClientValueError(PyTritonClientError, InvalidArgumentError):
    """A value given to the client is wrong."""


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    """The server URL cannot be used (scheme other than http/grpc, unparsable)."""


class PyTritonClientTimeoutError(PyTritonClientError, UnavailableError):
    """The server, the model or an inference did not answer in time (or could not be reached)."""


class PyTritonClientModelUnavailableError(PyTritonClientError, UnavailableError):
    """The model (name, version) is not available on the server."""


class PyTritonClientClosedError(PyTritonClientError):
    """The client was closed."""


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError, InvalidArgumentError):
    """``infer_batch`` on a model without batching: use ``infer_sample``."""


class PyTritonClientInferenceServerError(PyTritonClientError):
    """The inference failed on the server (the callable raised, or Triton refused the request)."""


class PyTritonClientQueueFullError(PyTritonClientError, UnavailableError):
    """``FuturesModelClient``: its queue is full."""


__all__ = [
    "PyTritonBadParameterError",
    "PyTritonClientClosedError",
    "PyTritonClientError",
    "PyTritonClientInferenceServerError",
    "PyTritonClientInvalidUrlError",
    "PyTritonClientModelDoesntSupportBatchingError",
    "PyTritonClientModelUnavailableError",
    "PyTritonClientQueueFullError",
    "PyTritonClientTimeoutError",
    "PyTritonClientValueError",
    "PyTritonError",
    "PyTritonInvalidOperationError",
    "PyTritonModelConfigError",
    "PyTritonRuntimeError",
    "PyTritonUnrecoverableError",
    "PyTritonValidationError",
]
