"""The model side in Python: what a callable is handed (:mod:`.request`), ``@batch``
(:mod:`.batch`), one runner per execution mode (:mod:`.runners`), a bound model
(:mod:`.binding`), the event loop of async callables (:mod:`.aio`) and the owner of the
contract with the native module (:mod:`.library`)."""

from .batch import InferFunc, batch
from .request import Final, Request

__all__ = ["Final", "InferFunc", "Request", "batch"]
