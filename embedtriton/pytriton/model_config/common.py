"""The binding configuration's building blocks, with PyTriton's names, fields and defaults
(``pytriton.model_config.common``): plain mutable dataclasses, translated to embedtriton's own
(validated) classes when a model is bound."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from ...config import TimeoutAction  # the same two actions, REJECT and DELAY

__all__ = ["DeviceKind", "DynamicBatcher", "ModelWarmup", "QueuePolicy", "TimeoutAction", "WarmupInput"]


class DeviceKind(enum.Enum):
    """Where a model instance runs (Triton's instance-group kind)."""

    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


@dataclasses.dataclass
class QueuePolicy:
    """A dynamic-batcher queue's policy (Triton's ModelQueuePolicy)."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclasses.dataclass
class DynamicBatcher:
    """Triton's dynamic batcher settings."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: list | None = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: dict[int, QueuePolicy] | None = None


@dataclasses.dataclass
class WarmupInput:
    """Synthetic data for one input of a warm-up request: one of ``zero_data``, ``random_data``
    or ``input_data_file``."""

    dtype: Any
    shape: Sequence[int]
    zero_data: bool | None = False
    random_data: bool | None = False
    input_data_file: str | None = None


@dataclasses.dataclass
class ModelWarmup:
    """One warm-up stage: ``count`` requests of ``batch_size`` run before the model serves."""

    name: str
    batch_size: int
    inputs: dict[str, WarmupInput]
    count: int
