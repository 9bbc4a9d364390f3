"""embedtriton: NVIDIA Triton Inference Server inside your Python process.

Bind plain Python callables as Triton models and call them in-process::

    server = Server()
    server.bind("AddSub", add_sub, inputs=[...], outputs=[...], config=ModelConfig(max_batch_size=8))
    with server:
        out = server.model("AddSub").infer({"a": a, "b": b})
"""

from .backend import Final, Request, batch
from .config import (
    DynamicBatcher,
    InstanceGroup,
    ModelConfig,
    ModelWarmup,
    QueuePolicy,
    SequenceBatcher,
    ServerConfig,
    Step,
    Tensor,
    TimeoutAction,
    VersionPolicy,
    WarmupInput,
)
from .core import Model, RequestOptions
from .errors import (
    AlreadyExistsError,
    CancelledError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from .frontends.grpc import GrpcLimits, GrpcOptions
from .frontends.http.options import HttpOptions
from .server import Server
from .tracing import Tracing

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name == "DeviceArray":  # the native module's type, imported when first asked for
        from . import _native

        return _native.DeviceArray
    raise AttributeError(f"module 'embedtriton' has no attribute {name!r}")


__all__ = [
    "AlreadyExistsError",
    "CancelledError",
    "DeviceArray",
    "DynamicBatcher",
    "Final",
    "GrpcLimits",
    "GrpcOptions",
    "HttpOptions",
    "InstanceGroup",
    "InternalError",
    "InvalidArgumentError",
    "Model",
    "ModelConfig",
    "ModelWarmup",
    "NotFoundError",
    "QueuePolicy",
    "Request",
    "RequestOptions",
    "SequenceBatcher",
    "Server",
    "ServerConfig",
    "Step",
    "Tensor",
    "TimeoutAction",
    "Tracing",
    "TritonError",
    "UnavailableError",
    "UnknownError",
    "UnsupportedError",
    "VersionPolicy",
    "WarmupInput",
    "batch",
]
