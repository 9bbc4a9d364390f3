"""The core: server lifecycle (:mod:`.server`, :mod:`.lifecycle`, :mod:`.repository`),
:class:`Model` handles and the one request object every caller submits (:mod:`.request`)."""

from .model import Model
from .request import InferRequest, RequestOptions
from .server import CoreServer, Endpoint

__all__ = ["CoreServer", "Endpoint", "InferRequest", "Model", "RequestOptions"]
