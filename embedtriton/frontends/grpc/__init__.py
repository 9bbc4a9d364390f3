"""The KServe-v2 gRPC frontend: options (:mod:`.options`, importable without grpcio), the
endpoint and its transports (:mod:`.endpoint`, :mod:`.transport`), the service's method table
(:mod:`.service`), inference (:mod:`.infer`) and repository control (:mod:`.repository`). Needs
``pip install "embedtriton[grpc]"``."""

from .options import GrpcLimits, GrpcOptions

__all__ = ["GrpcLimits", "GrpcOptions"]
