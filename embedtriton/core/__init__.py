"""The core: server lifecycle (:mod:`.server`, :mod:`.lifecycle`), the models it binds and
loads (:mod:`.model_table`, written into :mod:`.generated_repository`) and those of the user's
model repositories (:mod:`.repositories`), :class:`Model` handles and the one request object
every caller submits (:mod:`.request`)."""

from .model import Model
from .request import InferRequest, RequestOptions
from .server import CoreServer, Endpoint

__all__ = ["CoreServer", "Endpoint", "InferRequest", "Model", "RequestOptions"]
