"""PyTriton's ``pytriton.model_config``: ``ModelConfig``, ``Tensor``, ``DynamicBatcher``,
``QueuePolicy``, ``TimeoutAction``, ``DeviceKind`` (and ``common.ModelWarmup``/``WarmupInput``)."""

from .common import DeviceKind, DynamicBatcher, ModelWarmup, QueuePolicy, TimeoutAction, WarmupInput
from .model_config import ModelConfig
from .tensor import Tensor

__all__ = [
    "DeviceKind",
    "DynamicBatcher",
    "ModelConfig",
    "ModelWarmup",
    "QueuePolicy",
    "Tensor",
    "TimeoutAction",
    "WarmupInput",
]
