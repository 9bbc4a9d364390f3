"""Declarations (what the user writes), validated, and the one Triton-JSON writer."""

from .ensemble import Step
from .model import (
    DynamicBatcher,
    InstanceGroup,
    ModelConfig,
    ModelWarmup,
    QueuePolicy,
    SequenceBatcher,
    TimeoutAction,
    VersionPolicy,
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
    "Step",
    "Tensor",
    "TimeoutAction",
    "VersionPolicy",
    "WarmupInput",
    "name_tensors",
]
