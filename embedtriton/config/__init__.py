"""Declarations (what the user writes), validated, and the one Triton-JSON writer."""

from .model import (
    DynamicBatcher,
    InstanceGroup,
    ModelConfig,
    ModelWarmup,
    QueuePolicy,
    SequenceBatcher,
    TimeoutAction,
    WarmupInput,
)
from .server import ServerConfig
from .tensor import MAX_DIMS, Tensor, name_tensors

__all__ = [
    "MAX_DIMS",
    "DynamicBatcher",
    "InstanceGroup",
    "ModelConfig",
    "ModelWarmup",
    "QueuePolicy",
    "SequenceBatcher",
    "ServerConfig",
    "Tensor",
    "TimeoutAction",
    "WarmupInput",
    "name_tensors",
]
